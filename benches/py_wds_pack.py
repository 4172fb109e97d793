#!/usr/bin/env python3
"""Pack an ImageFolder tree into WebDataset shards the way a typical user script does it.

This is the "plain Python" WebDataset baseline of ``benches/pack_vs_tar.py``: no threads, no
tricks, webdataset's own ``ShardWriter`` with its defaults. It walks the tree in the order
torchvision's ``ImageFolder`` uses (sorted class folders, ``sorted(os.walk(...))``, sorted file
names), and for sample ``i`` writes ``{"__key__": f"{i:08d}", "jpg": <the file's bytes>,
"cls": <class index>}`` (webdataset encodes the int as ASCII decimal), so each shard holds
``{i:08d}.jpg`` and ``{i:08d}.cls`` members, the same names ``pack --to webdataset`` writes.
``pack`` also writes a small ``{i:08d}.json`` per sample, a DALI ``.idx`` per shard, the
``wids`` ``shardindex.json`` (with an MD5 per shard) and its own index, which this script skips.

Shards are ``OUT/shard-000000.tar``, ``OUT/shard-000001.tar``, ... with ``maxsize=1e9`` (a new
shard starts once a shard has reached 10^9 bytes, so a shard can exceed that by one sample).
After ``close()`` every shard written is fsynced, then ``OUT`` itself, so the output is durable
when the script returns, like ``pack`` and ``tar -cf ... && sync FILE``.

    ~/.cache/imgpack-venv/bin/python benches/py_wds_pack.py TREE OUT

OUT must not exist (it is created as a directory).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_import_started = time.perf_counter()
import webdataset as wds  # noqa: E402  (imports torch: seconds, and part of what a user pays)

IMPORT_SECONDS = time.perf_counter() - _import_started

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


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsyncs every file directly in the directory `path`, then the directory itself (its new
    entries): what makes a finished output durable."""
    for name in os.listdir(path):
        fsync_path(os.path.join(path, name))
    fsync_path(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", help="ImageFolder root (root/<class>/<image>)")
    parser.add_argument("out", help="directory to create for the shards")
    parser.add_argument("--maxsize", type=float, default=1e9, metavar="BYTES",
                        help="ShardWriter maxsize: start a new shard once this many bytes are written [default: 1e9]")
    args = parser.parse_args()

    classes, samples = make_dataset(args.tree)
    if not samples:
        print(f"no images found under {args.tree}", file=sys.stderr)
        return 1

    os.mkdir(args.out)
    written: list[str] = []  # every shard, as ShardWriter finishes it
    nbytes = 0
    with wds.ShardWriter(os.path.join(args.out, "shard-%06d.tar"), maxsize=args.maxsize,
                         post=written.append) as sink:
        for i, (path, class_index) in enumerate(samples):
            with open(path, "rb") as f:
                data = f.read()
            nbytes += len(data)
            sink.write({"__key__": f"{i:08d}", "jpg": data, "cls": class_index})
    for shard in written:
        fsync_path(shard)
    fsync_path(args.out)  # the new directory entries
    print(f"packed {len(samples)} samples ({nbytes / 1e6:.1f} MB) in {len(classes)} classes "
          f"into {len(written)} shard(s) under {args.out} (import webdataset: {IMPORT_SECONDS:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
