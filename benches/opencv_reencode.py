"""What a typical user writes to re-encode a dataset with OpenCV: a process pool that decodes,
resizes (INTER_AREA, shorter side to N as torchvision's Resize(N)) and re-encodes JPEG, with the
parent writing the results into LMDB (py-lmdb) under the same keys as `pack`.

Usage: opencv_reencode.py TREE OUT.lmdb [--workers 2] [--size 256] [--quality 90]
"""

import argparse
import multiprocessing as mp
import os
import sys

import cv2
import numpy
import lmdb

EXTS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SIZE = 256
QUALITY = 90


def listing(root):
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for i, c in enumerate(classes):
        for r, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(EXTS):
                    samples.append((os.path.join(r, f), i))
    return samples


def work(path):
    cv2.setNumThreads(1)
    with open(path, "rb") as f:
        data = f.read()
    img = cv2.imdecode(numpy.frombuffer(data, numpy.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    short, long = min(w, h), max(w, h)
    if short > SIZE:
        new_long = SIZE * long // short
        size = (SIZE, new_long) if w <= h else (new_long, SIZE)
        img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    ok, out = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, QUALITY])
    return out.tobytes()


def init(size, quality):
    global SIZE, QUALITY
    SIZE, QUALITY = size, quality
    cv2.setNumThreads(1)


def pack_with_pool(tree, out, workers, work, init, initargs, ext):
    """Lists `tree`, runs `work` on every file in a pool of `workers` processes (each set up with
    `init(*initargs)`), and writes the results into LMDB at `out` in listing order, as `pack`
    keys them (`KEY.ext`, `KEY.cls`). The OpenCV decode script drives its pool with it too."""
    samples = listing(tree)
    env = lmdb.open(out, map_size=1 << 36)
    txn = env.begin(write=True)
    with mp.Pool(workers, initializer=init, initargs=initargs) as pool:
        for i, (data, (_, label)) in enumerate(zip(pool.imap(work, [s[0] for s in samples], chunksize=16), samples)):
            txn.put(b"%08d.%s" % (i, ext), data)
            txn.put(b"%08d.cls" % i, str(label).encode())
            if i % 1000 == 999:
                txn.commit()
                txn = env.begin(write=True)
    txn.commit()
    env.sync()
    env.close()
    print(len(samples))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tree")
    p.add_argument("out")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--quality", type=int, default=90)
    a = p.parse_args()
    pack_with_pool(a.tree, a.out, a.workers, work, init, (a.size, a.quality), b"jpg")


if __name__ == "__main__":
    sys.exit(main())
