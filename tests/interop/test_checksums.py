"""Format version 2's CRC-32 checksums, checked from Python with the standard library alone
(`zlib`, `struct`, `json`, plus the `lmdb` package to open an LMDB):

1. every checksum `pack` writes is right, for both formats, every mode (passthrough, reencode,
   decode, decode + zstd) and conversions between the formats, checked by the independent
   checkers in interop_util and by the two snippets FORMAT.md shows, run exactly as written;
2. the checks can fail: one flipped byte of a sample's image (or of a WebDataset sample's tar
   padding), or one extra byte in the metadata, is caught, naming the damaged sample, although
   the usual readers (`lmdb`, `tarfile`) read the damaged bytes without a word;
3. a version-1 dataset (no checksums) is still read by `pack`, and the snippets say it has no
   checksums instead of calling it damaged.

Run: ~/.cache/imgpack-venv/bin/python -m pytest tests/interop -q
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tarfile
import zlib
from pathlib import Path

import lmdb
import pytest

import interop_util
from interop_util import (
    CHECKSUMS_KEY,
    check_lmdb_checksums,
    check_webdataset_checksums,
    copy_into,
    read_lmdb,
    run_doc_snippet,
)

# Every mode the other interop tests pack, with the options that make it cheap here.
MODES = {
    "passthrough": [],
    "reencode": ["--mode", "reencode", "--resize-shorter", "64"],
    "decode": ["--mode", "decode", "--resize-shorter", "64", "--center-crop", "56"],
    "decode-zstd": ["--mode", "decode", "--compress", "zstd"],
}
FORMATS = ("lmdb", "webdataset")
# Format -> the name of its checksum snippet in FORMAT.md and the dataset path the snippet uses.
SNIPPETS = {"lmdb": ("lmdb-checksum-snippet", "train.lmdb"), "webdataset": ("webdataset-checksum-snippet", "shards")}


def pack_ok(pack_bin: Path, *args) -> subprocess.CompletedProcess:
    cmd = [str(pack_bin), *(os.fspath(a) for a in args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=300)
    print(f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    assert proc.returncode == 0, f"pack {' '.join(map(str, args))} exited {proc.returncode}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Every testdata image (every format), in four classes."""
    images = interop_util.testdata_images()
    return copy_into(tmp_path_factory.mktemp("checksums") / "src", {f: f for f in images})


@pytest.fixture(scope="module")
def outputs(source, pack_bin) -> dict[tuple[str, str], Path]:
    """(format, mode) -> the output of `pack imagefolder source --to format` in that mode;
    WebDatasets in shards of at most 7 samples, so samples sit in several shards."""
    outs = {}
    for fmt in FORMATS:
        for mode, args in MODES.items():
            out = source.parent / f"{mode}.{fmt}"
            extra = ["--shard-samples", "7"] if fmt == "webdataset" else []
            pack_ok(pack_bin, "imagefolder", source, "--to", fmt, "-o", out, *args, *extra)
            outs[fmt, mode] = out
    return outs


def run_snippet(fmt: str, outputs, cwd: Path) -> dict:
    """FORMAT.md's checksum snippet for `fmt`, run exactly as written in `cwd` next to a copy of
    the passthrough output under the name the snippet uses; the names it defined."""
    name, target = SNIPPETS[fmt]
    shutil.copytree(outputs[fmt, "passthrough"], cwd / target)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        return run_doc_snippet("FORMAT.md", name)


@pytest.fixture(scope="module")
def lmdb_snippet(tmp_path_factory, outputs):
    """The `damaged_samples(path)` that FORMAT.md's LMDB checksum snippet defines."""
    return run_snippet("lmdb", outputs, tmp_path_factory.mktemp("lmdb-snippet"))["damaged_samples"]


@pytest.fixture(scope="module")
def wds_snippet(tmp_path_factory, outputs):
    """The `damaged_samples(path)` that FORMAT.md's WebDataset checksum snippet defines."""
    return run_snippet("webdataset", outputs, tmp_path_factory.mktemp("wds-snippet"))["damaged_samples"]


def lmdb_records(path: Path) -> dict[str, bytes]:
    """Every record, in LMDB's key order."""
    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
        return {bytes(k).decode(): bytes(v) for k, v in txn.cursor()}


# --------------------------------------------------------------------------- 1) intact outputs


@pytest.mark.parametrize("fmt", FORMATS)
def test_doc_checksum_snippet(fmt, outputs, tmp_path):
    """FORMAT.md's checksum snippets, run exactly as written next to the dataset they name:
    they find nothing wrong with an intact one (damaged ones are below)."""
    namespace = run_snippet(fmt, outputs, tmp_path)
    assert callable(namespace.get("damaged_samples")), "the snippet must define damaged_samples(path)"
    assert "damaged" in namespace, "the snippet must leave `damaged` defined"
    assert namespace["damaged"] == [], f"the snippet calls intact samples damaged: {namespace['damaged']}"


@pytest.mark.parametrize("mode", MODES)
def test_lmdb_checksums(mode, outputs, lmdb_snippet):
    out = outputs["lmdb", mode]
    packed = read_lmdb(out)  # layout and every checksum (check_lmdb_checksums)
    assert packed.meta["version"] == 3 and packed.meta["checksum"] == "crc32"
    assert packed.meta["options"]["mode"] == mode.split("-")[0]
    # __checksums__ sorts after the sample keys and before __meta__, the last record.
    assert list(packed.records)[-2:] == [CHECKSUMS_KEY, "__meta__"], list(packed.records)[-3:]

    # Each sum again, from the parsed sample: its fields' values in key order (by extension).
    table = packed.records[CHECKSUMS_KEY]
    assert struct.unpack_from("<8sIIQ", table) == (
        b"IMGPKSUM", 1, zlib.crc32(packed.records["__meta__"]), len(packed.samples)
    )
    for s in packed.samples:
        want = zlib.crc32(b"".join(s.fields[ext] for ext in sorted(s.fields)))
        assert packed.checksums[s.index] == want, f"sample {s.key} ({s.info['path']})"
        if s.image_ext == "jpg":
            assert want == zlib.crc32(s.fields["cls"] + s.image + s.fields["json"])
    exts = {s.image_ext for s in packed.samples}
    if mode == "passthrough":
        assert {"jpg", "png"} <= exts  # both key orders: cls jpg json, cls json png
    else:
        assert exts == {"reencode": {"jpg"}, "decode": {"npy"}, "decode-zstd": {"npy.zst"}}[mode]

    assert lmdb_snippet(str(out)) == [], f"FORMAT.md's snippet calls intact samples of {out.name} damaged"


@pytest.mark.parametrize("mode", MODES)
def test_webdataset_checksums(mode, outputs, wds_snippet):
    out = outputs["webdataset", mode]
    meta = json.loads((out / "imgpack.json").read_bytes())
    assert meta["version"] == 3 and meta["checksum"] == "crc32"
    assert len(meta["shards"]) >= 3, "the fixture should spread the samples over several shards"
    entries = check_webdataset_checksums(out)  # header, ranges against tarfile, every CRC
    assert len(entries) == meta["samples"] == len(interop_util.testdata_images())

    # Each sum again, from the members tarfile lists: the sample's headers, data and padding.
    index = (out / "imgpack.index").read_bytes()
    assert index[:12] == b"IMGPKIDX" + struct.pack("<I", 2)
    assert struct.unpack_from("<I", index, 12)[0] == zlib.crc32((out / "imgpack.json").read_bytes())
    for shard_no, shard in enumerate(meta["shards"]):
        data = (out / shard["name"]).read_bytes()
        with tarfile.open(out / shard["name"]) as tf:
            members = tf.getmembers()
        for j in range(shard["samples"]):
            i = shard["first"] + j
            mine = [m for m in members if m.name.startswith(f"{i:0{meta['key_width']}d}.")]
            assert len(mine) == 3, [m.name for m in mine]
            blocks = b"".join(data[m.offset : m.offset_data + (m.size + 511) // 512 * 512] for m in mine)
            assert entries[i].shard == shard_no
            assert entries[i].crc32 == zlib.crc32(blocks), f"sample {i:08d} in {shard['name']}"

    assert wds_snippet(out) == [], f"FORMAT.md's snippet calls intact samples of {out.name} damaged"


@pytest.mark.parametrize("mode", ["passthrough", "decode"])
def test_converted_outputs_carry_the_same_checksums(mode, outputs, tmp_path, pack_bin):
    """`pack DATASET --to OTHER` writes checksums too, and since no field changes, each sample's
    CRC is the one the other format's direct output records (the metadata's differs: it names
    its source)."""
    lmdb_from_wds = tmp_path / "from-wds.lmdb"
    pack_ok(pack_bin, outputs["webdataset", mode], "--to", "lmdb", "-o", lmdb_from_wds)
    assert read_lmdb(lmdb_from_wds).checksums == read_lmdb(outputs["lmdb", mode]).checksums

    wds_from_lmdb = tmp_path / "from-lmdb"
    pack_ok(pack_bin, outputs["lmdb", mode], "--to", "webdataset", "-o", wds_from_lmdb, "--shard-samples", "7")
    assert check_webdataset_checksums(wds_from_lmdb) == check_webdataset_checksums(outputs["webdataset", mode])


# --------------------------------------------------------------------------- 2) damaged copies


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_lmdb_flipped_byte_is_caught(outputs, lmdb_snippet, tmp_path):
    """One bit of one image flipped in data.mdb: `lmdb` hands out the damaged bytes without a
    word; the checksums name the sample."""
    src = outputs["lmdb", "passthrough"]
    packed = read_lmdb(src)
    copy = tmp_path / "damaged.lmdb"
    shutil.copytree(src, copy)
    raw = (copy / "data.mdb").read_bytes()

    # A sample in the middle whose image (a large value: its own overflow pages) appears once.
    victim = None
    for s in packed.samples[len(packed.samples) // 2 :] + packed.samples:
        chunk = s.image[len(s.image) // 2 - 32 : len(s.image) // 2 + 32]
        if len(s.image) > 8192 and raw.count(chunk) == 1:
            victim = s
            break
    assert victim is not None, "no sample with an image stored once in data.mdb"
    flip(copy / "data.mdb", raw.index(chunk) + 32)

    records = lmdb_records(copy)
    image_key = f"{victim.key}.{victim.image_ext}"
    assert records[image_key] != victim.image, "the flip did not reach the stored image"
    assert sum(a != b for a, b in zip(records[image_key], victim.image)) == 1
    assert {k: v for k, v in records.items() if k != image_key} == {
        k: v for k, v in packed.records.items() if k != image_key
    }

    with pytest.raises(AssertionError, match=f"sample {victim.key}:"):
        check_lmdb_checksums(records)
    assert lmdb_snippet(str(copy)) == [victim.key]


def test_lmdb_damaged_meta_is_caught(outputs, lmdb_snippet, tmp_path):
    """`__meta__` one byte longer (still valid JSON): its CRC in `__checksums__` no longer fits."""
    copy = tmp_path / "meta.lmdb"
    shutil.copytree(outputs["lmdb", "passthrough"], copy)
    with lmdb.open(str(copy), lock=False) as env, env.begin(write=True) as txn:
        txn.put(b"__meta__", txn.get(b"__meta__") + b" ")
    records = lmdb_records(copy)
    json.loads(records["__meta__"])
    with pytest.raises(AssertionError, match="for __meta__"):
        check_lmdb_checksums(records)
    with pytest.raises(ValueError, match="__meta__ is damaged"):
        lmdb_snippet(str(copy))


@pytest.mark.parametrize("where", ["image", "padding"])
def test_webdataset_flipped_byte_is_caught(where, outputs, wds_snippet, tmp_path):
    """One bit flipped in a shard, in a sample's image data or in the zero padding after it:
    `tarfile` reads the shard without a word; the checksums name the sample."""
    src = outputs["webdataset", "passthrough"]
    copy = tmp_path / "damaged"
    shutil.copytree(src, copy)
    meta = json.loads((copy / "imgpack.json").read_bytes())
    shard = meta["shards"][len(meta["shards"]) // 2]
    with tarfile.open(copy / shard["name"]) as tf:
        members = tf.getmembers()
    image = next(m for m in members if m.name.rsplit(".", 1)[1] not in ("cls", "json") and m.size % 512)
    victim = image.name.split(".", 1)[0]
    flip(copy / shard["name"], image.offset_data + (image.size // 2 if where == "image" else image.size))

    with tarfile.open(copy / shard["name"]) as tf:
        data = tf.extractfile(image.name).read()
    original = (src / shard["name"]).read_bytes()[image.offset_data : image.offset_data + image.size]
    assert (data != original) == (where == "image")

    with pytest.raises(AssertionError, match=f"sample {victim}:"):
        check_webdataset_checksums(copy)
    assert wds_snippet(copy) == [victim]


def test_webdataset_damaged_meta_is_caught(outputs, wds_snippet, tmp_path):
    """imgpack.json one byte longer (still valid JSON): its CRC in imgpack.index no longer fits."""
    copy = tmp_path / "meta"
    shutil.copytree(outputs["webdataset", "passthrough"], copy)
    with open(copy / "imgpack.json", "ab") as f:
        f.write(b" ")
    json.loads((copy / "imgpack.json").read_bytes())
    with pytest.raises(AssertionError, match="for imgpack.json"):
        check_webdataset_checksums(copy)
    with pytest.raises(ValueError, match="imgpack.json is damaged"):
        wds_snippet(copy)


# --------------------------------------------------------------------------- 3) version 1


def as_version_1(meta_bytes: bytes) -> bytes:
    meta = json.loads(meta_bytes)
    meta["version"] = 1
    del meta["checksum"]
    return json.dumps(meta, indent=2).encode() + b"\n"


def test_version_1_lmdb_still_reads(outputs, lmdb_snippet, tmp_path, pack_bin):
    """A version-1 LMDB (no `__checksums__`, no `checksum` in `__meta__`): `pack` still unpacks
    it; the snippet says there is nothing to check."""
    copy = tmp_path / "v1.lmdb"
    shutil.copytree(outputs["lmdb", "passthrough"], copy)
    with lmdb.open(str(copy), lock=False) as env, env.begin(write=True) as txn:
        assert txn.delete(CHECKSUMS_KEY.encode())
        txn.put(b"__meta__", as_version_1(txn.get(b"__meta__")))
    with pytest.raises(ValueError, match="no __checksums__"):
        lmdb_snippet(str(copy))

    tree = tmp_path / "tree"
    pack_ok(pack_bin, copy, "--to", "imagefolder", "-o", tree)
    for s in read_lmdb(outputs["lmdb", "passthrough"]).samples:
        assert (tree / s.info["path"]).read_bytes() == s.image, s.info["path"]


def test_version_1_webdataset_still_reads(outputs, wds_snippet, tmp_path, pack_bin):
    """A version-1 WebDataset (index version 1 with zeros for the CRCs, no `checksum` in
    imgpack.json): `pack` still unpacks it; the snippet says there is nothing to check."""
    copy = tmp_path / "v1"
    shutil.copytree(outputs["webdataset", "passthrough"], copy)
    (copy / "imgpack.json").write_bytes(as_version_1((copy / "imgpack.json").read_bytes()))
    index = bytearray((copy / "imgpack.index").read_bytes())
    index[8:16] = struct.pack("<II", 1, 0)
    for at in range(24 + 20, len(index), 24):
        index[at : at + 4] = bytes(4)
    (copy / "imgpack.index").write_bytes(bytes(index))
    with pytest.raises(ValueError, match="version 1 has no checksums"):
        wds_snippet(copy)

    tree = tmp_path / "tree"
    pack_ok(pack_bin, copy, "--to", "imagefolder", "-o", tree)
    src = interop_util.IMAGEFOLDER
    for rel in interop_util.testdata_images():
        assert (tree / rel).read_bytes() == (src / rel).read_bytes(), rel
