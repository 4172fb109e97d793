#!/usr/bin/env python3
"""Pack an ImageFolder tree into LMDB the way a typical user script does it.

This is the "plain Python" baseline of ``benches/pack_vs_tar.py``: no threads, no tricks,
py-lmdb with its default (durable) settings. It walks the tree in the order torchvision's
``ImageFolder`` uses (sorted class folders, ``sorted(os.walk(...))``, sorted file names), and
for sample ``i`` stores the file's bytes unchanged under ``{i:08}.jpg`` and the class index as
ASCII decimal under ``{i:08}.cls`` (the same key layout ``pack --to lmdb`` writes; ``pack`` also
stores a small ``{i:08}.json`` and a ``__meta__`` record, which this script skips). It commits
every ``--commit-every`` samples and calls ``env.sync()`` at the end.

    ~/.cache/imgpack-venv/bin/python benches/py_lmdb_pack.py TREE OUT.lmdb

OUT.lmdb must not exist (it is created as an LMDB environment directory).
"""

from __future__ import annotations

import argparse
import os
import sys

import lmdb

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def make_dataset(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, samples) exactly as torchvision's ImageFolder / make_dataset builds them."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for class_index, class_name in enumerate(classes):
        class_dir = os.path.join(root, class_name)
        for dirpath, _, fnames in sorted(os.walk(class_dir, followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), class_index))
    return classes, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", help="ImageFolder root (root/<class>/<image>)")
    parser.add_argument("out", help="LMDB environment directory to create")
    parser.add_argument("--commit-every", type=int, default=1000, metavar="N")
    parser.add_argument("--map-size", type=int, default=1 << 40, metavar="BYTES",
                        help="LMDB map size (address space, not disk) [default: 1 TiB]")
    args = parser.parse_args()

    classes, samples = make_dataset(args.tree)
    if not samples:
        print(f"no images found under {args.tree}", file=sys.stderr)
        return 1

    env = lmdb.open(args.out, map_size=args.map_size, subdir=True)
    txn = env.begin(write=True)
    nbytes = 0
    for i, (path, class_index) in enumerate(samples):
        with open(path, "rb") as f:
            data = f.read()
        nbytes += len(data)
        txn.put(f"{i:08}.jpg".encode(), data)
        txn.put(f"{i:08}.cls".encode(), str(class_index).encode())
        if (i + 1) % args.commit_every == 0:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    env.sync()
    env.close()
    print(f"packed {len(samples)} samples ({nbytes / 1e6:.1f} MB) in {len(classes)} classes to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
