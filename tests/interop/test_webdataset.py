"""`pack imagefolder ... --to webdataset` checked against the real readers of that format:
the `webdataset` package, `wids` (through shardindex.json), Python's `tarfile`, GNU tar and
NVIDIA DALI (CPU only, through our `.idx` files), plus an independent checker of DALI's index
rules, the CRC-32 of every sample in `imgpack.index` (checked on every output this module
packs) and a conversion round trip through LMDB.

Run: ~/.cache/imgpack-venv/bin/python -m pytest tests/interop -q
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import tarfile
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

import interop_util
from interop_util import IMAGE_EXTS, check_webdataset_checksums, copy_into, sniff_ext

SHARD_SIZE = 200_000  # bytes, passed as "200kB": several shards from ~60 small test images
PREFIX = "shard"
KEY_WIDTH = 8
IMAGE_FIELD = ";".join(IMAGE_EXTS)  # "jpg;png;webp;bmp;tiff;ppm;pgm"
BLOCK = 512


# --------------------------------------------------------------------------- running pack


def run(pack_bin: Path, *args) -> subprocess.CompletedProcess:
    cmd = [str(pack_bin), *(os.fspath(a) for a in args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=300)
    print(f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def pack_ok(pack_bin: Path, *args) -> subprocess.CompletedProcess:
    proc = run(pack_bin, *args)
    assert proc.returncode == 0, f"pack {' '.join(map(str, args))} exited {proc.returncode}\nstderr:\n{proc.stderr}"
    return proc


# --------------------------------------------------------------------------- the dataset under test


def source_tree_files() -> dict[str, str]:
    """~60 files over 4 classes (one with an upper-case and one with a non-ASCII name), every
    testdata format, nested sub-folders, spaces, a PNG named .JPEG and a relative path longer
    than the 100 bytes a plain ustar name field holds (the tar member names must stay short)."""
    testdata = interop_util.testdata_images()
    classes = ["Zebra", "ants", "bees", "été"]
    subdirs = ["", "sub/", "sub/deep/", "x y/"]
    files: dict[str, str] = {}
    for n in range(56):
        src = testdata[n % len(testdata)]
        files[f"{classes[n % 4]}/{subdirs[(n // 4) % 4]}img_{n:03d}{Path(src).suffix}"] = src
    files["ants/png_named.JPEG"] = "cat/png_named.JPEG"
    files["bees/ñandú 1.png"] = "space/alpha.png"
    files["été/" + "a_rather_long_directory_name/" * 4 + "file.jpg"] = "space/progressive.jpg"
    files["Zebra/z.webp"] = "space/hubble_small.webp"
    return files


@dataclass
class Packed:
    root: Path  # the ImageFolder source tree
    out: Path  # the WebDataset output directory
    classes: list  # torchvision's classes
    samples: list  # torchvision's samples as (relative path, label)
    tars: list  # shard paths, in order
    idxs: list  # the matching .idx paths
    meta: dict  # imgpack.json
    shardindex: dict  # shardindex.json
    index: list  # imgpack.index entries (interop_util.IndexEntry), every CRC checked

    @property
    def n(self) -> int:
        return len(self.samples)

    def source_bytes(self, i: int) -> bytes:
        return (self.root / self.samples[i][0]).read_bytes()

    def expected_fields(self, i: int) -> dict[str, bytes]:
        """The exact field -> bytes the sample i must have (json compared parsed)."""
        rel, label = self.samples[i]
        data = self.source_bytes(i)
        return {sniff_ext(data): data, "cls": str(label).encode("ascii")}


def torchvision_view(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    ds = ImageFolder(str(root), allow_empty=True)
    return ds.classes, [(Path(os.path.relpath(p, root)).as_posix(), c) for p, c in ds.samples]


def load_packed(root: Path, out: Path) -> Packed:
    classes, samples = torchvision_view(root)
    tars = sorted(out.glob(f"{PREFIX}-*.tar"))
    idxs = sorted(out.glob(f"{PREFIX}-*.idx"))
    assert tars, f"no {PREFIX}-*.tar in {out}: {sorted(p.name for p in out.iterdir())}"
    assert [t.name for t in tars] == [f"{PREFIX}-{k:06d}.tar" for k in range(len(tars))], [t.name for t in tars]
    assert [i.name for i in idxs] == [t.with_suffix(".idx").name for t in tars], [i.name for i in idxs]
    meta = json.loads((out / "imgpack.json").read_text(encoding="utf-8"))
    shardindex = json.loads((out / "shardindex.json").read_text(encoding="utf-8"))
    index = check_webdataset_checksums(out)
    return Packed(root, out, classes, samples, tars, idxs, meta, shardindex, index)


@pytest.fixture(scope="module")
def packed(tmp_path_factory, pack_bin) -> Packed:
    base = tmp_path_factory.mktemp("wds")
    root = copy_into(base / "src", source_tree_files())
    (root / "m_empty").mkdir()  # an empty class between others: later indices must not shift
    out = base / "out"
    pack_ok(pack_bin, "imagefolder", root, "--to", "webdataset", "-o", out, "--shard-size", "200kB")
    p = load_packed(root, out)
    # Sanity of the fixture itself.
    assert p.classes == ["Zebra", "ants", "bees", "m_empty", "été"]
    assert p.n == 60
    assert {sniff_ext(p.source_bytes(i)) for i in range(p.n)} == set(IMAGE_EXTS)
    assert len(p.tars) >= 4, f"expected several shards at --shard-size 200kB, got {len(p.tars)}"
    return p


def key(i: int) -> str:
    return str(i).zfill(KEY_WIDTH)


# --------------------------------------------------------------------------- 1) webdataset


def test_webdataset_reads_every_sample_in_order(packed):
    import webdataset as wds

    urls = [str(t) for t in packed.tars]

    # Raw pass: exact field sets and bytes.
    raw = list(wds.WebDataset(urls, shardshuffle=False, empty_check=True))
    assert [s["__key__"] for s in raw] == [key(i) for i in range(packed.n)]
    for i, s in enumerate(raw):
        fields = {k: v for k, v in s.items() if not k.startswith("__")}
        want = packed.expected_fields(i)
        assert sorted(fields) == sorted([*want, "json"]), f"sample {key(i)} has fields {sorted(fields)}"
        for ext, data in want.items():
            assert fields[ext] == data, f"sample {key(i)} ({packed.samples[i][0]}): field {ext} differs"
        shard = next(k for k, m in enumerate(packed.meta["shards"]) if m["first"] <= i < m["first"] + m["samples"])
        assert s["__url__"] == urls[shard], f"sample {key(i)} read from {s['__url__']}, expected {urls[shard]}"

    # Decoded pass, the usual training-loop form.
    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=True)
        .decode("pil")
        .to_tuple("__key__", IMAGE_FIELD, "cls", "json")
    )
    seen = 0
    for i, (k, img, cls, info) in enumerate(ds):
        rel, label = packed.samples[i]
        assert k == key(i)
        assert isinstance(img, Image.Image), f"sample {k}: image decoded to {type(img).__name__}"
        assert cls == label, f"sample {k} ({rel}): cls {cls}, torchvision {label}"
        assert info == {"path": rel, "class": packed.classes[label]}, f"sample {k}: json {info}"
        with Image.open(packed.root / rel) as ref:
            want = np.asarray(ref.convert("RGB"))
        got = np.asarray(img.convert("RGB"))
        assert got.shape == want.shape and np.array_equal(got, want), f"sample {k} ({rel}): pixels differ"
        seen += 1
    assert seen == packed.n


# --------------------------------------------------------------------------- 2) wids


def test_wids_random_access(packed, tmp_path):
    import wids
    from wids.wids import IndexedTarSamples
    from wids.wids_decode import default_decoder

    index = str(packed.out / "shardindex.json")
    cache = str(tmp_path / "wids-cache")
    ds = wids.ShardListDataset(index, cache_dir=cache, transformations=[])
    # wids' default decoding (cls -> int, json -> dict, jpg/png/ppm/pgm -> PIL; it leaves the
    # other image formats as bytes).
    decoded = wids.ShardListDataset(index, cache_dir=cache, transformations=partial(default_decoder, format="PIL"))
    assert len(ds) == len(decoded) == packed.n
    rng = random.Random(1234)
    indices = sorted({0, packed.n - 1, *rng.sample(range(packed.n), 20)})
    for i in indices:
        s = ds[i]
        rel, label = packed.samples[i]
        assert s["__key__"] == key(i), f"wids index {i} gave key {s['__key__']}"
        # wids names fields with their leading dot (".jpg") and hands out file objects.
        fields = {k: v for k, v in s.items() if not k.startswith("__")}
        assert all(k.startswith(".") for k in fields), sorted(fields)
        fields = {k[1:]: v.getvalue() for k, v in fields.items()}
        want = packed.expected_fields(i)
        assert sorted(fields) == sorted([*want, "json"]), f"sample {key(i)} has fields {sorted(fields)}"
        for ext, data in want.items():
            assert fields[ext] == data, f"wids sample {i} ({rel}): field {ext} differs"
        assert json.loads(fields["json"]) == {"path": rel, "class": packed.classes[label]}

        d = decoded[i]
        assert d["__key__"] == key(i)
        assert d[".cls"] == label, f"wids decoded sample {i}: cls {d['.cls']!r}, expected {label}"
        assert d[".json"] == {"path": rel, "class": packed.classes[label]}
        ext = sniff_ext(packed.source_bytes(i))
        if isinstance(d["." + ext], Image.Image):
            with Image.open(packed.root / rel) as ref:
                want_px = np.asarray(ref.convert("RGB"))
            assert np.array_equal(np.asarray(d["." + ext].convert("RGB")), want_px), f"wids sample {i}: pixels"
    # Out of range is an error, not a wrap-around.
    with pytest.raises(IndexError):
        ds[packed.n]
    ds.close()
    decoded.close()

    # ShardListDataset itself does not verify md5sum / nsamples (wids 0.1.11 never passes them
    # down); IndexedTarSamples does, so run each shard through it with the declared values (an
    # md5sum only with --md5: test_md5_is_opt_in_and_every_shard_has_a_crc32).
    for shard in packed.shardindex["shardlist"]:
        its = IndexedTarSamples(
            path=str(packed.out / shard["url"]), md5sum=shard.get("md5sum"), expected_size=shard["nsamples"]
        )
        try:
            assert len(its) == shard["nsamples"]
        finally:
            its.close()


# --------------------------------------------------------------------------- tar headers


def octal(field: bytes) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    assert re.fullmatch(rb"[0-7]+", text), f"not an octal number field: {field!r}"
    return int(text, 8)


@dataclass
class Header:
    offset: int  # of the header block
    name: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime: int
    typeflag: bytes


def parse_header(block: bytes, offset: int) -> Header:
    """A plain POSIX ustar header, strictly: checksum right, magic `ustar\\0` + version `00`,
    regular file, empty prefix (names fit the 100-byte name field)."""
    assert len(block) == BLOCK
    stored = octal(block[148:156])
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
    assert stored == computed, f"header at {offset}: checksum {stored} != computed {computed}"
    assert block[257:263] == b"ustar\0", f"header at {offset}: magic {block[257:263]!r} (not POSIX ustar)"
    assert block[263:265] == b"00", f"header at {offset}: version {block[263:265]!r}"
    typeflag = block[156:157]
    assert typeflag == b"0", f"header at {offset}: typeflag {typeflag!r} (only regular files allowed)"
    assert block[345:500].strip(b"\0") == b"", f"header at {offset}: non-empty prefix field"
    name_field = block[0:100]
    name = name_field.split(b"\0", 1)[0]
    assert name_field[len(name):].strip(b"\0") == b"", f"header at {offset}: garbage after the name"
    assert block[157:257].strip(b"\0") == b"", f"header at {offset}: has a link name"
    return Header(
        offset,
        name.decode("utf-8"),
        octal(block[124:136]),
        octal(block[100:108]),
        octal(block[108:116]),
        octal(block[116:124]),
        octal(block[136:148]),
        typeflag,
    )


def walk_tar(path: Path) -> list[Header]:
    """Every member header of a shard; asserts the archive ends with exactly two zero blocks
    right after the last member's padded data (no extra record padding)."""
    data = path.read_bytes()
    assert len(data) % BLOCK == 0, f"{path.name}: size {len(data)} is not a multiple of 512"
    headers = []
    off = 0
    while True:
        assert off + BLOCK <= len(data), f"{path.name}: no end-of-archive blocks"
        block = data[off : off + BLOCK]
        if block == bytes(BLOCK):
            break
        h = parse_header(block, off)
        headers.append(h)
        off += BLOCK + (h.size + BLOCK - 1) // BLOCK * BLOCK
        assert off <= len(data), f"{path.name}: member {h.name} runs past the end of the file"
    assert data[off:] == bytes(2 * BLOCK), (
        f"{path.name}: expected exactly 1024 zero bytes after the last member, got {len(data) - off} bytes"
    )
    return headers


MEMBER_RE = re.compile(r"(\d{%d})\.([a-z]+)" % KEY_WIDTH)


# --------------------------------------------------------------------------- 3) tar and GNU tar


def test_shards_are_plain_ustar(packed, tmp_path):
    member_count = 0
    for shard_no, tar_path in enumerate(packed.tars):
        headers = walk_tar(tar_path)
        assert headers, f"{tar_path.name} is empty"

        with tarfile.open(tar_path, mode="r:") as tf:
            assert tf.pax_headers == {}, f"{tar_path.name}: global PAX headers {tf.pax_headers}"
            members = tf.getmembers()
            names = [m.name for m in members]
            assert names == [h.name for h in headers], f"{tar_path.name}: tarfile and raw walk disagree"
            extracted = {}
            for m in members:
                assert m.type == tarfile.REGTYPE, f"{tar_path.name}:{m.name}: type {m.type!r}"
                assert m.pax_headers == {}, f"{tar_path.name}:{m.name}: PAX headers {m.pax_headers}"
                assert len(m.name.encode("utf-8")) <= 100 and MEMBER_RE.fullmatch(m.name), m.name
                assert (m.mtime, m.uid, m.gid, m.mode) == (0, 0, 0, 0o644), (
                    f"{tar_path.name}:{m.name}: mtime {m.mtime} uid {m.uid} gid {m.gid} mode {oct(m.mode)}"
                )
                extracted[m.name] = tf.extractfile(m).read()

        # Names are {key}.{ext}; fields of one sample adjacent and sorted by extension; keys
        # consecutive global sample indices, continuing from the previous shard.
        groups: list[tuple[str, list[str]]] = []
        for name in names:
            k, ext = MEMBER_RE.fullmatch(name).groups()
            if not groups or groups[-1][0] != k:
                assert k not in [g[0] for g in groups], f"{tar_path.name}: fields of sample {k} not adjacent"
                groups.append((k, []))
            groups[-1][1].append(ext)
        first = packed.meta["shards"][shard_no]["first"]
        assert [g[0] for g in groups] == [key(first + j) for j in range(len(groups))], (
            f"{tar_path.name}: keys {[g[0] for g in groups]}, expected from {key(first)}"
        )
        for k, exts in groups:
            i = int(k)
            assert exts == sorted(exts), f"sample {k}: fields not sorted by extension: {exts}"
            want = packed.expected_fields(i)
            assert sorted(exts) == sorted([*want, "json"]), f"sample {k} fields {exts}"
            for ext, data in want.items():
                assert extracted[f"{k}.{ext}"] == data, f"{tar_path.name}:{k}.{ext} differs from the source"
            rel, label = packed.samples[i]
            assert json.loads(extracted[f"{k}.json"]) == {"path": rel, "class": packed.classes[label]}
        member_count += len(names)

        # GNU tar: lists and extracts without a word on stderr.
        env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
        listing = subprocess.run(["tar", "-tvf", str(tar_path)], capture_output=True, text=True, env=env)
        assert listing.returncode == 0 and listing.stderr == "", f"tar -tvf {tar_path.name}: {listing.stderr}"
        lines = listing.stdout.splitlines()
        assert [line.split()[-1] for line in lines] == names
        for line in lines:
            assert line.startswith("-rw-r--r-- "), f"tar -tvf {tar_path.name}: {line!r}"
            assert " 1970-01-01 00:00 " in line, f"tar -tvf {tar_path.name}: {line!r}"
        dest = tmp_path / tar_path.stem
        dest.mkdir()
        x = subprocess.run(["tar", "-xf", str(tar_path), "-C", str(dest)], capture_output=True, text=True, env=env)
        assert x.returncode == 0 and x.stderr == "", f"tar -xf {tar_path.name}: {x.stderr}"
        on_disk = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        assert on_disk == extracted, f"tar -xf {tar_path.name} gave different files"

    assert member_count == 3 * packed.n


# --------------------------------------------------------------------------- 4) DALI


def dali_read_all(tars: list[Path], idxs: list[Path] | None, n: int, batch_size: int = 4):
    """One epoch of fn.readers.webdataset on the CPU: [(image bytes, cls bytes, source_info)]."""
    from nvidia.dali import fn, pipeline_def

    kwargs = {"index_paths": [str(i) for i in idxs]} if idxs is not None else {}

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe_def():
        image, cls = fn.readers.webdataset(
            paths=[str(t) for t in tars],
            ext=[IMAGE_FIELD, "cls"],
            missing_component_behavior="error",
            random_shuffle=False,
            name="reader",
            **kwargs,
        )
        return image, cls

    pipe = pipe_def()
    pipe.build()
    epoch = pipe.epoch_size("reader")
    assert epoch == n, f"DALI sees {epoch} samples, expected {n}"
    got = []
    while len(got) < n + batch_size:  # one batch into the next epoch: must restart at sample 0
        images, classes = pipe.run()
        for j in range(len(images)):
            img, cls = images.at(j), classes.at(j)
            assert img.dtype == np.uint8 and img.ndim == 1
            got.append((img.tobytes(), cls.tobytes(), images[j].source_info()))
    return got[:n], got[n:]


def test_dali_reads_through_our_index(packed):
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as e:
        pytest.fail(f"nvidia-dali is not installed in this venv ({e}); see tests/interop/requirements.txt")

    epoch, wrapped = dali_read_all(packed.tars, packed.idxs, packed.n)
    assert len(epoch) == packed.n
    for i, (image, cls, _) in enumerate(epoch):
        rel, label = packed.samples[i]
        assert image == packed.source_bytes(i), f"DALI sample {i} ({rel}): image bytes differ"
        assert cls == str(label).encode(), f"DALI sample {i} ({rel}): cls {cls!r}, expected {label}"
    assert [w[0] for w in wrapped] == [packed.source_bytes(i) for i in range(len(wrapped))], (
        "after one epoch DALI did not restart at sample 0"
    )

    # DALI's source_info is "<tar>:<data offset>:<member name>" of the image: compare it with
    # what DALI finds when it parses the tars itself (no index) -- same samples, same offsets.
    own, _ = dali_read_all(packed.tars, None, packed.n)
    assert [o[:2] for o in own] == [e[:2] for e in epoch]
    assert [o[2] for o in own] == [e[2] for e in epoch], "our .idx offsets differ from DALI's own tar parsing"
    for i, (_, _, info) in enumerate(epoch):
        assert info.endswith(f":{key(i)}.{sniff_ext(packed.source_bytes(i))}"), info


# --------------------------------------------------------------------------- 5) .idx checker


def check_dali_index(idx_path: Path, tar_path: Path) -> list[list[tuple[str, int, int, str]]]:
    """DALI's index v1.2 rules, checked independently of pack: returns the samples, each a list
    of (ext, data offset, size, member name)."""
    text = idx_path.read_bytes().decode("ascii")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a final newline is fine
    assert lines, f"{idx_path.name} is empty"
    head = lines[0].split()
    assert len(head) == 2 and head[0] == "v1.2" and head[1].isdigit(), f"{idx_path.name}: first line {lines[0]!r}"
    n = int(head[1])
    assert n > 0, f"{idx_path.name}: DALI requires a positive sample count"
    assert len(lines) == n + 1, f"{idx_path.name}: header says {n} samples, found {len(lines) - 1} lines"

    tar = tar_path.read_bytes()
    size = len(tar)
    samples = []
    seen_names = []
    last_offset = -1
    for line_no, line in enumerate(lines[1:], start=1):
        tokens = line.split()
        assert tokens and len(tokens) % 4 == 0, f"{idx_path.name}:{line_no}: {len(tokens)} tokens: {line!r}"
        components = []
        for c in range(0, len(tokens), 4):
            ext, off_s, size_s, name = tokens[c : c + 4]
            assert off_s.isdigit() and size_s.isdigit(), f"{idx_path.name}:{line_no}: {tokens[c:c + 4]}"
            off, length = int(off_s), int(size_s)
            assert off % BLOCK == 0, f"{idx_path.name}:{line_no}: offset {off} not a multiple of 512"
            assert off >= BLOCK and off + length <= size, f"{idx_path.name}:{line_no}: {off}+{length} > {size}"
            assert off > last_offset, f"{idx_path.name}:{line_no}: offsets not increasing"
            last_offset = off
            h = parse_header(tar[off - BLOCK : off], off - BLOCK)
            assert h.name == name, f"{idx_path.name}:{line_no}: header name {h.name!r} != {name!r}"
            assert h.size == length, f"{idx_path.name}:{line_no}: header size {h.size} != {length}"
            # DALI splits the extension at the first dot of the member's base name.
            assert name.split(".", 1)[1] == ext, f"{idx_path.name}:{line_no}: ext {ext!r} for {name!r}"
            components.append((ext, off, length, name))
            seen_names.append(name)
        assert len({c[3].split(".", 1)[0] for c in components}) == 1, f"{idx_path.name}:{line_no}: mixed keys"
        samples.append(components)

    members = [h.name for h in walk_tar(tar_path)]
    assert sorted(seen_names) == sorted(members) and len(set(seen_names)) == len(seen_names), (
        f"{idx_path.name}: idx components and tar members differ: "
        f"missing {sorted(set(members) - set(seen_names))[:5]}, extra {sorted(set(seen_names) - set(members))[:5]}"
    )
    return samples


def test_dali_index_files_follow_dali_rules(packed):
    all_samples = []
    for idx_path, tar_path in zip(packed.idxs, packed.tars):
        all_samples += check_dali_index(idx_path, tar_path)
    assert len(all_samples) == packed.n
    for i, components in enumerate(all_samples):
        names = [c[3] for c in components]
        assert all(nm.startswith(key(i) + ".") for nm in names), f"idx sample {i} is {names}"
        img = [c for c in components if c[0] in IMAGE_EXTS]
        assert len(img) == 1 and img[0][2] == len(packed.source_bytes(i)), f"idx sample {i}: {components}"


# --------------------------------------------------------------------------- 6) shard sizes, shardindex.json


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def check_shard_layout(p: Packed, limit: int, max_samples: int | None = None):
    index = p.shardindex
    assert index.get("__kind__") == "wids-shard-index-v1" and index.get("wids_version") == 1, index
    shardlist = index["shardlist"]
    assert len(shardlist) == len(p.tars)
    assert sum(s["nsamples"] for s in shardlist) == p.n
    for entry, tar_path in zip(shardlist, p.tars):
        url = entry["url"]
        assert "://" not in url and not Path(url).is_absolute(), f"url {url!r} is not relative"
        assert (p.out / url).resolve() == tar_path.resolve(), f"url {url!r} does not name {tar_path.name}"
        size = tar_path.stat().st_size
        assert entry["filesize"] == size, f"{url}: filesize {entry['filesize']} != {size}"
        if p.meta["options"].get("md5"):
            assert entry["md5sum"] == md5(tar_path), f"{url}: md5sum mismatch"
        else:
            assert "md5sum" not in entry, f"{url}: an md5sum without --md5"
        assert entry["nsamples"] > 0, f"{url}: empty shard"
        assert len(walk_tar(tar_path)) == 3 * entry["nsamples"]
        if max_samples is not None:
            assert entry["nsamples"] <= max_samples, f"{url}: {entry['nsamples']} samples > {max_samples}"
        if size > limit:
            assert entry["nsamples"] == 1, f"{url}: {size} bytes > --shard-size {limit} with several samples"

    # imgpack.json agrees.
    shards = p.meta["shards"]
    assert [s["name"] for s in shards] == [t.name for t in p.tars]
    assert [s["samples"] for s in shards] == [e["nsamples"] for e in shardlist]
    assert [s["first"] for s in shards] == list(np.cumsum([0] + [e["nsamples"] for e in shardlist])[:-1])
    assert [s["bytes"] for s in shards] == [e["filesize"] for e in shardlist]
    assert [s.get("md5") for s in shards] == [e.get("md5sum") for e in shardlist]
    # Format version 3: every shard's CRC-32, of the whole file, end-of-archive blocks included.
    assert p.meta["version"] == 3
    assert [s["crc32"] for s in shards] == [zlib.crc32(t.read_bytes()) for t in p.tars]
    assert p.meta["samples"] == p.n and p.meta["classes"] == p.classes


def sample_tar_bytes(p: Packed) -> list[int]:
    """What each sample occupies in its tar: a header and padded data per field."""
    per_key: dict[str, int] = {}
    for tar_path in p.tars:
        for h in walk_tar(tar_path):
            k = h.name.split(".", 1)[0]
            per_key[k] = per_key.get(k, 0) + BLOCK + (h.size + BLOCK - 1) // BLOCK * BLOCK
    return [per_key[key(i)] for i in range(p.n)]


def test_shard_size_limit_and_shardindex(packed):
    check_shard_layout(packed, SHARD_SIZE)
    for tar_path in packed.tars:
        assert tar_path.stat().st_size <= SHARD_SIZE, f"{tar_path.name} exceeds --shard-size 200kB"
    # Shards are filled: a shard is closed only because the next sample would not fit.
    shards = packed.meta["shards"]
    sizes = sample_tar_bytes(packed)
    for s, nxt in zip(shards, shards[1:]):
        assert s["bytes"] + sizes[nxt["first"]] > SHARD_SIZE, (
            f"{s['name']} ({s['bytes']} bytes) was closed although sample {nxt['first']} still fits"
        )


def test_oversized_samples_and_shard_samples(packed, tmp_path, pack_bin):
    # 20kB: the PNGs (~30 kB) are each bigger than a shard and get one of their own.
    out = tmp_path / "small"
    proc = pack_ok(pack_bin, "imagefolder", packed.root, "--to", "webdataset", "-o", out, "--shard-size", "20kB")
    small = load_packed(packed.root, out)
    check_shard_layout(small, 20_000)
    oversized = [s for s in small.meta["shards"] if s["bytes"] > 20_000]
    assert oversized, "the fixture should contain samples bigger than 20kB"
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line.lower()]
    for s in oversized:  # each one is announced on stderr, by its key
        assert any(key(s["first"]) in line for line in warnings), (
            f"no warning naming sample {key(s['first'])} ({s['name']}, {s['bytes']} bytes):\n{proc.stderr}"
        )

    out = tmp_path / "count"
    pack_ok(pack_bin, "imagefolder", packed.root, "--to", "webdataset", "-o", out, "--shard-samples", "7")
    counted = load_packed(packed.root, out)
    check_shard_layout(counted, 10**9, max_samples=7)
    assert [e["nsamples"] for e in counted.shardindex["shardlist"]] == [7] * 8 + [4]


def test_md5_is_opt_in_and_every_shard_has_a_crc32(packed, tmp_path, pack_bin):
    from wids.wids import IndexedTarSamples

    # The default fixture: a CRC-32 per shard (checked in check_shard_layout), no MD5 anywhere.
    assert all("md5" not in s for s in packed.meta["shards"]) and "md5" not in packed.meta["options"]
    assert all("md5sum" not in e for e in packed.shardindex["shardlist"])
    # --md5: wids' own check accepts every declared md5sum, and catches one flipped byte.
    out = tmp_path / "md5"
    pack_ok(pack_bin, "imagefolder", packed.root, "--to", "webdataset", "-o", out, "--shard-size", "200kB", "--md5")
    with_md5 = load_packed(packed.root, out)
    check_shard_layout(with_md5, 200_000)
    assert with_md5.meta["options"]["md5"] is True
    for e in with_md5.shardindex["shardlist"]:
        IndexedTarSamples(path=str(out / e["url"]), md5sum=e["md5sum"], expected_size=e["nsamples"]).close()
    first = with_md5.shardindex["shardlist"][0]
    shard = out / first["url"]
    data = bytearray(shard.read_bytes())
    data[700] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(AssertionError, match="MD5 sum mismatch"):
        IndexedTarSamples(path=str(shard), md5sum=first["md5sum"], expected_size=first["nsamples"])
    # The shard CRC-32 says so too, from the standard library alone.
    assert zlib.crc32(shard.read_bytes()) != with_md5.meta["shards"][0]["crc32"]


# --------------------------------------------------------------------------- 7) round trip


def all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_round_trip_through_lmdb(packed, tmp_path, pack_bin):
    lmdb_dir = tmp_path / "train.lmdb"
    wds_dir = tmp_path / "wds"
    tree2 = tmp_path / "tree2"
    pack_ok(pack_bin, packed.root, "--to", "lmdb", "-o", lmdb_dir)
    pack_ok(pack_bin, lmdb_dir, "--to", "webdataset", "-o", wds_dir, "--shard-size", "200kB")
    pack_ok(pack_bin, wds_dir, "--to", "imagefolder", "-o", tree2)

    # The WebDataset converted from LMDB holds the same shards as the one packed directly.
    for name in [t.name for t in packed.tars] + [i.name for i in packed.idxs] + ["shardindex.json"]:
        assert (wds_dir / name).read_bytes() == (packed.out / name).read_bytes(), f"{name} differs"
    # And the same sample index, CRCs included, but for the CRC of imgpack.json (bytes 12..16),
    # whose `source` differs.
    converted = load_packed(packed.root, wds_dir)
    assert converted.index == packed.index
    direct_index, converted_index = (bytearray((d / "imgpack.index").read_bytes()) for d in (packed.out, wds_dir))
    direct_index[12:16] = converted_index[12:16] = bytes(4)
    assert converted_index == direct_index, "imgpack.index differs beyond the CRC of imgpack.json"

    want, got = all_files(packed.root), all_files(tree2)
    assert sorted(got) == sorted(want), (
        f"missing {sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}"
    )
    for rel in want:
        assert got[rel] == want[rel], f"{rel}: bytes differ after the round trip"
    assert torchvision_view(tree2) == (packed.classes, packed.samples)


# --------------------------------------------------------------------------- the README snippet


def test_readme_webdataset_snippet(packed, tmp_path, monkeypatch):
    """The README's WebDataset snippet, run as written in a directory whose `shards/` is a copy
    of the packed output: it streams every sample in order and reads by index from the shards
    in place (cache_dir is their own directory: wids copies nothing into /tmp/_wids_cache)."""
    import shutil

    shutil.copytree(packed.out, tmp_path / "shards")
    monkeypatch.chdir(tmp_path)
    before = set((tmp_path / "shards").iterdir())
    names = interop_util.run_doc_snippet("README.md", "webdataset-snippet")
    labels = [int(cls) for _, cls in names["stream"]]
    assert labels == [label for _, label in packed.samples]
    ra = names["random_access"]
    assert len(ra) == packed.n
    for i in (0, packed.n // 2, packed.n - 1):
        sample = ra[i]  # wids' default decoding: cls -> int
        assert (sample["__key__"], sample[".cls"]) == (key(i), packed.samples[i][1])
    assert set((tmp_path / "shards").iterdir()) == before, "wids wrote into the shard directory"
