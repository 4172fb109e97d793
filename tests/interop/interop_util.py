"""Helpers shared by the interop tests (imported by conftest.py and the test modules):
fixture paths, format sniffing, building ImageFolder trees from testdata, and reading back a
dataset written by `pack --to lmdb` while checking its layout."""


from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Union

import lmdb

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "testdata"
IMAGEFOLDER = TESTDATA / "imagefolder"
BAD = TESTDATA / "bad"

# Field extension of each image format, as the writer must sniff it from the bytes.
IMAGE_EXTS = ("jpg", "png", "webp", "bmp", "tiff", "ppm", "pgm")
# Fields of decoded pixels (`--mode decode`): a NumPy .npy file, or the same zstd-compressed.
PIXEL_EXTS = ("npy", "npy.zst")
# A sample holds exactly one of these: its image, or its decoded pixels.
PAYLOAD_EXTS = IMAGE_EXTS + PIXEL_EXTS


def sniff_ext(data: bytes) -> str | None:
    """The extension an image is stored under, from its magic number (None: not an image)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data.startswith(b"BM"):
        return "bmp"
    if data.startswith((b"II*\x00", b"MM\x00*")):
        return "tiff"
    if len(data) >= 3 and data[0:1] == b"P" and data[2:3].isspace():
        if data[1:2] in (b"3", b"6"):
            return "ppm"
        if data[1:2] in (b"2", b"5"):
            return "pgm"
    return None


# --------------------------------------------------------------------------- building trees

Source = Union[str, Path, bytes]


def copy_into(root: Path, files: Mapping[str, Source]) -> Path:
    """Create `root` and, for each `relpath -> source`, write `root/relpath`. A `str` source is
    a path relative to `testdata/imagefolder` (e.g. "cat/chelsea_01.jpg"), a `Path` any file,
    `bytes` literal content. Parent directories are created as needed."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, src in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, bytes):
            dest.write_bytes(src)
        else:
            src_path = IMAGEFOLDER / src if isinstance(src, str) else src
            assert src_path.is_file(), f"fixture source {src_path} is missing (run testdata/make_testdata.py)"
            shutil.copyfile(src_path, dest)
    return root


def testdata_images() -> list[str]:
    """Every image in testdata/imagefolder, as paths relative to it, sorted."""
    files = sorted(p.relative_to(IMAGEFOLDER).as_posix() for p in IMAGEFOLDER.rglob("*") if p.is_file())
    assert len(files) >= 20, f"testdata/imagefolder looks incomplete ({len(files)} files); run testdata/make_testdata.py"
    return files


# --------------------------------------------------------------------------- reading LMDB output


@dataclass
class Sample:
    index: int
    key: str
    image_ext: str
    image: bytes
    label: int
    info: dict
    fields: dict = field(repr=False)


@dataclass
class Packed:
    path: Path
    meta: dict
    records: dict  # every key (str) -> value (bytes), including __meta__
    samples: list  # list[Sample], in key order


def read_lmdb(path: Path) -> Packed:
    """Read a whole dataset written by `pack --to lmdb` and check its layout: `__meta__`
    present, keys `{i:0{key_width}}.{ext}` for i in 0..samples with no gap and nothing else,
    each sample with exactly one image field (or, from `--mode decode`, one `npy` or `npy.zst`
    pixel field; `Sample.image_ext` / `Sample.image` then name and hold that field) plus `cls`
    and `json`."""
    assert (Path(path) / "data.mdb").is_file(), f"{path} is not an LMDB environment directory"
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            records = {bytes(k).decode("utf-8"): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()

    assert "__meta__" in records, f"no __meta__ key in {path}; keys: {sorted(records)[:10]}..."
    meta = json.loads(records["__meta__"])
    assert meta.get("format") == "imgpack-lmdb", meta
    assert meta.get("version") == 1, meta
    for k in ("samples", "key_width", "classes", "fields"):
        assert k in meta, f"__meta__ lacks {k!r}: {meta}"
    n, width = meta["samples"], meta["key_width"]
    assert isinstance(n, int) and n >= 0
    assert isinstance(width, int) and width >= 8
    classes = meta["classes"]
    assert isinstance(classes, list) and all(isinstance(c, str) for c in classes)

    by_key: dict[str, dict[str, bytes]] = {}
    for name, value in records.items():
        if name == "__meta__":
            continue
        key, dot, ext = name.partition(".")
        assert dot and ext, f"unexpected record {name!r} (not key.ext)"
        by_key.setdefault(key, {})[ext] = value
    expected_keys = [str(i).zfill(width) for i in range(n)]
    assert sorted(by_key) == expected_keys, (
        f"sample keys are not exactly 0..{n - 1} at width {width}: "
        f"extra {sorted(set(by_key) - set(expected_keys))[:5]}, missing {sorted(set(expected_keys) - set(by_key))[:5]}"
    )

    samples = []
    all_exts = set()
    for i, key in enumerate(expected_keys):
        fields = by_key[key]
        all_exts |= set(fields)
        image_exts = [e for e in fields if e in PAYLOAD_EXTS]
        assert len(image_exts) == 1, f"sample {key} has image/pixel fields {image_exts}; fields {sorted(fields)}"
        assert set(fields) == {image_exts[0], "cls", "json"}, f"sample {key} has fields {sorted(fields)}"
        image = fields[image_exts[0]]
        cls_text = fields["cls"].decode("ascii")
        assert cls_text.isdigit(), f"sample {key}: cls {fields['cls']!r} is not ASCII decimal"
        label = int(cls_text)
        assert 0 <= label < len(classes), f"sample {key}: cls {label} out of range for {len(classes)} classes"
        info = json.loads(fields["json"].decode("utf-8"))
        assert info.get("class") == classes[label], f"sample {key}: json class {info.get('class')!r} != classes[{label}]"
        samples.append(Sample(i, key, image_exts[0], image, label, info, fields))
    assert sorted(meta["fields"]) == sorted(all_exts), f"meta fields {meta['fields']} != fields present {sorted(all_exts)}"
    return Packed(Path(path), meta, records, samples)
