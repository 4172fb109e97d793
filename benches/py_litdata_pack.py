#!/usr/bin/env python3
"""Pack an ImageFolder tree with litdata's ``optimize()``, the way its ImageNet recipe does.

A peer baseline of ``benches/pack_vs_tar.py``: litdata (Lightning AI) turns a list of inputs
into its chunked format with ``optimize(fn, inputs, output_dir, num_workers, chunk_bytes)``.
As in its documented ImageNet example, ``fn`` returns each image's raw file bytes with its
class index (no decoding, no re-encoding: the same work as ``pack``'s passthrough), over 2
worker processes (the machine's cores), in chunks of 64 MB. The samples are listed in
torchvision's ``ImageFolder`` order. After ``optimize`` returns, every file it wrote and the
directory are fsynced, so the output is durable like ``pack``'s and ``tar -cf ... && sync``.

    ~/.cache/imgpack-peers-venv/bin/python benches/py_litdata_pack.py TREE OUT

OUT must not exist. Needs ``pip install litdata`` (benches/requirements-peers.txt).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_import_started = time.perf_counter()
from litdata import optimize  # noqa: E402  (imports torch: part of what a user pays)

IMPORT_SECONDS = time.perf_counter() - _import_started

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from py_wds_pack import fsync_dir, make_dataset  # noqa: E402


def read_sample(item: tuple[str, int]) -> dict:
    path, class_index = item
    with open(path, "rb") as f:
        return {"image": f.read(), "class": class_index}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()
    classes, samples = make_dataset(args.tree)
    optimize(fn=read_sample, inputs=samples, output_dir=args.out, num_workers=args.workers,
             chunk_bytes="64MB", mode="overwrite")
    fsync_dir(args.out)
    print(f"packed {len(samples)} samples in {len(classes)} classes into {args.out} "
          f"(import litdata: {IMPORT_SECONDS:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
