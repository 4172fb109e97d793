"""What a typical user writes to pre-decode a dataset with OpenCV: a process pool that decodes,
resizes (INTER_AREA, shorter side to N as torchvision's Resize(N)), centre-crops to C x C (as
torchvision's CenterCrop(C)) and saves the uint8 RGB array with np.save, the parent writing
the results into LMDB (py-lmdb) as `pack --mode decode` stores them (`.npy` and `.cls`).

Usage: opencv_decode.py TREE OUT.lmdb [--workers 2] [--size 256] [--crop 224]
"""

import argparse
import io
import sys

import cv2
import numpy

from opencv_reencode import pack_with_pool

SIZE = 256
CROP = 224


def work(path):
    with open(path, "rb") as f:
        data = f.read()
    # Straight to RGB (libjpeg-turbo converts while decoding): the channel order pack stores,
    # at no extra cost to OpenCV.
    img = cv2.imdecode(numpy.frombuffer(data, numpy.uint8), cv2.IMREAD_COLOR_RGB)
    h, w = img.shape[:2]
    short, long = min(w, h), max(w, h)
    if short > SIZE:
        new_long = SIZE * long // short
        size = (SIZE, new_long) if w <= h else (new_long, SIZE)
        img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
        h, w = img.shape[:2]
    if h >= CROP and w >= CROP:
        top, left = int(round((h - CROP) / 2.0)), int(round((w - CROP) / 2.0))
        img = img[top:top + CROP, left:left + CROP]
    buf = io.BytesIO()
    numpy.save(buf, numpy.ascontiguousarray(img))
    return buf.getvalue()


def init(size, crop):
    global SIZE, CROP
    SIZE, CROP = size, crop
    cv2.setNumThreads(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tree")
    p.add_argument("out")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--crop", type=int, default=224)
    a = p.parse_args()
    pack_with_pool(a.tree, a.out, a.workers, work, init, (a.size, a.crop), b"npy")


if __name__ == "__main__":
    sys.exit(main())
