"""`pack imagefolder ... --mode decode|reencode` checked against what torchvision's default loader
sees, `PIL.Image.open(f).convert("RGB")`, and against torchvision's transforms:

1. decode: the stored .npy pixels equal Pillow's, exactly, for every testdata format plus
   generated PNGs (16-bit RGB/grey/RGBA, palette + tRNS, 1-bit, grey + alpha, Adam7) and
   netpbm files with a maxval other than 255;
2. `--color keep`: greyscale kept as one channel;
3. the `npy` field read by `webdataset`'s default decoders, `npy.zst` by `zstandard` + NumPy;
4. reencode: baseline JPEGs at torchvision's `Resize(N)` size, close to torchvision's pixels;
   `--keep-if-fits` stores fitting JPEGs byte for byte;
   plus `--center-crop` against torchvision's `CenterCrop`;
5. EXIF orientation: ignored by default, applied by `--exif-rotate` as `ImageOps.exif_transpose`;
6. a real decompression bomb skipped before decoding (`--max-pixels`);
7. a truncated JPEG skipped in every mode (passthrough walks its markers to the end).

Run: ~/.cache/imgpack-venv/bin/python -m pytest tests/interop -q
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import tarfile
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps, JpegImagePlugin
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

import interop_util
from interop_util import BAD, check_webdataset_checksums, copy_into, read_lmdb, sniff_ext

# --------------------------------------------------------------------------- running pack


def run(pack_bin: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [str(pack_bin), *(os.fspath(a) for a in args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=timeout)
    # Shown by pytest only when the test fails.
    print(f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def pack_json(pack_bin: Path, *args, rc: int = 0) -> dict:
    """Run `pack *args --json`, check the exit code and return the summary object."""
    proc = run(pack_bin, *args, "--json")
    assert proc.returncode == rc, (
        f"pack {' '.join(map(str, args))} exited {proc.returncode}, expected {rc}\nstderr:\n{proc.stderr}"
    )
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"--json stdout is not one JSON object ({e}):\n{proc.stdout!r}")
    assert summary.get("type") == "summary", summary
    assert summary["found"] == summary["packed"] + len(summary["skipped"]), summary
    return summary


def skipped_names(summary: dict) -> dict[str, str]:
    """File name -> reason of every skipped file."""
    return {Path(e["path"]).name: e["reason"] for e in summary["skipped"]}


# --------------------------------------------------------------------------- pixels


def load_npy(data: bytes) -> np.ndarray:
    """An .npy field, checked to be exactly what pack promises: format v1.0, uint8, C order,
    shape (H, W, C), no trailing bytes."""
    from numpy.lib import format as npformat

    f = io.BytesIO(data)
    assert npformat.read_magic(f) == (1, 0), f"npy version {data[6:8]!r}, expected 1.0"
    shape, fortran_order, dtype = npformat.read_array_header_1_0(f)
    assert dtype == np.dtype(np.uint8), f"npy dtype {dtype}, expected uint8"
    assert not fortran_order, "npy array is in Fortran order, expected C order"
    assert len(shape) == 3 and shape[2] in (1, 3), f"npy shape {shape}, expected (H, W, 1|3)"
    assert len(data) == f.tell() + int(np.prod(shape)), "npy payload length does not match its shape"
    arr = np.load(io.BytesIO(data))
    assert arr.dtype == np.uint8 and arr.flags.c_contiguous
    return arr


def load_npy_zst(data: bytes) -> np.ndarray:
    """An .npy.zst field, read with the two documented lines; the zstd frame records its
    content size (so `decompress()` needs no max_output_size)."""
    import zstandard

    params = zstandard.get_frame_parameters(data)
    assert params.content_size != zstandard.CONTENTSIZE_UNKNOWN, "the zstd frame does not record its content size"
    raw = zstandard.ZstdDecompressor().decompress(data)
    assert params.content_size == len(raw)
    arr = np.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(data)))
    load_npy(raw)  # same layout checks as an uncompressed field
    return arr


def pil_open(path: Path) -> Image.Image:
    im = Image.open(path)
    im.load()
    return im


def pil_rgb(path: Path) -> np.ndarray:
    """What torchvision's default loader (`pil_loader`) gives, as an array."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Palette images with Transparency expressed in bytes ..."
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def diff_report(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"shape {got.shape} (pack) != {want.shape} (PIL)"
    d = np.abs(got.astype(np.int64) - want.astype(np.int64))
    bad = np.argwhere(d > 0)
    where = ", ".join(
        f"[{y},{x},{c}] pack {got[y, x, c]} PIL {want[y, x, c]}" for y, x, c in bad[:5]
    )
    return f"{len(bad)} of {d.size} values differ, max abs diff {d.max()}, PSNR {psnr(got, want):.2f} dB; e.g. {where}"


def assert_same_pixels(got: np.ndarray, want: np.ndarray, what: str):
    assert got.dtype == want.dtype == np.uint8, f"{what}: dtypes {got.dtype}, {want.dtype}"
    assert got.shape == want.shape and np.array_equal(got, want), f"{what}: {diff_report(got, want)}"


# --------------------------------------------------------------------------- generated images


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def png_bytes(arr: np.ndarray, color_type: int, bit_depth: int, interlace: bool = False) -> bytes:
    """A minimal PNG encoder for 8- and 16-bit samples (Pillow cannot write 16-bit RGB(A) or
    Adam7): `arr` is (H, W) or (H, W, C) with the channels of `color_type`, every row filter 0."""
    assert bit_depth in (8, 16)
    arr = np.asarray(arr)
    h, w = arr.shape[:2]
    dtype = ">u2" if bit_depth == 16 else np.uint8

    def scanlines(a: np.ndarray) -> bytes:
        rows = a.astype(dtype).reshape(a.shape[0], -1).view(np.uint8)
        return b"".join(b"\x00" + row.tobytes() for row in rows)

    if interlace:
        data = b"".join(
            scanlines(arr[y0::dy, x0::dx]) for x0, y0, dx, dy in ADAM7 if arr[y0::dy, x0::dx].size
        )
    else:
        data = scanlines(arr)
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(data, 9)) + _chunk(b"IEND", b"")


def bomb_png(w: int, h: int) -> bytes:
    """An all-black 1-bit greyscale PNG of w x h pixels, compressed row block by row block so
    neither the raw image nor a Pillow image of it is ever held in memory."""
    row = b"\x00" + bytes((w + 7) // 8)
    c = zlib.compressobj(9)
    block = row * 1000
    idat = b"".join([c.compress(block) for _ in range(h // 1000)] + [c.compress(row * (h % 1000)), c.flush()])
    ihdr = struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def smooth_rgb(h: int, w: int) -> np.ndarray:
    """Smooth colour content (JPEG-friendly) with a marked top-left corner."""
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) * 3 % 256], -1).astype(np.uint8)
    arr[: max(h // 8, 1), : max(w // 8, 1)] = (255, 0, 0)
    return arr


def write_extra_pngs(folder: Path) -> list[str]:
    """PNG variants testdata does not have. Returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240607)
    h, w = 37, 53
    files: dict[str, bytes] = {}

    files["rgb16.png"] = png_bytes(rng.integers(0, 65536, (h, w, 3), dtype=np.uint16), 2, 16)
    # 16-bit grey: Pillow opens it as mode I;16 and convert("RGB") clips at 255 (it does not
    # scale), so half the rows hold small values, and the first row the edge cases.
    g16 = rng.integers(0, 65536, (h, w), dtype=np.uint16)
    g16[: h // 2] = rng.integers(0, 300, (h // 2, w), dtype=np.uint16)
    g16[0, :10] = [0, 1, 127, 128, 254, 255, 256, 257, 32768, 65535]
    files["gray16.png"] = png_bytes(g16, 0, 16)
    files["rgba16.png"] = png_bytes(rng.integers(0, 65536, (h, w, 4), dtype=np.uint16), 6, 16)
    files["interlaced_rgb.png"] = png_bytes(smooth_rgb(h, w), 2, 8, interlace=True)
    files["interlaced_gray16.png"] = png_bytes(rng.integers(0, 300, (h, w), dtype=np.uint16), 0, 16, interlace=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)

    # With Pillow.
    pal = Image.fromarray(rng.integers(0, 16, (h, w), dtype=np.uint8)).convert("P")
    pal.putpalette([v for i in range(16) for v in (i * 16, 255 - i * 16, i * 97 % 256)])
    pal.save(folder / "palette_trns.png", transparency=bytes([0, 128, 255] + [200] * 13))
    bits = (rng.integers(0, 2, (h, w)) * 255).astype(np.uint8)
    Image.fromarray(bits).convert("1").save(folder / "bit1.png")
    Image.fromarray(rng.integers(0, 256, (h, w, 2), dtype=np.uint8)).save(folder / "gray_alpha.png")
    grey = rng.integers(0, 256, (h, w), dtype=np.uint8)
    Image.fromarray(grey).save(folder / "gray_trns.png", transparency=7)
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(folder / "rgb_trns.png", transparency=(1, 2, 3))

    # Sanity of the fixtures: what Pillow makes of them.
    modes = {p.name: Image.open(p).mode for p in folder.iterdir()}
    assert modes == {
        "rgb16.png": "RGB",
        "gray16.png": "I;16",
        "rgba16.png": "RGBA",
        "interlaced_rgb.png": "RGB",
        "interlaced_gray16.png": "I;16",
        "palette_trns.png": "P",
        "bit1.png": "1",
        "gray_alpha.png": "LA",
        "gray_trns.png": "L",
        "rgb_trns.png": "RGB",
    }, modes
    assert Image.open(folder / "bit1.png").info.get("transparency") is None
    assert Image.open(folder / "palette_trns.png").info.get("transparency") is not None
    return sorted(modes)


EXTRA = "extra"  # class folder of the generated PNGs
EXTRA_PNGS = [
    "bit1.png",
    "gray16.png",
    "gray_alpha.png",
    "gray_trns.png",
    "interlaced_gray16.png",
    "interlaced_rgb.png",
    "palette_trns.png",
    "rgb16.png",
    "rgb_trns.png",
    "rgba16.png",
]


# --------------------------------------------------------------------------- 1) decode: pixel fidelity


@pytest.fixture(scope="module")
def fidelity_tree(tmp_path_factory) -> Path:
    root = copy_into(tmp_path_factory.mktemp("fidelity") / "src", {f: f for f in interop_util.testdata_images()})
    assert write_extra_pngs(root / EXTRA) == EXTRA_PNGS
    return root


@pytest.fixture(scope="module")
def decoded(fidelity_tree, pack_bin) -> dict[str, interop_util.Sample]:
    """The fidelity tree packed with `--mode decode` and no resize: relative path -> sample."""
    out = fidelity_tree.parent / "decoded.lmdb"
    summary = pack_json(pack_bin, "imagefolder", fidelity_tree, "--to", "lmdb", "-o", out, "--mode", "decode")
    packed = read_lmdb(out)
    assert packed.meta["fields"] == ["cls", "json", "npy"], packed.meta["fields"]
    assert packed.meta["options"]["mode"] == "decode"
    assert summary["packed"] == packed.meta["samples"] == len(interop_util.testdata_images()) + len(EXTRA_PNGS)
    return {s.info["path"]: s for s in packed.samples}


FIDELITY_FILES = interop_util.testdata_images() + [f"{EXTRA}/{n}" for n in EXTRA_PNGS]


def test_fidelity_tree_covers_every_format(fidelity_tree):
    """The parametrized fidelity test below sees every kind of source the brief names."""
    kinds = set()
    for rel in FIDELITY_FILES:
        with Image.open(fidelity_tree / rel) as im:
            kind = (im.format, im.mode)
            if im.format == "JPEG":
                kind += ("progressive" if im.info.get("progressive") else "baseline",)
            kinds.add(kind)
    want = {
        ("JPEG", "RGB", "baseline"),
        ("JPEG", "RGB", "progressive"),
        ("JPEG", "L", "baseline"),
        ("JPEG", "CMYK", "baseline"),
        ("PNG", "RGB"),
        ("PNG", "RGBA"),
        ("PNG", "P"),
        ("PNG", "1"),
        ("PNG", "LA"),
        ("PNG", "L"),
        ("PNG", "I;16"),
        ("WEBP", "RGB"),
        ("BMP", "RGB"),
        ("TIFF", "RGB"),
        ("PPM", "RGB"),
        ("PPM", "L"),  # Pillow calls PGM "PPM" too
    }
    assert want <= kinds, f"missing source kinds: {sorted(want - kinds)}"
    assert sniff_ext((fidelity_tree / "cat/png_named.JPEG").read_bytes()) == "png"


@pytest.mark.parametrize("rel", FIDELITY_FILES)
def test_decode_pixels_equal_pil(rel, fidelity_tree, decoded):
    """`--mode decode`, no resize: the stored .npy is `np.asarray(Image.open(f).convert("RGB"))`,
    exactly. Lossy WebP may differ by decoder rounding: PSNR >= 40 dB (it is exact today)."""
    sample = decoded.get(rel)
    assert sample is not None, f"{rel} was not packed"
    assert sample.image_ext == "npy"
    got = load_npy(sample.image)
    want = pil_rgb(fidelity_tree / rel)
    src = (fidelity_tree / rel).read_bytes()
    if sniff_ext(src) == "webp" and src[12:16] == b"VP8 ":  # lossy
        assert got.shape == want.shape, diff_report(got, want)
        d = np.abs(got.astype(int) - want.astype(int)).max()
        value = psnr(got, want)
        print(f"{rel}: lossy WebP, max abs diff {d}, PSNR {value:.2f} dB")
        assert value >= 40, f"{rel}: {diff_report(got, want)}"
    else:
        assert_same_pixels(got, want, rel)


# Netpbm files whose maxval is not 255: Pillow rescales with `round(v / maxval * 255)` (float,
# ties to even), or for 16-bit greyscale to mode I (0..65535) which convert("RGB") then clips.
NETPBM_CASES = [
    # (name, maxval, channels, plain)
    ("m1.pgm", 1, 1, False),
    ("m15.ppm", 15, 3, False),
    ("m254.pgm", 254, 1, False),
    ("m1000.pgm", 1000, 1, False),
    ("m65535.pgm", 65535, 1, False),
    ("m100.ppm", 100, 3, False),
    ("m100.pgm", 100, 1, False),
    ("m4095.ppm", 4095, 3, False),
    ("m65535.ppm", 65535, 3, False),
    ("m1000_plain.ppm", 1000, 3, True),
]


def netpbm_bytes(maxval: int, channels: int, plain: bool) -> bytes:
    h, w = 16, 64
    values = (np.arange(h * w * channels) % (maxval + 1)).reshape(h, w, channels)
    magic = {(1, False): b"P5", (3, False): b"P6", (1, True): b"P2", (3, True): b"P3"}[(channels, plain)]
    header = magic + b"\n%d %d\n%d\n" % (w, h, maxval)
    if plain:
        return header + b" ".join(str(int(v)).encode() for v in values.ravel()) + b"\n"
    return header + values.astype(">u2" if maxval > 255 else np.uint8).tobytes()


@pytest.fixture(scope="module")
def netpbm(tmp_path_factory, pack_bin) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("netpbm")
    root = base / "src"
    (root / "a").mkdir(parents=True)
    for name, maxval, channels, plain in NETPBM_CASES:
        (root / "a" / name).write_bytes(netpbm_bytes(maxval, channels, plain))
    pack_json(pack_bin, "imagefolder", root, "--to", "lmdb", "-o", base / "out", "--mode", "decode")
    return root, {s.info["path"]: s for s in read_lmdb(base / "out").samples}


@pytest.mark.parametrize("name", [c[0] for c in NETPBM_CASES])
def test_decode_netpbm_maxval_equals_pil(name, netpbm):
    root, samples = netpbm
    assert_same_pixels(load_npy(samples[f"a/{name}"].image), pil_rgb(root / "a" / name), name)


# --------------------------------------------------------------------------- 2) --color keep

GREY_MODES = {"1", "L", "LA", "I", "I;16"}


def test_color_keep(fidelity_tree, pack_bin):
    """`--color keep`: a greyscale source gives (H, W, 1) equal to Pillow's greyscale pixels
    (gray.jpg: mode L, `np.asarray(Image.open(f))[..., None]`); everything else 3 channels
    equal to convert("RGB")."""
    out = fidelity_tree.parent / "keep.lmdb"
    pack_json(pack_bin, "imagefolder", fidelity_tree, "--to", "lmdb", "-o", out, "--mode", "decode", "--color", "keep")
    packed = read_lmdb(out)
    assert packed.meta["options"]["color"] == "keep"
    samples = {s.info["path"]: s for s in packed.samples}

    with Image.open(fidelity_tree / "still_life/gray.jpg") as im:
        assert im.mode == "L"
        want = np.asarray(im)[..., None]
    got = load_npy(samples["still_life/gray.jpg"].image)
    assert got.shape == (*want.shape[:2], 1), got.shape
    assert_same_pixels(got, want, "still_life/gray.jpg --color keep")

    greys = 0
    for rel in FIDELITY_FILES:
        got = load_npy(samples[rel].image)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(fidelity_tree / rel) as im:
                if im.mode in GREY_MODES:
                    greys += 1
                    want = np.asarray(im.convert("L"))[..., None]
                else:
                    want = np.asarray(im.convert("RGB"))
        assert_same_pixels(got, want, f"{rel} (PIL mode {Image.open(fidelity_tree / rel).mode}) --color keep")
    assert greys >= 5  # gray.jpg, gravel_small.pgm, bit1, gray16, gray_alpha, ...


# --------------------------------------------------------------------------- 3) webdataset and zstd


def test_webdataset_decodes_npy(fidelity_tree, pack_bin):
    """webdataset's default decoders turn the `npy` field into the array Pillow gives."""
    import webdataset as wds

    out = fidelity_tree.parent / "wds-npy"
    summary = pack_json(
        pack_bin, "imagefolder", fidelity_tree, "--to", "webdataset", "-o", out, "--mode", "decode",
        "--shard-samples", "8",
    )
    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    assert len(urls) >= 4
    meta = json.loads((out / "imgpack.json").read_text())
    assert meta["fields"] == ["cls", "json", "npy"]
    check_webdataset_checksums(out)
    # Tar members are named {key}.npy.
    with tarfile.open(urls[0]) as tar:
        assert [m.name for m in tar.getmembers()[:3]] == ["00000000.cls", "00000000.json", "00000000.npy"]

    n = 0
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=True).decode():
        assert sorted(k for k in sample if not k.startswith("__")) == ["cls", "json", "npy"]
        arr = sample["npy"]
        assert isinstance(arr, np.ndarray), f"webdataset decoded npy to {type(arr).__name__}"
        rel = sample["json"]["path"]
        assert_same_pixels(arr, pil_rgb(fidelity_tree / rel), f"{rel} via webdataset")
        n += 1
    assert n == summary["packed"] == len(FIDELITY_FILES)


def test_webdataset_npy_zst(fidelity_tree, pack_bin):
    """`--compress zstd`: field `npy.zst`, which
    `numpy.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(data)))` reads."""
    import webdataset as wds

    out = fidelity_tree.parent / "wds-zst"
    pack_json(
        pack_bin, "imagefolder", fidelity_tree, "--to", "webdataset", "-o", out, "--mode", "decode",
        "--compress", "zstd", "--shard-samples", "16",
    )
    meta = json.loads((out / "imgpack.json").read_text())
    assert meta["fields"] == ["cls", "json", "npy.zst"]
    check_webdataset_checksums(out)
    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    n = 0
    total_raw = total_zst = 0
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=True).decode():
        assert sorted(k for k in sample if not k.startswith("__")) == ["cls", "json", "npy.zst"]
        data = sample["npy.zst"]
        assert isinstance(data, bytes), type(data)
        rel = sample["json"]["path"]
        want = pil_rgb(fidelity_tree / rel)
        assert_same_pixels(load_npy_zst(data), want, f"{rel} (npy.zst via webdataset)")
        total_raw += want.size
        total_zst += len(data)
        n += 1
    assert n == len(FIDELITY_FILES)
    assert total_zst < total_raw, "zstd did not make the pixels smaller"


def test_lmdb_npy_zst_level(fidelity_tree, pack_bin):
    out = fidelity_tree.parent / "zst.lmdb"
    pack_json(
        pack_bin, "imagefolder", fidelity_tree, "--to", "lmdb", "-o", out, "--mode", "decode", "--compress", "zstd:9"
    )
    packed = read_lmdb(out)
    assert packed.meta["fields"] == ["cls", "json", "npy.zst"]
    assert packed.meta["options"]["compress"] == "zstd:9"
    for s in packed.samples:
        assert s.image_ext == "npy.zst"
        assert_same_pixels(load_npy_zst(s.image), pil_rgb(fidelity_tree / s.info["path"]), s.info["path"])


# --------------------------------------------------------------------------- 4) reencode


@pytest.fixture(scope="module")
def reencode_tree(tmp_path_factory) -> Path:
    """testdata plus two images smaller than 64 px, which must never be upscaled."""
    root = copy_into(tmp_path_factory.mktemp("reencode") / "src", {f: f for f in interop_util.testdata_images()})
    Image.fromarray(smooth_rgb(30, 40)).save(root / "cat" / "tiny_40x30.png")
    Image.fromarray(smooth_rgb(30, 40)).save(root / "cat" / "tiny_40x30.jpg", quality=90)
    return root


def jpeg_sof(data: bytes) -> int:
    """The frame marker of a JPEG (0xC0 baseline, 0xC1 extended, 0xC2 progressive, ...)."""
    assert data[:2] == b"\xff\xd8"
    i = 2
    while i + 4 <= len(data):
        assert data[i] == 0xFF, f"no marker at offset {i}"
        while data[i] == 0xFF:
            i += 1
        marker = data[i]
        i += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return marker
        i += int.from_bytes(data[i : i + 2], "big")
    raise AssertionError("no SOF marker before the end of the JPEG")


def is_jpeg_source(path: Path) -> bool:
    return sniff_ext(path.read_bytes()) == "jpg"


def is_cmyk(path: Path) -> bool:
    with Image.open(path) as im:
        return im.mode == "CMYK"


def test_reencode_resize_shorter(reencode_tree, pack_bin):
    """`--mode reencode --resize-shorter 64 --quality 90`: baseline RGB JPEGs, 4:2:0, the
    quantization tables of quality 90, at the size of torchvision's `Resize(64)` (never
    upscaled), close to torchvision's Lanczos resize of the PIL-loaded source."""
    out = reencode_tree.parent / "re64.lmdb"
    summary = pack_json(
        pack_bin, "imagefolder", reencode_tree, "--to", "lmdb", "-o", out,
        "--mode", "reencode", "--resize-shorter", "64", "--quality", "90",
    )
    packed = read_lmdb(out)
    assert packed.meta["fields"] == ["cls", "jpg", "json"], packed.meta["fields"]
    assert summary["kept_unchanged"] == 0
    assert summary["packed"] == len(interop_util.testdata_images()) + 2

    q90 = io.BytesIO()
    Image.new("RGB", (16, 16)).save(q90, "JPEG", quality=90)
    q90_tables = Image.open(q90).quantization

    resize = {
        "bicubic": T.Resize(64, interpolation=InterpolationMode.BICUBIC, antialias=True),
        "lanczos": T.Resize(64, interpolation=InterpolationMode.LANCZOS, antialias=True),
    }
    report = []
    for s in packed.samples:
        rel = s.info["path"]
        assert s.image_ext == "jpg"
        assert jpeg_sof(s.image) == 0xC0, f"{rel}: SOF {jpeg_sof(s.image):#x}, not a baseline JPEG"
        im = Image.open(io.BytesIO(s.image))
        assert im.format == "JPEG" and im.mode == "RGB", (rel, im.format, im.mode)
        assert JpegImagePlugin.get_sampling(im) == 2, f"{rel}: chroma subsampling is not 4:2:0"
        assert im.quantization == q90_tables, f"{rel}: quantization tables are not those of quality 90"
        got = np.asarray(im.convert("RGB"))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            src = Image.open(reencode_tree / rel).convert("RGB")
        if min(src.size) <= 64:  # no upscaling
            assert im.size == src.size, f"{rel}: {src.size} became {im.size} (upscaled?)"
            refs = {"source": np.asarray(src)}
        else:
            want_size = T.Resize(64)(src).size
            assert im.size == want_size, f"{rel}: size {im.size}, torchvision Resize(64) gives {want_size}"
            refs = {name: np.asarray(tf(src)) for name, tf in resize.items()}
        values = {name: psnr(got, ref) for name, ref in refs.items()}
        report.append(f"{rel:28} {src.size} -> {im.size}  " + "  ".join(f"{k} {v:.1f} dB" for k, v in values.items()))
        best = max(values.values())
        assert best >= 25, f"{rel}: PSNR {values} against torchvision is below 25 dB"
    print("PSNR of the re-encoded JPEG against torchvision:\n" + "\n".join(report))

    packed_paths = {s.info["path"] for s in packed.samples}
    assert {"cat/tiny_40x30.png", "cat/tiny_40x30.jpg", "cat/chelsea_small.ppm"} <= packed_paths  # the no-upscale cases


def test_reencode_subsampling_444(reencode_tree, pack_bin):
    out = reencode_tree.parent / "re444.lmdb"
    pack_json(
        pack_bin, "imagefolder", reencode_tree, "--to", "lmdb", "-o", out,
        "--mode", "reencode", "--max-side", "96", "--subsampling", "444", "--quality", "75",
    )
    q75 = io.BytesIO()
    Image.new("RGB", (16, 16)).save(q75, "JPEG", quality=75)
    q75_tables = Image.open(q75).quantization
    for s in read_lmdb(out).samples:
        im = Image.open(io.BytesIO(s.image))
        assert JpegImagePlugin.get_sampling(im) == 0, f"{s.info['path']}: not 4:4:4"
        assert im.quantization == q75_tables, f"{s.info['path']}: quantization tables are not those of quality 75"
        assert max(im.size) <= 96


def test_keep_if_fits_everything_fits(reencode_tree, pack_bin):
    """`--keep-if-fits --max-side 100000`: every JPEG source is stored byte for byte, except the
    CMYK one (re-encoded as RGB); `kept_unchanged` counts them."""
    out = reencode_tree.parent / "keep.lmdb"
    summary = pack_json(
        pack_bin, "imagefolder", reencode_tree, "--to", "lmdb", "-o", out,
        "--mode", "reencode", "--keep-if-fits", "--max-side", "100000",
    )
    samples = read_lmdb(out).samples
    kept = 0
    for s in samples:
        rel = s.info["path"]
        src = reencode_tree / rel
        assert s.image_ext == "jpg"
        if is_jpeg_source(src) and not is_cmyk(src):
            assert s.image == src.read_bytes(), f"{rel}: a fitting JPEG was not stored unchanged"
            kept += 1
        else:
            assert s.image != src.read_bytes()
            assert jpeg_sof(s.image) == 0xC0, rel
            im = Image.open(io.BytesIO(s.image))
            assert im.mode == "RGB" and im.size == Image.open(src).size, (rel, im.mode, im.size)
            assert psnr(np.asarray(im), pil_rgb(src)) >= 30, rel
    assert kept == sum(is_jpeg_source(reencode_tree / s.info["path"]) for s in samples) - 1  # minus cmyk.jpg
    assert kept >= 20
    assert summary["kept_unchanged"] == kept, f"kept_unchanged {summary['kept_unchanged']}, stored unchanged {kept}"


def test_keep_if_fits_threshold(reencode_tree, pack_bin):
    """`--keep-if-fits --max-side 200`: a JPEG whose longer side is <= 200 is kept, a larger
    one is resized to a longer side of 200."""
    out = reencode_tree.parent / "keep200.lmdb"
    summary = pack_json(
        pack_bin, "imagefolder", reencode_tree, "--to", "lmdb", "-o", out,
        "--mode", "reencode", "--keep-if-fits", "--max-side", "200",
    )
    kept = 0
    for s in read_lmdb(out).samples:
        rel = s.info["path"]
        src = reencode_tree / rel
        with Image.open(src) as im:
            size, mode = im.size, im.mode
        got = Image.open(io.BytesIO(s.image))
        if is_jpeg_source(src) and mode != "CMYK" and max(size) <= 200:
            assert s.image == src.read_bytes(), f"{rel} {size}: fits in 200 but was re-encoded"
            kept += 1
        else:
            assert s.image != src.read_bytes(), f"{rel} {size}: stored unchanged"
            if max(size) <= 200:
                assert got.size == size, (rel, size, got.size)
            else:
                w, h = size
                assert max(got.size) == 200, (rel, size, got.size)
                short = min(w, h) * 200 / max(w, h)
                assert abs(min(got.size) - short) <= 1, (rel, size, got.size)
                assert (got.size[0] >= got.size[1]) == (w >= h), (rel, size, got.size)
    assert summary["kept_unchanged"] == kept
    assert kept >= 5  # 192- and 200-px JPEGs in testdata (and the tiny one)


def test_decode_center_crop_exact(reencode_tree, pack_bin):
    """`--center-crop 56` without resizing: torchvision's `CenterCrop(56)`, exactly (zero
    padding for the 40x30 image)."""
    out = reencode_tree.parent / "crop.lmdb"
    pack_json(
        pack_bin, "imagefolder", reencode_tree, "--to", "lmdb", "-o", out, "--mode", "decode", "--center-crop", "56"
    )
    for s in read_lmdb(out).samples:
        rel = s.info["path"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            src = Image.open(reencode_tree / rel).convert("RGB")
        want = np.asarray(T.CenterCrop(56)(src))
        assert_same_pixels(load_npy(s.image), want, f"{rel} --center-crop 56")


# The resampling filter pack records in its metadata (`options.resize_filter`), as torchvision
# names it.
RESIZE_FILTERS = {
    "lanczos3": InterpolationMode.LANCZOS,
    "bicubic": InterpolationMode.BICUBIC,
    "catmullrom": InterpolationMode.BICUBIC,
    "bilinear": InterpolationMode.BILINEAR,
    "triangle": InterpolationMode.BILINEAR,
}


@pytest.mark.parametrize("filter_args", [[], ["--resize-filter", "bilinear"]], ids=["default", "bilinear"])
def test_decode_resize_and_crop(reencode_tree, pack_bin, filter_args):
    """`--resize-shorter 64 --center-crop 56`: fixed 56x56x3 records equal, up to rounding, to
    torchvision's `Compose([Resize(64, F), CenterCrop(56)])`, F the filter the metadata names
    (no Resize where pack does not upscale). A JPEG source may be scaled down in the DCT
    domain first (as Pillow's `draft()` does), so it only has to be close."""
    out = reencode_tree.parent / f"resize-crop-{'-'.join(filter_args) or 'default'}.lmdb"
    pack_json(
        pack_bin, "imagefolder", reencode_tree, "--to", "lmdb", "-o", out,
        "--mode", "decode", "--resize-shorter", "64", "--center-crop", "56", *filter_args,
    )
    packed = read_lmdb(out)
    name = packed.meta["options"].get("resize_filter")
    assert name in RESIZE_FILTERS, f"unknown resize_filter {name!r} in the metadata"
    resize = T.Resize(64, interpolation=RESIZE_FILTERS[name], antialias=True)
    report = []
    for s in packed.samples:
        rel = s.info["path"]
        got = load_npy(s.image)
        assert got.shape == (56, 56, 3), f"{rel}: {got.shape}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            src = Image.open(reencode_tree / rel).convert("RGB")
        resized = min(src.size) > 64
        ref = np.asarray(T.CenterCrop(56)(resize(src) if resized else src))
        value = psnr(got, ref)
        jpeg = is_jpeg_source(reencode_tree / rel)
        report.append(f"{rel:28} {'jpeg' if jpeg else '    '} {value:.1f} dB")
        if not resized:
            assert_same_pixels(got, ref, f"{rel} (not resized) --center-crop 56")
        else:
            # lanczos3 today: 53.6-55.2 dB for the non-JPEG sources, 34.2-46.2 dB for JPEGs.
            floor = 30 if jpeg else 45
            assert value >= floor, f"{rel}: against Resize(64, {RESIZE_FILTERS[name].value}): {diff_report(got, ref)}"
    print(f"PSNR of decode --resize-shorter 64 --center-crop 56 against torchvision ({name}):\n" + "\n".join(report))


# --------------------------------------------------------------------------- 5) EXIF orientation

EXIF_FORMATS = ("jpg", "png", "webp", "tiff")


def write_oriented(folder: Path) -> None:
    """48x32 images (red top-left corner) tagged with every EXIF orientation, in each format
    Pillow's exif_transpose reads it from (JPEG and WebP EXIF, PNG eXIf, TIFF tag 274)."""
    folder.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(smooth_rgb(32, 48))
    for o in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        img.save(folder / f"o{o}.jpg", quality=95, exif=exif)
        img.save(folder / f"o{o}.png", exif=exif)
        img.save(folder / f"o{o}.webp", lossless=True, exif=exif)
        img.save(folder / f"o{o}.tiff", exif=exif)
    with Image.open(folder / "o6.jpg") as im:
        assert im.getexif()[0x0112] == 6


@pytest.fixture(scope="module")
def oriented(tmp_path_factory, pack_bin) -> tuple[Path, dict, dict]:
    base = tmp_path_factory.mktemp("exif")
    root = base / "src"
    write_oriented(root / "a")
    pack_json(pack_bin, "imagefolder", root, "--to", "lmdb", "-o", base / "plain", "--mode", "decode")
    pack_json(pack_bin, "imagefolder", root, "--to", "lmdb", "-o", base / "rot", "--mode", "decode", "--exif-rotate")
    plain = {s.info["path"]: s for s in read_lmdb(base / "plain").samples}
    rotated = {s.info["path"]: s for s in read_lmdb(base / "rot").samples}
    return root, plain, rotated


@pytest.mark.parametrize(
    "fmt,o",
    [(f, o) for f in EXIF_FORMATS for o in range(1, 9)],
)
def test_exif_ignored_by_default(fmt, o, oriented):
    """Default: the pixels torchvision's loader gives, `Image.open(f).convert("RGB")` with no
    exif_transpose: the stored, unrotated pixels for JPEG, PNG and WebP; for TIFF, Pillow
    applies the Orientation tag itself when loading, and so does pack."""
    root, plain, _ = oriented
    rel = f"a/o{o}.{fmt}"
    want = pil_rgb(root / rel)
    if fmt != "tiff":
        assert want.shape == (32, 48, 3)
    assert_same_pixels(load_npy(plain[rel].image), want, f"{rel} (default)")


@pytest.mark.parametrize(
    "fmt,o",
    [(f, o) for f in EXIF_FORMATS for o in range(1, 9)],
)
def test_exif_rotate(fmt, o, oriented):
    """`--exif-rotate`: `np.asarray(ImageOps.exif_transpose(Image.open(f)).convert("RGB"))`."""
    root, _, rotated = oriented
    rel = f"a/o{o}.{fmt}"
    with Image.open(root / rel) as im:
        want = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert want.shape == ((48, 32, 3) if o >= 5 else (32, 48, 3))
    assert_same_pixels(load_npy(rotated[rel].image), want, f"{rel} --exif-rotate")


def test_exif_orientation_6_jpeg(oriented):
    """The brief's case on its own: orientation 6 (rotate 90 degrees clockwise to display)."""
    root, plain, rotated = oriented
    src = root / "a/o6.jpg"
    with Image.open(src) as im:
        assert im.getexif()[0x0112] == 6
        unrotated = np.asarray(im.convert("RGB"))
    with Image.open(src) as im:
        upright = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert unrotated.shape == (32, 48, 3) and upright.shape == (48, 32, 3)
    assert_same_pixels(load_npy(plain["a/o6.jpg"].image), unrotated, "o6.jpg default")
    assert_same_pixels(load_npy(rotated["a/o6.jpg"].image), upright, "o6.jpg --exif-rotate")


# --------------------------------------------------------------------------- 6) decompression bomb


def test_decompression_bomb(tmp_path, pack_bin):
    t0 = time.monotonic()
    bomb = bomb_png(20000, 20000)
    made_in = time.monotonic() - t0
    assert len(bomb) < 300_000 and made_in < 10, (len(bomb), made_in)
    root = copy_into(tmp_path / "src", {"a/ok.jpg": "cat/chelsea_01.jpg", "a/bomb.png": bomb})
    # It is a bomb for Pillow too: 400 MP is more than twice Image.MAX_IMAGE_PIXELS.
    with pytest.raises(Image.DecompressionBombError):
        Image.open(root / "a/bomb.png")

    summary = pack_json(pack_bin, "imagefolder", root, "--to", "lmdb", "-o", tmp_path / "dec", "--mode", "decode", rc=3)
    assert summary["found"] == 2 and summary["packed"] == 1
    reasons = skipped_names(summary)
    assert list(reasons) == ["bomb.png"], summary["skipped"]
    assert "--max-pixels" in reasons["bomb.png"], f"the reason does not name --max-pixels: {reasons['bomb.png']!r}"
    assert [s.info["path"] for s in read_lmdb(tmp_path / "dec").samples] == ["a/ok.jpg"]

    # Raised limit, passthrough: stored as is (and never decoded: a decode would need 1.2 GB).
    summary = pack_json(
        pack_bin, "imagefolder", root, "--to", "lmdb", "-o", tmp_path / "pass",
        "--mode", "passthrough", "--max-pixels", "500000000",
    )
    assert summary["found"] == summary["packed"] == 2 and summary["skipped"] == []
    samples = {s.info["path"]: s for s in read_lmdb(tmp_path / "pass").samples}
    assert samples["a/bomb.png"].image_ext == "png" and samples["a/bomb.png"].image == bomb


# --------------------------------------------------------------------------- 7) truncated JPEG


@pytest.fixture
def truncated_tree(tmp_path) -> Path:
    root = copy_into(tmp_path / "src", {"a/ok.jpg": "cat/chelsea_02.jpg", "a/truncated.jpg": BAD / "truncated.jpg"})
    with pytest.raises(OSError):  # Pillow cannot load it either
        pil_open(root / "a/truncated.jpg")
    return root


@pytest.mark.parametrize("mode", ["decode", "reencode"])
def test_truncated_jpeg_skipped_when_decoding(mode, truncated_tree, pack_bin, tmp_path):
    summary = pack_json(
        pack_bin, "imagefolder", truncated_tree, "--to", "lmdb", "-o", tmp_path / "out", "--mode", mode, rc=3
    )
    reasons = skipped_names(summary)
    assert list(reasons) == ["truncated.jpg"], summary["skipped"]
    assert reasons["truncated.jpg"].strip()
    assert summary["packed"] == 1
    assert [s.info["path"] for s in read_lmdb(tmp_path / "out").samples] == ["a/ok.jpg"]


def test_truncated_jpeg_passthrough(truncated_tree, pack_bin, tmp_path):
    """Its header is intact, but Pillow cannot load it: passthrough (which decodes nothing)
    still finds that it ends before its end-of-image marker and skips it."""
    summary = pack_json(pack_bin, "imagefolder", truncated_tree, "--to", "lmdb", "-o", tmp_path / "out", rc=3)
    reasons = skipped_names(summary)
    assert list(reasons) == ["truncated.jpg"], summary["skipped"]
    assert "truncated jpg" in reasons["truncated.jpg"], reasons
    assert [s.info["path"] for s in read_lmdb(tmp_path / "out").samples] == ["a/ok.jpg"]


def test_truncated_jpeg_keep_if_fits(truncated_tree, pack_bin, tmp_path):
    summary = pack_json(
        pack_bin, "imagefolder", truncated_tree, "--to", "lmdb", "-o", tmp_path / "out",
        "--mode", "reencode", "--keep-if-fits", "--max-side", "100000", rc=3,
    )
    assert list(skipped_names(summary)) == ["truncated.jpg"]
