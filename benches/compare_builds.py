#!/usr/bin/env python3
"""Do two builds of `pack` write the same bytes? An A/B check for refactorings.

    python3 benches/compare_builds.py OLD_PACK NEW_PACK [--tree DIR] [--work DIR] [--only TEXT]
                                      [--keep] [--strict]

Packs `testdata/imagefolder` and a second tree (generated here, deterministic, unless `--tree`
names an existing ImageFolder tree) with both binaries, in every format, mode and conversion
that matters, each case with the same command line and the same `-o` path: the old binary
writes it, the result is moved aside, the new binary writes it again, and the two are compared:

* WebDataset and ImageFolder outputs (and plans) file by file, byte for byte, with the same
  names and permission bits; the first differing byte is located (tar member, JSON key);
* LMDB environments key by key: the same keys in the same order, every value equal (with the
  `lmdb` package when it imports, otherwise with the small read-only LMDB page parser below,
  which is cross-checked against the package whenever both are available);
* each command's exit code, and its `--json` stdout with the timing fields removed
  (`VOLATILE_JSON_KEYS`); stderr is compared too, a difference there is a note.

One line per case: `same`, or `DIFFERENT: <what>`, or `same records, but another LMDB page
layout: <sizes>` when every LMDB record is equal but `data.mdb` is not byte-identical (its page
layout depends on how many transactions the writer committed, which the format does not
promise: FORMAT.md and the README promise identical records), together with the summaries'
`bytes_out`, which is data.mdb's size. That third kind counts as different with `--strict`.
Not compared: modification times (every run writes its files anew). Exit status 0 when no case
differs, 1 when one does, 2 on a usage or setup error. Python 3.9+ standard library only (the
`lmdb` package is optional). About 1-2 minutes on 2 cores.
"""

import argparse
import hashlib
import json
import mmap
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

try:
    import lmdb  # optional: the pure-Python parser below is used without it
except ImportError:
    lmdb = None

REPO = Path(__file__).resolve().parent.parent
TESTDATA = "testdata/imagefolder"  # relative, as the README runs it: recorded in the metadata

# Keys of a --json summary that measure time and so differ between any two runs.
VOLATILE_JSON_KEYS = {"seconds", "files_per_second", "megabytes_per_second"}


# --------------------------------------------------------------------------------------------
# A read-only LMDB parser (64-bit LMDB 0.9 layout, one unnamed database without DUPSORT), for
# machines without the `lmdb` package. Pages: a 16-byte header (pgno u64, pad u16, flags u16,
# lower u16, upper u16 / overflow page count u32), then u16 offsets of the nodes. Meta pages
# 0 and 1 hold the main database's root; the one with the larger txnid is current.

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
PAGEHDRSZ = 16
P_INVALID = 0xFFFFFFFFFFFFFFFF


def lmdb_items_parsed(env_dir):
    """Yields (key, value) of the environment's main database in key order."""
    with open(Path(env_dir) / "data.mdb", "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        magic, _version = struct.unpack_from("<II", m, PAGEHDRSZ)
        if magic != 0xBEEFC0DE:
            raise ValueError(f"{env_dir}: not an LMDB data file (magic {magic:#x})")
        psize = struct.unpack_from("<I", m, PAGEHDRSZ + 24)[0]  # mm_dbs[FREE_DBI].md_pad
        best = None
        for i in (0, 1):
            base = i * psize
            (flags,) = struct.unpack_from("<H", m, base + 10)
            magic, _ = struct.unpack_from("<II", m, base + PAGEHDRSZ)
            if not flags & P_META or magic != 0xBEEFC0DE:
                raise ValueError(f"{env_dir}: meta page {i} is damaged")
            main_flags, _depth = struct.unpack_from("<HH", m, base + PAGEHDRSZ + 76)
            entries, root = struct.unpack_from("<QQ", m, base + PAGEHDRSZ + 104)
            (txnid,) = struct.unpack_from("<Q", m, base + PAGEHDRSZ + 128)
            if best is None or txnid > best[0]:
                best = (txnid, root, entries, main_flags)
        _txnid, root, entries, main_flags = best
        if main_flags & 0x04:  # MDB_DUPSORT
            raise ValueError(f"{env_dir}: DUPSORT databases are not supported by this parser")
        count = 0
        if root != P_INVALID:
            for item in _lmdb_walk(m, psize, root, env_dir):
                count += 1
                yield item
        if count != entries:
            raise ValueError(f"{env_dir}: parsed {count} records, the meta page counts {entries}")
    finally:
        m.close()


def _lmdb_walk(m, psize, pgno, env_dir):
    stack = [pgno]
    while stack:
        base = stack.pop() * psize
        flags, lower = struct.unpack_from("<HH", m, base + 10)
        n = (lower - PAGEHDRSZ) // 2
        ptrs = struct.unpack_from(f"<{n}H", m, base + PAGEHDRSZ)
        if flags & P_BRANCH:
            children = []
            for p in ptrs:
                lo, hi, fl = struct.unpack_from("<HHH", m, base + p)
                children.append(lo | hi << 16 | fl << 32)
            stack.extend(reversed(children))  # depth first, in key order
        elif flags & P_LEAF and not flags & P_LEAF2:
            for p in ptrs:
                lo, hi, fl, ksize = struct.unpack_from("<HHHH", m, base + p)
                key = m[base + p + 8 : base + p + 8 + ksize]
                data_at = base + p + 8 + ksize
                size = lo | hi << 16
                if fl & (F_SUBDATA | F_DUPDATA):
                    raise ValueError(f"{env_dir}: sub-databases are not supported by this parser")
                if fl & F_BIGDATA:
                    (ovpg,) = struct.unpack_from("<Q", m, data_at)
                    start = ovpg * psize + PAGEHDRSZ
                    yield key, m[start : start + size]
                else:
                    yield key, m[data_at : data_at + size]
        else:
            raise ValueError(f"{env_dir}: unexpected page flags {flags:#x} at page {base // psize}")


def lmdb_items_package(env_dir):
    env = lmdb.open(str(env_dir), readonly=True, lock=False, subdir=True, max_dbs=0)
    try:
        with env.begin(buffers=False) as txn:
            yield from txn.cursor().iternext(keys=True, values=True)
    finally:
        env.close()


def lmdb_items(env_dir):
    return lmdb_items_package(env_dir) if lmdb is not None else lmdb_items_parsed(env_dir)


def check_parser(env_dir):
    """With the package available, the parser must read exactly what the package reads."""
    if lmdb is None:
        return None
    a = lmdb_items_package(env_dir)
    b = lmdb_items_parsed(env_dir)
    for n, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"record {n}: package {x[0]!r}, parser {y[0]!r}"
    if next(a, None) is not None or next(b, None) is not None:
        return "record counts differ"
    return None


# --------------------------------------------------------------------------------------------
# Describing a difference.

def first_json_difference(a, b, path="$"):
    if type(a) is not type(b):
        return f"{path}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'new' if k not in a else 'old'}"
            d = first_json_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        if list(a) != list(b):
            return f"{path}: key order {list(a)} vs {list(b)}"
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_json_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        return None
    return None if a == b else f"{path}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"


def describe_bytes(a, b, name=""):
    """Where two byte strings first differ, in terms of their content when it is recognisable."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    where = f"{len(a)} vs {len(b)} bytes, first difference at byte {at}"
    try:
        ja, jb = json.loads(a), json.loads(b)
        d = first_json_difference(ja, jb)
        if d:
            return f"{where}; JSON {d}"
        return f"{where}; same JSON, different serialisation"
    except (ValueError, UnicodeDecodeError):
        pass
    if name.endswith(".tar"):
        try:
            import io

            with tarfile.open(fileobj=io.BytesIO(a)) as t:
                for member in t.getmembers():
                    end = member.offset_data + ((member.size + 511) // 512) * 512
                    if member.offset <= at < end:
                        part = "header" if at < member.offset_data else "data (or padding)"
                        return f"{where}, in the {part} of tar member {member.name!r}"
            return f"{where}, after the last tar member"
        except tarfile.TarError:
            pass
    return where


# --------------------------------------------------------------------------------------------
# Comparing two outputs.

def entries(root):
    """{relative path: (kind, mode bits)} of everything under root (root itself excluded)."""
    out = {}
    root = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
            out[os.path.relpath(full, root)] = (kind, stat.S_IMODE(st.st_mode))
    return out


def shown(rel):
    return os.fsdecode(rel).encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")


def compare_lmdb(old_env, new_env, notes, layouts):
    diffs = []
    ia, ib = lmdb_items(old_env), lmdb_items(new_env)
    a, b = next(ia, None), next(ib, None)
    records = 0
    while a is not None or b is not None:
        if len(diffs) >= 5:
            diffs.append("...")
            break
        if b is None or (a is not None and a[0] < b[0]):
            diffs.append(f"key {a[0].decode(errors='replace')} only in old")
            a = next(ia, None)
        elif a is None or b[0] < a[0]:
            diffs.append(f"key {b[0].decode(errors='replace')} only in new")
            b = next(ib, None)
        else:
            if a[1] != b[1]:
                diffs.append(f"value of {a[0].decode(errors='replace')}: {describe_bytes(a[1], b[1])}")
            records += 1
            a, b = next(ia, None), next(ib, None)
    for env in (old_env, new_env):
        problem = check_parser(env)
        if problem:
            raise RuntimeError(f"the LMDB parser disagrees with the lmdb package on {env}: {problem}")
    if not diffs:
        fa, fb = Path(old_env) / "data.mdb", Path(new_env) / "data.mdb"
        if file_digest(fa) == file_digest(fb):
            notes.append(f"{records} LMDB records equal, data.mdb byte-identical")
        else:
            notes.append(f"{records} LMDB records equal")
            layouts.append((fa.stat().st_size, fb.stat().st_size))
    return diffs


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def compare_trees(old, new, notes, layouts):
    """Differences between two output trees, as strings; LMDB environments key by key.

    An environment whose records are all equal but whose data.mdb differs is not a difference:
    it is appended to `layouts` as (old data.mdb size, new data.mdb size)."""
    diffs = []
    ea, eb = entries(old), entries(new)
    for rel in sorted(set(ea) | set(eb)):
        if rel not in eb:
            diffs.append(f"{shown(rel)} only in old")
        elif rel not in ea:
            diffs.append(f"{shown(rel)} only in new")
        elif ea[rel] != eb[rel]:
            diffs.append(f"{shown(rel)}: {ea[rel][0]} mode {ea[rel][1]:o} vs {eb[rel][0]} mode {eb[rel][1]:o}")
    envs = sorted({os.path.dirname(r) for r in ea if os.path.basename(r) == b"data.mdb" and r in eb})
    for env in envs:
        label = shown(env) or "."
        found = []
        diffs += [f"LMDB {label}: {d}" for d in compare_lmdb(Path(os.fsdecode(old)) / os.fsdecode(env),
                                                            Path(os.fsdecode(new)) / os.fsdecode(env), notes, found)]
        layouts += [(label, a, b) for a, b in found]
    for rel in sorted(set(ea) & set(eb)):
        kind = ea[rel][0]
        if kind != eb[rel][0] or kind == "dir":
            continue
        pa, pb = os.path.join(os.fsencode(old), rel), os.path.join(os.fsencode(new), rel)
        if kind == "link":
            if os.readlink(pa) != os.readlink(pb):
                diffs.append(f"{shown(rel)}: symlink targets differ")
            continue
        if os.path.dirname(rel) in envs and os.path.basename(rel) in (b"data.mdb", b"lock.mdb"):
            continue  # data.mdb compared by key; lock.mdb is LMDB's reader table, not data
        if os.path.getsize(pa) != os.path.getsize(pb) or file_digest(pa) != file_digest(pb):
            with open(pa, "rb") as fa, open(pb, "rb") as fb:
                da, db = fa.read(), fb.read()
            diffs.append(f"{shown(rel)}: {describe_bytes(da, db, os.fsdecode(rel))}")
    files = sum(1 for e in ea.values() if e[0] == "file")
    notes.insert(0, f"{files} files")
    return diffs


def strip_keys(value, keys):
    if isinstance(value, dict):
        return {k: strip_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [strip_keys(v, keys) for v in value]
    return value


def parse_stdout(text, keys=VOLATILE_JSON_KEYS):
    out = []
    for line in text.splitlines():
        try:
            out.append(strip_keys(json.loads(line), keys))
        except ValueError:
            out.append(line)
    return out


# --------------------------------------------------------------------------------------------
# The generated tree: PNG, PPM/PGM, BMP and TIFF written by hand, copies of the testdata
# photos (some with an EXIF orientation added), bad files, odd names, symlinks, an empty class.

def png_bytes(w, h, color_type, depth, pixel, rng, interlace=False, palette=None):
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]

    def rows(pw, ph, xs, ys, xstep, ystep):
        for y in range(ph):
            yy = ys + y * ystep
            line = bytearray([rng.randrange(5)])  # any filter type is valid on any data
            for x in range(pw):
                v = pixel(xs + x * xstep, yy)
                for c in range(channels):
                    s = (v[c % len(v)] + 37 * c) & 0xFF if color_type != 3 else v[0] % len(palette)
                    line += bytes([s, (s * 7) & 0xFF]) if depth == 16 else bytes([s])
            yield bytes(line)

    if interlace:
        raw = b""
        for xs, ys, xstep, ystep in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                                     (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
            pw, ph = max(0, -(-(w - xs) // xstep)), max(0, -(-(h - ys) // ystep))
            if pw and ph:
                raw += b"".join(rows(pw, ph, xs, ys, xstep, ystep))
    else:
        raw = b"".join(rows(w, h, 0, 0, 1, 1))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace)))
    if palette:
        out += chunk(b"PLTE", b"".join(bytes(p) for p in palette))
    return out + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def pnm_bytes(w, h, grey, depth16, pixel):
    channels = 1 if grey else 3
    header = f"P{5 if grey else 6}\n# made by compare_builds.py\n{w} {h}\n{65535 if depth16 else 255}\n"
    body = bytearray()
    for y in range(h):
        for x in range(w):
            v = pixel(x, y)
            for c in range(channels):
                s = v[c % len(v)]
                body += bytes([s, 255 - s]) if depth16 else bytes([s])
    return header.encode() + bytes(body)


def bmp_bytes(w, h, pixel):
    row = (w * 3 + 3) // 4 * 4
    body = bytearray()
    for y in reversed(range(h)):  # bottom-up
        line = bytearray()
        for x in range(w):
            r, g, b = (pixel(x, y) * 3)[:3]
            line += bytes([b, g, r])
        body += line + b"\0" * (row - len(line))
    header = b"BM" + struct.pack("<IHHI", 54 + len(body), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(body), 2835, 2835, 0, 0)
    return header + info + bytes(body)


def tiff_bytes(w, h, pixel):
    data = bytes(c for y in range(h) for x in range(w) for c in (pixel(x, y) * 3)[:3])
    entries = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 3, 8 + 2 + 12 * 10 + 4), (259, 3, 1, 1),
               (262, 3, 1, 2), (273, 4, 1, 8 + 2 + 12 * 10 + 4 + 6), (277, 3, 1, 3), (278, 3, 1, h),
               (279, 4, 1, len(data)), (284, 3, 1, 1)]
    ifd = struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        ifd += struct.pack("<HHI", tag, kind, count) + (struct.pack("<HH", value, 0) if kind == 3 and count == 1 else struct.pack("<I", value))
    return b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + struct.pack("<HHH", 8, 8, 8) + data


def with_exif_orientation(jpeg, orientation):
    tiff = b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack("<I", 0)
    payload = b"Exif\0\0" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def generate_tree(root, seed=20261201):
    """A few hundred small images in 14 classes; the same bytes every time."""
    rng = random.Random(seed)
    if root.exists():
        shutil.rmtree(root)
    classes = [f"n{1440764 + 1000 * i:08d}" for i in range(10)] + ["Ünï cödé", "nested", "zz_empty"]
    for c in classes:
        (root / c).mkdir(parents=True)
    (root / "nested" / "a" / "b").mkdir(parents=True)
    testdata = sorted(p for p in (REPO / TESTDATA).rglob("*") if p.is_file())
    bad = sorted((REPO / "testdata" / "bad").glob("*"))
    n = 0

    def put(cls, name, data):
        nonlocal n
        path = root / cls / name
        path.write_bytes(data)
        n += 1
        return path

    def pattern():
        kx, ky, kxy, off = rng.randrange(1, 9), rng.randrange(1, 9), rng.randrange(0, 5), rng.randrange(256)
        return lambda x, y: ((x * kx + y * ky + ((x * y) >> kxy) + off) & 0xFF,
                             (x * ky ^ y * kx) & 0xFF, (off + 3 * x - 2 * y) & 0xFF)

    image_classes = classes[:11]
    # Copies of the real photos, several per class, some with upper-case extensions.
    for i, src in enumerate(testdata * 6):
        cls = image_classes[i % len(image_classes)]
        ext = src.suffix.upper() if i % 5 == 0 else src.suffix
        put(cls, f"{cls}_{i:05d}{ext}", src.read_bytes())
    # Hand-made PNGs of every colour type, some 16-bit, some interlaced, sizes 1-150 px.
    for i in range(120):
        w, h = rng.randrange(1, 150), rng.randrange(1, 150)
        color_type = [0, 2, 3, 4, 6][i % 5]
        depth = 16 if color_type != 3 and i % 7 == 0 else 8
        palette = [(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(rng.randrange(2, 256))] if color_type == 3 else None
        data = png_bytes(w, h, color_type, depth, pattern(), rng, interlace=i % 6 == 1, palette=palette)
        cls = "nested/a/b" if i % 9 == 0 else image_classes[i % len(image_classes)]
        put(cls, f"gen_{i:04d}.png", data)
    for i in range(30):
        w, h = rng.randrange(2, 120), rng.randrange(2, 120)
        grey, depth16 = i % 2 == 1, i % 5 == 0
        put(image_classes[(i * 3) % 11], f"pnm_{i:04d}.{'pgm' if grey else 'ppm'}", pnm_bytes(w, h, grey, depth16, pattern()))
    for i in range(15):
        put(image_classes[(i * 7) % 11], f"bmp_{i:04d}.bmp", bmp_bytes(rng.randrange(1, 100), rng.randrange(1, 100), pattern()))
    for i in range(10):
        put(image_classes[(i * 5) % 11], f"tif_{i:04d}.tif", tiff_bytes(rng.randrange(1, 80), rng.randrange(1, 80), pattern()))
    jpegs = [p for p in testdata if p.suffix == ".jpg"]
    for orientation in range(1, 9):
        put("nested/a", f"exif_{orientation}.jpg", with_exif_orientation(jpegs[orientation].read_bytes(), orientation))
    # Files that are skipped, with their reasons: the testdata bad files, a PNG cut short,
    # a PNG whose header claims more pixels than --max-pixels, a file with a wrong name.
    for i, b in enumerate(bad):
        put(image_classes[i % 11], f"bad_{b.name}", b.read_bytes())
    whole = png_bytes(40, 30, 2, 8, pattern(), rng)
    put("n01441764", "cut_short.png", whole[: len(whole) // 2])
    huge = png_bytes(8, 8, 0, 8, pattern(), rng)
    put("n01442764", "huge_header.png", huge[:16] + struct.pack(">II", 20000, 10000) + huge[24:29]
        + struct.pack(">I", zlib.crc32(b"IHDR" + struct.pack(">II", 20000, 10000) + huge[24:29])) + huge[33:])
    put("n01443764", "png_named.JPEG", whole)
    # Not samples: non-image extensions, files in the root.
    (root / "README.txt").write_text("not a sample\n")
    (root / "stray.jpg").write_bytes(jpegs[0].read_bytes())
    (root / "n01444764" / "notes.txt").write_text("not an image\n")
    # A name that is not UTF-8, a symlink to a file, a symlinked directory, a dangling link,
    # a symlink loop.
    with open(os.path.join(os.fsencode(root / "n01445764"), b"caf\xe9_latin1.png"), "wb") as f:
        f.write(png_bytes(20, 20, 2, 8, pattern(), rng))
    os.symlink("../n01440764/gen_0011.png", root / "n01446764" / "link_to_gen.png")
    os.symlink("../nested/a/b", root / "n01447764" / "linked_dir")
    os.symlink("does_not_exist.png", root / "n01448764" / "dangling.png")
    os.symlink("..", root / "nested" / "a" / "loop")
    return n


def tree_bytes(root):
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink())


# --------------------------------------------------------------------------------------------
# The cases.

def cases(sources, work):
    """(name, [argument lists], output kind) per case; PACK stands for the binary."""
    inp = work / "inputs"
    out = []
    modes = [
        ("passthrough", []),
        ("reencode", ["--mode", "reencode", "--resize-shorter", "64", "--quality", "90"]),
        ("reencode-maxside", ["--mode", "reencode", "--max-side", "48", "--keep-if-fits", "--subsampling", "444",
                              "--quality", "75", "--resize-filter", "bilinear", "--exif-rotate"]),
        ("decode", ["--mode", "decode", "--resize-shorter", "64", "--center-crop", "56"]),
        ("decode-zstd", ["--mode", "decode", "--resize-shorter", "64", "--center-crop", "56", "--compress", "zstd"]),
        ("decode-keep", ["--mode", "decode", "--max-side", "40", "--upscale", "--color", "keep", "--compress", "zstd:9",
                         "--resize-filter", "bilinear", "--exif-rotate"]),
        ("decode-full", ["--mode", "decode"]),
    ]
    common = ["-q", "--json"]
    for label, src, shard in sources:
        wds = ["--shard-size", shard]
        for mode, flags in modes:
            out.append((f"{label}: imagefolder -> lmdb, {mode}",
                        [["imagefolder", src, "--to", "lmdb", "-o", "{OUT}/out.lmdb", *flags, *common]]))
            out.append((f"{label}: imagefolder -> webdataset, {mode}",
                        [["imagefolder", src, "--to", "webdataset", "-o", "{OUT}/out.wds", *wds, *flags, *common]]))
        for fmt, extra in (("lmdb", []), ("webdataset", wds)):
            out.append((f"{label}: imagefolder -> {fmt}, --shuffle --seed 7",
                        [["imagefolder", src, "--to", fmt, "-o", "{OUT}/out", *extra, "--shuffle", "--seed", "7", *common]]))
            out.append((f"{label}: imagefolder -> {fmt}, --threads 1, reencode",
                        [["imagefolder", src, "--to", fmt, "-o", "{OUT}/out", *extra, "--threads", "1", *modes[1][1], *common]]))
        out += [
            (f"{label}: imagefolder -> webdataset, --shard-samples 7 --prefix train",
             [["imagefolder", src, "--to", "webdataset", "-o", "{OUT}/out.wds", "--shard-samples", "7", "--prefix", "train", *common]]),
            (f"{label}: imagefolder -> webdataset, --shuffle --seed 7, decode-zstd",
             [["imagefolder", src, "--to", "webdataset", "-o", "{OUT}/out.wds", *wds, "--shuffle", "--seed", "7", *modes[4][1], *common]]),
            (f"{label}: imagefolder -> lmdb, --checkpoint-bytes 64KiB",
             [["imagefolder", src, "--to", "lmdb", "-o", "{OUT}/out.lmdb", "--checkpoint-bytes", "64KiB", *common]]),
            (f"{label}: imagefolder -> lmdb, --extensions png,PPM --on-error skip",
             [["imagefolder", src, "--to", "lmdb", "-o", "{OUT}/out.lmdb", "--extensions", "png,PPM", *common]]),
            (f"{label}: imagefolder -> imagefolder",
             [["imagefolder", src, "--to", "imagefolder", "-o", "{OUT}/out", *common]]),
            (f"{label}: imagefolder -> lmdb, --on-error fail",
             [["imagefolder", src, "--to", "lmdb", "-o", "{OUT}/out.lmdb", "--on-error", "fail", *common]]),
            (f"{label}: source kind detected (pack SRC) -> lmdb",
             [[src, "--to", "lmdb", "-o", "{OUT}/out.lmdb", *common]]),
            # Conversions, all from the same input (packed once by the old binary, see main()).
            (f"{label}: lmdb -> webdataset", [[f"{inp}/{label}.lmdb", "--to", "webdataset", "-o", "{OUT}/out.wds", *wds, *common]]),
            (f"{label}: lmdb -> webdataset, reencode",
             [[f"{inp}/{label}.lmdb", "--to", "webdataset", "-o", "{OUT}/out.wds", *wds, *modes[1][1], *common]]),
            (f"{label}: lmdb -> lmdb, decode", [[f"{inp}/{label}.lmdb", "--to", "lmdb", "-o", "{OUT}/out.lmdb", *modes[3][1], *common]]),
            (f"{label}: lmdb -> imagefolder", [[f"{inp}/{label}.lmdb", "--to", "imagefolder", "-o", "{OUT}/tree", *common]]),
            (f"{label}: webdataset -> imagefolder", [[f"{inp}/{label}.wds", "--to", "imagefolder", "-o", "{OUT}/tree", *common]]),
            (f"{label}: webdataset -> lmdb", [[f"{inp}/{label}.wds", "--to", "lmdb", "-o", "{OUT}/out.lmdb", *common]]),
            (f"{label}: webdataset -> webdataset, --shuffle --seed 7 --shard-samples 5",
             [[f"{inp}/{label}.wds", "--to", "webdataset", "-o", "{OUT}/out.wds", "--shuffle", "--seed", "7", "--shard-samples", "5", *common]]),
            (f"{label}: webdataset -> lmdb, decode-zstd",
             [[f"{inp}/{label}.wds", "--to", "lmdb", "-o", "{OUT}/out.lmdb", *modes[4][1], *common]]),
            (f"{label}: decoded lmdb -> webdataset",
             [[f"{inp}/{label}-decoded.lmdb", "--to", "webdataset", "-o", "{OUT}/out.wds", *wds, *common]]),
            (f"{label}: decoded lmdb -> imagefolder (every sample skipped)",
             [[f"{inp}/{label}-decoded.lmdb", "--to", "imagefolder", "-o", "{OUT}/tree", *common]]),
            # Plans, and packing a plan (the same plan file for both binaries).
            (f"{label}: pack plan", [["plan", src, "-o", "{OUT}/src.plan", *common]]),
            (f"{label}: pack plan --shuffle --seed 7 --extensions jpg,png",
             [["plan", src, "-o", "{OUT}/src.plan", "--shuffle", "--seed", "7", "--extensions", "jpg,png", *common]]),
            (f"{label}: plan -> lmdb", [[f"{inp}/{label}.plan", "--to", "lmdb", "-o", "{OUT}/out.lmdb", *common]]),
            (f"{label}: plan -> webdataset", [[f"{inp}/{label}.plan", "--to", "webdataset", "-o", "{OUT}/out.wds", *wds, *common]]),
            (f"{label}: shuffled plan -> webdataset, reencode",
             [[f"{inp}/{label}-shuffled.plan", "--to", "webdataset", "-o", "{OUT}/out.wds", *wds, *modes[1][1], *common]]),
            # Parts and merges.
            (f"{label}: plan --part K/3 -> webdataset, then merge",
             [[f"{inp}/{label}.plan", "--part", f"{k}/3", "--to", "webdataset", "-o", "{OUT}/parts", *wds, *common] for k in range(3)]
             + [["merge", "{OUT}/parts", *common]]),
            (f"{label}: plan --part K/3 -> webdataset, parts only",
             [[f"{inp}/{label}.plan", "--part", f"{k}/3", "--to", "webdataset", "-o", "{OUT}/parts", *wds, *common] for k in range(3)]),
            (f"{label}: plan --part K/2 -> lmdb, then merge",
             [[f"{inp}/{label}.plan", "--part", f"{k}/2", "--to", "lmdb", "-o", "{OUT}/parts", *common] for k in range(2)]
             + [["merge", "{OUT}/parts", *common]]),
            (f"{label}: plan --part K/3 -> lmdb reencode, then merge --keep-parts",
             [[f"{inp}/{label}.plan", "--part", f"{k}/3", "--to", "lmdb", "-o", "{OUT}/parts", *modes[1][1], *common] for k in range(3)]
             + [["merge", "{OUT}/parts", "--keep-parts", *common]]),
            # Verification reports (nothing written; stdout and exit code compared).
            (f"{label}: verify lmdb", [["verify", f"{inp}/{label}.lmdb", *common]]),
            (f"{label}: verify webdataset --decode", [["verify", f"{inp}/{label}.wds", "--decode", *common]]),
            (f"{label}: verify damaged lmdb", [["verify", f"{inp}/{label}-damaged.lmdb", *common]]),
            (f"{label}: verify damaged webdataset", [["verify", f"{inp}/{label}-damaged.wds", *common]]),
        ]
    return out


def run(binary, argv, out_dir, cwd):
    args = [binary] + [a.replace("{OUT}", str(out_dir)) for a in argv]
    p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, errors="backslashreplace")
    return p.returncode, p.stdout, p.stderr


def make_inputs(old, label, src, shard, work):
    """The common inputs of the conversion, plan and verify cases, written by the old binary."""
    inp = work / "inputs"
    inp.mkdir(parents=True, exist_ok=True)
    steps = [
        ["imagefolder", src, "--to", "lmdb", "-o", f"{inp}/{label}.lmdb", "-q"],
        ["imagefolder", src, "--to", "webdataset", "-o", f"{inp}/{label}.wds", "--shard-size", shard, "-q"],
        ["imagefolder", src, "--to", "lmdb", "-o", f"{inp}/{label}-decoded.lmdb", "--mode", "decode", "--max-side", "32", "-q"],
        ["plan", src, "-o", f"{inp}/{label}.plan", "-q"],
        ["plan", src, "-o", f"{inp}/{label}-shuffled.plan", "--shuffle", "--seed", "7", "-q"],
    ]
    for argv in steps:
        code, _, err = run(old, argv, inp, REPO)
        if code not in (0, 3):
            fail(f"setting up the inputs: {' '.join(argv)} exited {code}: {err.strip()}")
    # Damaged copies: one byte of an image flipped (sample 5's, or the first copy of its bytes).
    shutil.copytree(inp / f"{label}.lmdb", inp / f"{label}-damaged.lmdb")
    value = next(v for k, v in lmdb_items(inp / f"{label}.lmdb") if k.startswith(b"00000005.") and not k.endswith((b".cls", b".json")))
    data = bytearray((inp / f"{label}-damaged.lmdb" / "data.mdb").read_bytes())
    at = data.find(value)
    assert at >= 0, "sample 5's value not found in data.mdb"
    at += len(value) // 2
    data[at] ^= 0x10
    (inp / f"{label}-damaged.lmdb" / "data.mdb").write_bytes(bytes(data))
    shutil.copytree(inp / f"{label}.wds", inp / f"{label}-damaged.wds")
    for shard in sorted((inp / f"{label}-damaged.wds").glob("*.tar")):
        with tarfile.open(shard) as t:
            member = next((m for m in t.getmembers() if m.name.startswith("00000005.")
                           and m.name.rsplit(".", 1)[1] not in ("cls", "json")), None)
        if member is not None:
            data = bytearray(shard.read_bytes())
            data[member.offset_data + member.size // 2] ^= 0x10
            shard.write_bytes(bytes(data))
            break


def fail(message):
    print(f"compare_builds.py: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="the old `pack` binary")
    ap.add_argument("new", help="the new `pack` binary")
    ap.add_argument("--tree", help="an existing ImageFolder tree to pack as the second source "
                    "(default: generate one under WORK/gen-tree)")
    ap.add_argument("--work", default=str(REPO / "bench-out" / "compare_builds"),
                    help="scratch directory, emptied first (default bench-out/compare_builds)")
    ap.add_argument("--only", help="run only the cases whose name contains this text")
    ap.add_argument("--keep", action="store_true", help="keep the outputs (WORK/old, WORK/new)")
    ap.add_argument("--strict", action="store_true", help="count an LMDB whose records are all equal "
                    "but whose data.mdb is not byte-identical (and so the summaries' bytes_out) as different")
    args = ap.parse_args()

    old, new = (str(Path(b).resolve()) for b in (args.old, args.new))
    for b in (old, new):
        if not os.access(b, os.X_OK):
            fail(f"{b}: not an executable")
    work = Path(args.work).resolve()
    marker = work / ".compare_builds-work"
    if work.exists() and any(work.iterdir()) and not marker.exists():
        fail(f"--work {work} exists and was not made by this script; give an empty or new directory")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    marker.touch()

    versions = [subprocess.run([b, "--version"], capture_output=True, text=True).stdout.strip() for b in (old, new)]
    print(f"old: {old} ({versions[0]}, sha256 {file_digest(old).hex()[:12]})")
    print(f"new: {new} ({versions[1]}, sha256 {file_digest(new).hex()[:12]})")
    if versions[0] != versions[1]:
        print("NOTE: the version strings differ, so will every recorded `tool` field")
    print(f"LMDB read with: {'the lmdb package ' + lmdb.__version__ + ' (and the parser, cross-checked)' if lmdb else 'the built-in parser (no lmdb package)'}")
    print(f"ignored in --json output: {', '.join(sorted(VOLATILE_JSON_KEYS))}; not compared: mtimes")
    print("LMDB: same records with another data.mdb page layout is "
          + ("DIFFERENT (--strict)" if args.strict else "reported on its own line, not counted as different (--strict counts it)"))

    if args.tree:
        tree = Path(args.tree).resolve()
        if not tree.is_dir():
            fail(f"--tree {tree}: not a directory")
        print(f"second source: {tree} (given)")
    else:
        tree = work / "gen-tree"
        n = generate_tree(tree)
        print(f"second source: {tree} (generated: {n} files, {tree_bytes(tree) / 1e6:.1f} MB)")
    sources = [("testdata", TESTDATA, "100kB"),
               ("tree", str(tree), f"{max(50, tree_bytes(tree) // 6 // 1000)}kB")]
    for label, src, shard in sources:
        make_inputs(old, label, src, shard, work)

    differ = layout_only = ran = 0
    for name, steps in cases(sources, work):
        if args.only and args.only not in name:
            continue
        ran += 1
        slug = "".join(c if c.isalnum() else "_" for c in name)
        run_dir, old_dir, new_dir = work / "run" / slug, work / "old" / slug, work / "new" / slug
        results = {}
        for side, binary, keep_as in (("old", old, old_dir), ("new", new, new_dir)):
            run_dir.mkdir(parents=True)
            results[side] = [run(binary, argv, run_dir, REPO) for argv in steps]
            keep_as.parent.mkdir(parents=True, exist_ok=True)
            os.rename(run_dir, keep_as)  # the next side writes to the same -o path
        diffs, notes, layouts, sizes = [], [], [], []
        try:
            diffs += compare_trees(old_dir, new_dir, notes, layouts)
        except Exception as e:  # a bug of this script, or an unreadable output: say so
            diffs.append(f"comparison failed: {type(e).__name__}: {e}")
        for i, ((ca, oa, ea), (cb, ob, eb)) in enumerate(zip(results["old"], results["new"])):
            step = f"step {i + 1} ({steps[i][0]} ...)" if len(steps) > 1 else "command"
            if ca != cb:
                diffs.append(f"{step} exit code {ca} vs {cb}")
            ja, jb = parse_stdout(oa), parse_stdout(ob)
            if ja != jb:
                d = first_json_difference(ja, jb) or "stdout differs"
                # An LMDB summary's bytes_out is the size of data.mdb: it follows the layout.
                if layouts and parse_stdout(oa, VOLATILE_JSON_KEYS | {"bytes_out"}) == parse_stdout(ob, VOLATILE_JSON_KEYS | {"bytes_out"}):
                    sizes.append(f"{step} bytes_out {d.split(': ', 1)[1]}")
                else:
                    diffs.append(f"{step} stdout {d}")
            if ea != eb:
                notes.append(f"{step} stderr differs: {ea.strip()[:200]!r} vs {eb.strip()[:200]!r}")
        codes = sorted({c for c, _, _ in results["old"]})
        notes.append(f"exit {','.join(map(str, codes))}")
        layout = ", ".join(f"{env}/data.mdb {a} vs {b} bytes" for env, a, b in layouts)
        if sizes:
            layout += "; so the summary's " + ", ".join(sizes)
        if args.strict and layouts:
            diffs.append(f"LMDB page layout: {layout}")
        if diffs:
            differ += 1
            print(f"{name}: DIFFERENT: {'; '.join(diffs)} ({'; '.join(notes)})")
        elif layouts:
            layout_only += 1
            print(f"{name}: same records, but another LMDB page layout: {layout} ({'; '.join(notes)})")
        else:
            print(f"{name}: same ({'; '.join(notes)})")
        if not args.keep:
            shutil.rmtree(old_dir)
            shutil.rmtree(new_dir)
        sys.stdout.flush()
    if not args.keep:
        shutil.rmtree(work)
    print(f"{ran} cases: {ran - differ - layout_only} same, {layout_only} with every LMDB record equal "
          f"but another data.mdb page layout, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
