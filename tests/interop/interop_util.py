"""Helpers shared by the interop tests (imported by conftest.py and the test modules):
fixture paths, format sniffing, building ImageFolder trees from testdata (and large ones from
copies of it), a directory's files with their bytes, reading back a
dataset written by `pack --to lmdb` while checking its layout, checking every CRC-32 of an LMDB
or WebDataset output with the standard library alone, and extracting the Python snippets the
docs mark for testing."""


from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Union

import lmdb
import pytest

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "testdata"
IMAGEFOLDER = TESTDATA / "imagefolder"
BAD = TESTDATA / "bad"

# The format version `pack` writes (FORMAT.md), and the checksum algorithm its metadata names.
FORMAT_VERSION = 3
CHECKSUM = "crc32"
# LMDB: the record holding the checksum table (FORMAT.md, "LMDB"), besides `__meta__` the only
# record that is not a sample field.
CHECKSUMS_KEY = "__checksums__"

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



def big_tree(root: Path, copies: int) -> Path:
    """`copies` copies of every testdata JPEG, spread over the testdata classes: a tree whose
    packing takes long enough to be killed (or to lose its mount) in the middle."""
    images = [f for f in testdata_images() if f.lower().endswith((".jpg", ".jpeg"))]
    files = {}
    for n in range(copies):
        for rel in images:
            cls, name = rel.split("/", 1)
            files[f"{cls}/{n:04d}_{name.replace('/', '_')}"] = rel
    return copy_into(root, files)


def local_files(root: Path) -> dict[str, bytes]:
    """Every file under `root` (paths relative to it, `/`-separated) with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

class Mount:
    """slowfs (the `slowfs` fixture's binary) serving `tree` at `mnt`, `latency_ms` in each read,
    until `kill()` or the block ends: a slow source, or one whose daemon dies."""

    def __init__(self, slowfs: Path, tree: Path, mnt: Path, latency_ms: int = 20):
        mnt.mkdir(parents=True, exist_ok=True)
        self.mnt = mnt
        self.proc = subprocess.Popen(
            [slowfs, tree, mnt, "--latency-ms", str(latency_ms), "--ops", "read"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        line = self.proc.stdout.readline()
        assert line.startswith("mounted"), f"slowfs did not mount: {line}{self.proc.stderr.read()}"

    def kill(self) -> None:
        """SIGKILL the daemon: the kernel aborts the connection, and the mount, still in place,
        answers ENOTCONN to everything (what a crashed FUSE daemon leaves)."""
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> "Mount":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        # A dead daemon's mount stays until unmounted; -z when something still holds it.
        for flags in ("-u", "-uz"):
            if os.path.ismount(self.mnt):
                subprocess.run(["fusermount3", flags, str(self.mnt)], check=False)
        assert not os.path.ismount(self.mnt), f"{self.mnt} is still mounted"


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
    records: dict  # every key (str) -> value (bytes), including __meta__ and __checksums__
    samples: list  # list[Sample], in key order
    checksums: list  # list[int]: each sample's CRC-32 from __checksums__, checked against its records


def read_lmdb(path: Path) -> Packed:
    """Read a whole dataset written by `pack --to lmdb` and check its layout: `__meta__`
    present, keys `{i:0{key_width}}.{ext}` for i in 0..samples with no gap and nothing else
    but `__checksums__`, each sample with exactly one image field (or, from `--mode decode`, one
    `npy` or `npy.zst` pixel field; `Sample.image_ext` / `Sample.image` then name and hold that
    field) plus `cls` and `json`; and every checksum right (`check_lmdb_checksums`)."""
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
    assert meta.get("version") == FORMAT_VERSION, meta
    assert meta.get("checksum") == CHECKSUM, meta
    for k in ("samples", "key_width", "classes", "fields"):
        assert k in meta, f"__meta__ lacks {k!r}: {meta}"
    n, width = meta["samples"], meta["key_width"]
    assert isinstance(n, int) and n >= 0
    assert isinstance(width, int) and width >= 8
    classes = meta["classes"]
    assert isinstance(classes, list) and all(isinstance(c, str) for c in classes)

    by_key: dict[str, dict[str, bytes]] = {}
    for name, value in records.items():
        if name in ("__meta__", CHECKSUMS_KEY):
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
    checksums = check_lmdb_checksums(records)
    return Packed(Path(path), meta, records, samples, checksums)


# --------------------------------------------------------------------------- checksums (format version 2)
#
# Written from FORMAT.md with nothing but zlib, struct and json: if the Rust side and the
# document drift apart, these fail.


def check_lmdb_checksums(records: Mapping[str, bytes]) -> list[int]:
    """Check an LMDB output's `__checksums__` record against its other records (every key ->
    value, as `read_lmdb` collects them): the 24-byte header (magic `IMGPKSUM`, u32 LE version
    1, u32 LE CRC-32 of the `__meta__` value, u64 LE sample count = `samples` of the metadata),
    then one u32 LE per sample equal to the CRC-32 of its record values concatenated in key
    order. Returns the per-sample CRCs; fails naming the first sample that does not match."""
    assert CHECKSUMS_KEY in records, f"no {CHECKSUMS_KEY} record; keys: {sorted(records)[-5:]}"
    table, meta_bytes = records[CHECKSUMS_KEY], records["__meta__"]
    meta = json.loads(meta_bytes)
    assert len(table) >= 24, f"{CHECKSUMS_KEY} is {len(table)} bytes, shorter than its header"
    magic, version, meta_crc, count = struct.unpack_from("<8sIIQ", table)
    assert magic == b"IMGPKSUM", f"{CHECKSUMS_KEY} magic {magic!r}"
    assert version == 1, f"{CHECKSUMS_KEY} version {version}"
    assert count == meta["samples"], f"{CHECKSUMS_KEY} counts {count} samples, __meta__ {meta['samples']}"
    assert len(table) == 24 + 4 * count, f"{CHECKSUMS_KEY} is {len(table)} bytes for {count} samples"
    assert meta_crc == zlib.crc32(meta_bytes), (
        f"{CHECKSUMS_KEY} records CRC-32 {meta_crc:08x} for __meta__, which has {zlib.crc32(meta_bytes):08x}"
    )
    sums = list(struct.unpack_from(f"<{count}I", table, 24))

    width = meta["key_width"]
    actual = [0] * count
    for name in sorted(records, key=lambda k: k.encode("utf-8")):  # LMDB's order: bytewise
        key, dot, _ = name.partition(".")
        if dot:
            assert len(key) == width and key.isdigit() and int(key) < count, f"record {name!r} is no sample's"
            actual[int(key)] = zlib.crc32(records[name], actual[int(key)])
    for i, (want, got) in enumerate(zip(sums, actual)):
        assert got == want, f"sample {i:0{width}d}: its records have CRC-32 {got:08x}, {CHECKSUMS_KEY} says {want:08x}"
    return sums


@dataclass
class IndexEntry:
    offset: int  # of the sample's first tar header in its shard
    length: int  # of the byte range holding all its members (headers, data, padding)
    shard: int
    crc32: int


def check_webdataset_checksums(out: Path) -> list[IndexEntry]:
    """Check a WebDataset output's `imgpack.index` (version 2) with the standard library: header
    (magic `IMGPKIDX`, u32 LE version 2, u32 LE CRC-32 of imgpack.json's bytes, u64 LE sample
    count = `samples` of the metadata), one 24-byte entry per sample; each entry's range is
    exactly its sample's members in the shard as `tarfile` finds them (first header to the end
    of the last member's padded data), and its CRC-32 is `zlib.crc32` of those bytes. Returns
    the entries; fails naming the first sample that does not match."""
    out = Path(out)
    meta_bytes = (out / "imgpack.json").read_bytes()
    meta = json.loads(meta_bytes)
    assert meta.get("version") == FORMAT_VERSION and meta.get("checksum") == CHECKSUM, meta
    index = (out / "imgpack.index").read_bytes()
    assert len(index) >= 24, f"imgpack.index is {len(index)} bytes, shorter than its header"
    magic, version, meta_crc, count = struct.unpack_from("<8sIIQ", index)
    assert magic == b"IMGPKIDX", f"imgpack.index magic {magic!r}"
    assert version == 2, f"imgpack.index version {version}"
    assert count == meta["samples"], f"imgpack.index counts {count} samples, imgpack.json {meta['samples']}"
    assert len(index) == 24 + 24 * count, f"imgpack.index is {len(index)} bytes for {count} samples"
    assert meta_crc == zlib.crc32(meta_bytes), (
        f"imgpack.index records CRC-32 {meta_crc:08x} for imgpack.json, which has {zlib.crc32(meta_bytes):08x}"
    )
    entries = [IndexEntry(*fields) for fields in struct.iter_unpack("<QQII", index[24:])]

    # Where each sample really is, from tarfile's own parse of the shards.
    width = meta["key_width"]
    ranges: dict[int, tuple[int, int, int]] = {}  # sample -> (shard, start, end)
    for shard_no, shard in enumerate(meta["shards"]):
        with tarfile.open(out / shard["name"], mode="r:") as tf:
            for m in tf.getmembers():
                i = int(m.name.split(".", 1)[0])
                end = m.offset_data + (m.size + 511) // 512 * 512
                s, start, _ = ranges.get(i, (shard_no, m.offset, end))
                assert s == shard_no, f"sample {i:0{width}d} has members in shards {s} and {shard_no}"
                ranges[i] = (shard_no, start, end)
    assert sorted(ranges) == list(range(count)), f"the shards hold samples {sorted(ranges)[:5]}..., not 0..{count - 1}"

    shard_data: dict[int, bytes] = {}
    for i, e in enumerate(entries):
        shard_no, start, end = ranges[i]
        assert (e.shard, e.offset, e.length) == (shard_no, start, end - start), (
            f"sample {i:0{width}d}: imgpack.index says shard {e.shard} bytes {e.offset}+{e.length}, "
            f"its members are in shard {shard_no} at {start}+{end - start}"
        )
        if e.shard not in shard_data:
            shard_data[e.shard] = (out / meta["shards"][e.shard]["name"]).read_bytes()
        got = zlib.crc32(shard_data[e.shard][e.offset : e.offset + e.length])
        assert got == e.crc32, f"sample {i:0{width}d}: its bytes have CRC-32 {got:08x}, imgpack.index says {e.crc32:08x}"
    return entries


# --------------------------------------------------------------------------- snippets in the docs


def doc_block(doc: str, name: str, languages: tuple[str, ...]) -> list[str]:
    """The lines of the fenced block, in one of `languages`, that follows the line
    `<!-- interop-test: NAME -->` in `doc` (a path relative to the repository), which must
    appear exactly once."""
    marker = f"<!-- interop-test: {name} -->"
    path = REPO / doc
    if not path.is_file():
        pytest.fail(f"{path} does not exist; it must hold the snippet marked {marker!r}", pytrace=False)
    lines = path.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == marker]
    assert len(starts) == 1, f"{doc} must contain the line {marker!r} exactly once (found {len(starts)})"
    i = starts[0] + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    fence = "```" + languages[0]
    opening = r"```\s*(" + "|".join(map(re.escape, languages)) + r")\s*"
    assert i < len(lines) and re.fullmatch(opening, lines[i].strip()), (
        f"the line after {marker!r} in {doc} must open a {fence} block, found {lines[i:i + 1]}"
    )
    body = []
    for line in lines[i + 1 :]:
        if line.strip() == "```":
            break
        body.append(line)
    else:
        pytest.fail(f"the {fence} block after {marker!r} in {doc} is not closed")
    return body


def doc_snippet(doc: str, name: str) -> str:
    """The ```python block that follows the line `<!-- interop-test: NAME -->` in `doc` (a path
    relative to the repository), which must appear exactly once."""
    body = doc_block(doc, name, ("python",))
    assert any(line.strip() for line in body), f"the {doc} snippet {name!r} is empty"
    return "\n".join(body) + "\n"


def run_doc_snippet(doc: str, name: str) -> dict:
    """Run a marked snippet exactly as written, in the current directory; returns the names it
    defined."""
    namespace: dict = {"__name__": "doc_snippet"}
    exec(compile(doc_snippet(doc, name), f"{doc}:{name}", "exec"), namespace)
    return namespace
