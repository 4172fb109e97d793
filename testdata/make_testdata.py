#!/usr/bin/env python3
"""Regenerate imgpack's test fixtures from the public-domain / CC0 sample images that
scikit-image ships in ``skimage/data``.

Run from anywhere (paths are relative to this file):

    ~/.cache/imgpack-venv/bin/python testdata/make_testdata.py

It rewrites ``testdata/imagefolder/`` and ``testdata/bad/`` from scratch. The output is
deterministic: fixed crop boxes, fixed resampling filter, fixed encoder parameters, fixed
random seeds, no timestamps or EXIF. Byte-for-byte identity across machines additionally needs
the same encoder libraries (Pillow / libjpeg-turbo / zlib / libwebp); the fixtures were made with
the versions printed by ``--versions``. See ``testdata/README.md`` for what each file is.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import sys
from pathlib import Path

from PIL import Image, ImageDraw, features

import skimage

HERE = Path(__file__).resolve().parent
OUT_IF = HERE / "imagefolder"
OUT_BAD = HERE / "bad"
SKDATA = Path(skimage.__file__).resolve().parent / "data"

# Only images whose skimage docstring states public domain or CC0 are used (see README.md).
# moon, coins, page, motorcycle_*, ihc, ... are deliberately NOT used: their licence is
# unstated or only "no known copyright restrictions".
SOURCES = {
    "chelsea": "chelsea.png",  # CC0, Stefan van der Walt
    "astronaut": "astronaut.png",  # public domain, NASA
    "rocket": "rocket.jpg",  # public domain, SpaceX
    "hubble": "hubble_deep_field.jpg",  # public domain, NASA
    "coffee": "coffee.png",  # CC0, Rachel Michetti
    "clock": "clock_motion.png",  # public domain, Stefan van der Walt
    "camera": "camera.png",  # CC0, Lav Varshney
    "brick": "brick.png",  # CC0, CC0Textures
    "grass": "grass.png",  # CC0, CC0Textures
    "gravel": "gravel.png",  # CC0, CC0Textures
    "retina": "retina.jpg",  # CC0, Mikael Haggstrom (Wikimedia Commons)
}

JPEG = dict(format="JPEG", quality=85, optimize=False, progressive=False, subsampling=2)
JPEG_PROGRESSIVE = dict(JPEG, progressive=True)
PNG = dict(format="PNG", optimize=False, compress_level=9)
WEBP = dict(format="WEBP", quality=80, method=4, lossless=False, exact=False)
TIFF = dict(format="TIFF", compression=None)


def load(name: str) -> Image.Image:
    with Image.open(SKDATA / SOURCES[name]) as im:
        im.load()
        return im.copy()


def cut(name: str, box: tuple[int, int, int, int] | None, size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """Crop ``box`` (left, upper, right, lower; None = whole image) and resize to ``size``."""
    im = load(name)
    if box is not None:
        im = im.crop(box)
    im = im.resize(size, Image.Resampling.LANCZOS).convert(mode)
    im.info.clear()  # no comment / ICC profile / EXIF carried over from the source file
    return im


def encode(im: Image.Image, params: dict) -> bytes:
    buf = io.BytesIO()
    im.save(buf, **params)
    return buf.getvalue()


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def alpha_version(im: Image.Image) -> Image.Image:
    """RGBA copy with a soft elliptical alpha mask (opaque centre, transparent corners)."""
    mask = Image.new("L", im.size, 0)
    draw = ImageDraw.Draw(mask)
    w, h = im.size
    for i in range(0, 256, 32):
        inset = (255 - i) * min(w, h) // (2 * 255 * 2)
        draw.ellipse((inset, inset, w - 1 - inset, h - 1 - inset), fill=i)
    draw.ellipse((w // 4, h // 4, 3 * w // 4, 3 * h // 4), fill=255)
    rgba = im.convert("RGBA")
    rgba.putalpha(mask)
    return rgba


# (relative path, image factory, encoder params)
def imagefolder_files():
    return [
        # ---- cat: Chelsea the cat (CC0)
        ("cat/chelsea_01.jpg", lambda: cut("chelsea", None, (240, 160)), JPEG),
        ("cat/chelsea_02.jpg", lambda: cut("chelsea", (60, 20, 300, 260), (192, 192)), JPEG),
        ("cat/chelsea_03.jpg", lambda: cut("chelsea", (200, 100, 451, 300), (251, 200)), JPEG),
        ("cat/chelsea_04.png", lambda: cut("chelsea", (100, 60, 260, 220), (128, 128)), PNG),
        ("cat/chelsea_05.jpg",
         lambda: cut("chelsea", (0, 0, 300, 300), (200, 200)).transpose(Image.Transpose.FLIP_LEFT_RIGHT), JPEG),
        ("cat/png_named.JPEG", lambda: cut("chelsea", (120, 40, 280, 200), (120, 120)), PNG),
        ("cat/chelsea_small.ppm", lambda: cut("chelsea", None, (72, 48)), dict(format="PPM")),
        # ---- space: astronaut, rocket, Hubble deep field (public domain)
        ("space/astronaut_01.jpg", lambda: cut("astronaut", None, (256, 256)), JPEG),
        ("space/astronaut_02.jpg", lambda: cut("astronaut", (128, 0, 384, 256), (200, 200)), JPEG),
        ("space/rocket_01.jpg", lambda: cut("rocket", None, (300, 200)), JPEG),
        ("space/rocket_02.jpg", lambda: cut("rocket", (200, 0, 500, 427), (180, 256)), JPEG),
        ("space/hubble_01.jpg", lambda: cut("hubble", (0, 0, 500, 436), (240, 209)), JPEG),
        ("space/hubble_02.jpg", lambda: cut("hubble", (500, 436, 1000, 872), (240, 209)), JPEG_PROGRESSIVE),
        ("space/progressive.jpg", lambda: cut("astronaut", (0, 256, 512, 512), (320, 160)), JPEG_PROGRESSIVE),
        ("space/alpha.png", lambda: alpha_version(cut("astronaut", (150, 20, 350, 220), (128, 128))), PNG),
        ("space/hubble_small.webp", lambda: cut("hubble", (250, 200, 750, 636), (160, 140)), WEBP),
        # ---- still_life: coffee cup, clock, camera man (CC0 / public domain)
        ("still_life/coffee_01.jpg", lambda: cut("coffee", None, (300, 200)), JPEG),
        ("still_life/coffee_02.jpg", lambda: cut("coffee", (150, 0, 450, 300), (224, 224)), JPEG),
        ("still_life/coffee_03.png", lambda: cut("coffee", (300, 150, 600, 400), (144, 120)), PNG),
        ("still_life/clock_01.jpg", lambda: cut("clock", None, (240, 180)), JPEG),
        ("still_life/camera_01.jpg", lambda: cut("camera", (100, 0, 400, 300), (200, 200)), JPEG),
        ("still_life/gray.jpg", lambda: cut("camera", None, (192, 192), mode="L"), JPEG),
        ("still_life/cmyk.jpg", lambda: cut("coffee", (0, 100, 300, 400), (160, 160), mode="CMYK"), JPEG),
        # ---- texture: bricks, grass, gravel (CC0Textures, CC0), retina (CC0)
        ("texture/brick_01.jpg", lambda: cut("brick", None, (200, 200)), JPEG),
        ("texture/grass_01.jpg", lambda: cut("grass", (0, 0, 256, 256), (192, 192)), JPEG),
        ("texture/gravel_01.jpg", lambda: cut("gravel", (128, 128, 512, 512), (192, 192)), JPEG),
        ("texture/retina_01.jpg", lambda: cut("retina", None, (256, 256)), JPEG),
        ("texture/retina_02.png", lambda: cut("retina", (400, 400, 1000, 1000), (128, 128)), PNG),
        ("texture/brick_small.bmp", lambda: cut("brick", (256, 256, 512, 512), (64, 64)), dict(format="BMP")),
        ("texture/grass_small.tiff", lambda: cut("grass", (256, 0, 512, 256), (64, 64)), TIFF),
        ("texture/gravel_small.pgm", lambda: cut("gravel", None, (80, 80), mode="L"), dict(format="PPM")),
    ]


HTML_PAGE = b"""<!DOCTYPE html>
<html>
<head><title>404 Not Found</title></head>
<body>
<h1>Not Found</h1>
<p>The requested URL /images/n01440764_10026.JPEG was not found on this server.</p>
</body>
</html>
"""

# Leading bytes of every format a packer might recognise; garbage.jpg must start with none.
MAGICS = [b"\xff\xd8", b"\x89PNG", b"RIFF", b"BM", b"II*\x00", b"MM\x00*", b"GIF8", b"P1", b"P2", b"P3",
          b"P4", b"P5", b"P6", b"P7", b"<", b"\x00\x00\x00"]


def bad_files(real_jpeg: bytes):
    rng = random.Random(20240607)
    garbage = rng.randbytes(3000)
    assert not any(garbage.startswith(m) for m in MAGICS), "garbage seed hits a magic; pick another seed"
    return [
        ("zero_bytes.jpg", b""),
        ("truncated_header.jpg", real_jpeg[:20]),
        ("html.jpg", HTML_PAGE),
        ("garbage.jpg", garbage),
        ("truncated.jpg", real_jpeg[: len(real_jpeg) // 2]),
    ]


def versions() -> str:
    return (f"Pillow {Image.__version__}, libjpeg-turbo {features.version_feature('libjpeg_turbo')}, "
            f"zlib {features.version('zlib')}, libwebp {features.version('webp')}, "
            f"libtiff {features.version('libtiff')}, scikit-image {skimage.__version__}")


def main() -> int:
    if "--versions" in sys.argv:
        print(versions())
        return 0
    for d in (OUT_IF, OUT_BAD):
        if d.exists():
            shutil.rmtree(d)

    written: dict[str, bytes] = {}
    for rel, make, params in imagefolder_files():
        data = encode(make(), params)
        write(OUT_IF / rel, data)
        written[rel] = data

    # Sanity: every file in imagefolder/ must decode fully, in the format we meant.
    expect_fmt = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WEBP", "BMP": "BMP", "TIFF": "TIFF", "PPM": "PPM"}
    for rel, _, params in imagefolder_files():
        with Image.open(OUT_IF / rel) as im:
            im.load()
            assert im.format == expect_fmt[params["format"]], (rel, im.format)
    with Image.open(OUT_IF / "still_life/gray.jpg") as im:
        assert im.mode == "L"
    with Image.open(OUT_IF / "still_life/cmyk.jpg") as im:
        assert im.mode == "CMYK"
    with Image.open(OUT_IF / "space/alpha.png") as im:
        assert im.mode == "RGBA"
    with Image.open(OUT_IF / "space/progressive.jpg") as im:
        assert im.info.get("progressive") or im.info.get("progression")
    assert written["cat/png_named.JPEG"].startswith(b"\x89PNG\r\n\x1a\n")
    assert written["texture/gravel_small.pgm"].startswith(b"P5")
    assert written["cat/chelsea_small.ppm"].startswith(b"P6")

    for name, data in bad_files(written["cat/chelsea_01.jpg"]):
        write(OUT_BAD / name, data)

    total = 0
    for p in sorted(HERE.rglob("*")):
        if p.is_file() and (OUT_IF in p.parents or OUT_BAD in p.parents):
            data = p.read_bytes()
            total += len(data)
            print(f"{hashlib.sha256(data).hexdigest()[:16]}  {len(data):7d}  {p.relative_to(HERE).as_posix()}")
    print(f"total {total} bytes; {versions()}")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
