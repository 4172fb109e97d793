"""The ``pack`` command: the Rust command line, run from the extension module."""

import sys

from . import _imgpack


def main() -> None:
    """Runs ``pack`` with this process's arguments and exits with its exit code."""
    sys.exit(_imgpack.pack_main(list(sys.argv)))


if __name__ == "__main__":
    main()
