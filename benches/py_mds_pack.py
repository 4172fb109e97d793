#!/usr/bin/env python3
"""Pack an ImageFolder tree with MosaicML streaming's ``MDSWriter``, the plain way.

A peer baseline of ``benches/pack_vs_tar.py``: ``MDSWriter(out, columns={"image": "bytes",
"class": "int"})``, one ``write`` per sample with the image file's raw bytes (no decoding or
re-encoding, like ``pack``'s passthrough), in torchvision's ``ImageFolder`` order, the writer's
default shard size and no compression, in one process (the writer has no parallel mode). Every
file it wrote and the directory are fsynced at the end, so the output is durable like
``pack``'s.

    ~/.cache/imgpack-peers-venv/bin/python benches/py_mds_pack.py TREE OUT

OUT must not exist. Needs ``pip install mosaicml-streaming`` (benches/requirements-peers.txt).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_import_started = time.perf_counter()
from streaming import MDSWriter  # noqa: E402

IMPORT_SECONDS = time.perf_counter() - _import_started

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from py_wds_pack import fsync_dir, make_dataset  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree")
    parser.add_argument("out")
    args = parser.parse_args()
    classes, samples = make_dataset(args.tree)
    with MDSWriter(out=args.out, columns={"image": "bytes", "class": "int"}) as writer:
        for path, class_index in samples:
            with open(path, "rb") as f:
                writer.write({"image": f.read(), "class": class_index})
    fsync_dir(args.out)
    print(f"packed {len(samples)} samples in {len(classes)} classes into {args.out} "
          f"(import streaming: {IMPORT_SECONDS:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
