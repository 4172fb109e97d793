#!/usr/bin/env python3
"""Benchmark `pack imagefolder` (to LMDB and to WebDataset) against durable tar and plain Python scripts.

See benches/README.md for what it measures and how to read the results. In short:

    cargo build --release
    ~/.cache/imgpack-venv/bin/python benches/pack_vs_tar.py            # 15,000 images, 3 rounds
    ~/.cache/imgpack-venv/bin/python benches/pack_vs_tar.py --quick    # smoke test

1. Generates (once; cached, resumable) a deterministic ImageNet-like ImageFolder tree of JPEGs
   of 80-110 kB each under --tree, in parallel over --jobs processes.
2. Reads the whole tree once (untimed) so every timed run starts from a warm page cache.
3. Runs, alternating them, for --rounds rounds, into the same output directory:
     pack    : pack imagefolder TREE --to lmdb -o OUT/pack.lmdb --overwrite --quiet --json
     pack-wds: pack imagefolder TREE --to webdataset -o OUT/p.wds --shard-size 1GB --overwrite --quiet --json
     pack-wds-md5: the same with --md5 (every shard's MD5 too, as before it became opt-in)
     tar     : bash -c 'tar -cf OUT/tar.tar -C TREE . && sync OUT/tar.tar'
     disk    : dd if=/dev/zero of=OUT/disk.bin bs=8M count=TREE_BYTES/8M oflag=direct conv=fsync
               (the disk floor: the tree's bytes written straight to the device, nothing read)
     py-lmdb : PYTHON benches/py_lmdb_pack.py TREE OUT/py.lmdb
     py-wds  : PYTHON benches/py_wds_pack.py TREE OUT/py.wds   (webdataset.ShardWriter + fsync)
     litdata : PEERS_PYTHON benches/py_litdata_pack.py TREE OUT/lit   (litdata optimize(), 2 workers, raw bytes)
     mds     : PEERS_PYTHON benches/py_mds_pack.py TREE OUT/mds       (MosaicML MDSWriter, raw bytes)
   litdata and mds run in their own venv (--peers-python; benches/requirements-peers.txt), as
   mosaicml-streaming pins a numpy the interop venv does not have. They are left out of the
   default set when that venv is missing.
   Outputs are deleted and `sync` is run between runs, outside the timed region. Wall time is
   measured around fork/exec/wait, peak RSS comes from GNU time's %M (/usr/bin/time; for tar,
   the largest of bash, tar and sync), or from os.wait4's rusage where GNU time is missing,
   which also counts this script's own memory at the fork.
4. Prints a Markdown table (also written to OUT/pack_vs_tar.md, raw numbers to
   OUT/pack_vs_tar.json) and PASS/FAIL lines for pack's targets (LMDB: peak RSS <= 300 MB,
   median time <= 1.2 x durable tar; WebDataset: peak RSS <= 300 MB, median time <= 0.8 x
   durable tar). It never exits non-zero because a target is missed.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

# Bump when the generator's output changes, so an old cached tree is not mistaken for a new one.
GENERATOR_VERSION = 2

MIN_BYTES, MAX_BYTES = 80_000, 110_000  # accepted JPEG sizes
TARGET_LO, TARGET_HI = 88_000, 108_000  # per-image target sizes are drawn uniformly from this
JPEG_QUALITY = 90
# (width, height, probability): ImageNet's most common shapes.
SHAPES = [(500, 375, 0.75), (375, 500, 0.15), (500, 333, 0.10)]

RSS_LIMIT_MB = 300.0  # pack --to lmdb
RATIO_LIMIT = 1.2
WDS_RSS_LIMIT_MB = 300.0  # pack --to webdataset
WDS_RATIO_LIMIT = 0.8  # issue #16: WebDataset packing at LMDB speed
WDS_SHARD_SIZE = 1_000_000_000  # --shard-size 1GB, and py_wds_pack.py's ShardWriter maxsize
# Tar bytes per sample beyond the image itself, at most: pack writes 3 members (jpg, cls, json of
# < 512 bytes), each a 512-byte header plus < 512 bytes of padding; webdataset's TarWriter writes
# 2 (jpg, cls), each also preceded by a PAX header (512 + 512 bytes) for its fractional mtime.
PACK_WDS_MAX_OVERHEAD = 3 * 1024
PY_WDS_MAX_OVERHEAD = 2 * 2048
COMMANDS = ("pack", "pack-wds", "pack-wds-md5", "tar", "disk", "py-lmdb", "py-wds", "litdata", "mds")
# The `disk` floor writes the tree's bytes in blocks of this size.
DISK_BLOCK = 8 << 20

PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1e6  # all "MB" in this benchmark are 10^6 bytes


# --------------------------------------------------------------------------------------------
# Tree generation
# --------------------------------------------------------------------------------------------


def class_names(n_classes: int, seed: int) -> list[str]:
    """ImageNet-style WordNet ids (n01440764, ...), deterministic and sorted."""
    import numpy as np

    rng = np.random.default_rng([seed, 0xC1A55])
    ids = rng.choice(np.arange(1_000_000, 15_000_000), size=n_classes, replace=False)
    return [f"n{int(i):08d}" for i in sorted(ids)]


def plan_tree(n_images: int, n_classes: int, seed: int) -> list[tuple[int, str]]:
    """[(global image index, relative path)] for the whole tree, in a fixed order."""
    import numpy as np

    plan = []
    index = 0
    for c, wnid in enumerate(class_names(n_classes, seed)):
        count = n_images // n_classes + (1 if c < n_images % n_classes else 0)
        rng = np.random.default_rng([seed, 0xF11E, c])
        # ImageNet train files are named {wnid}_{number}.JPEG with sparse numbers.
        numbers = sorted(int(x) for x in rng.choice(np.arange(1, 20 * max(count, 1) + 1), size=count, replace=False))
        for number in numbers:
            plan.append((index, f"{wnid}/{wnid}_{number}.JPEG"))
            index += 1
    return plan


def render_jpeg(index: int, seed: int) -> bytes:
    """The JPEG for image `index`: smooth random colour fields plus Gaussian grain, with the
    grain strength tuned (a few encodes at most) so the file lands on a size drawn from
    [TARGET_LO, TARGET_HI]. Deterministic for a given (seed, index) and encoder build."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng([seed, index])
    r = rng.random()
    acc = 0.0
    for w, h, p in SHAPES:
        acc += p
        if r < acc:
            break
    target = float(rng.uniform(TARGET_LO, TARGET_HI))

    def field(cell: int, resample) -> np.ndarray:
        small = rng.integers(0, 256, size=(h // cell + 2, w // cell + 2, 3), dtype=np.uint8)
        return np.asarray(Image.fromarray(small).resize((w, h), resample), dtype=np.float32)

    base = 0.7 * field(int(rng.integers(18, 40)), Image.BICUBIC) + 0.3 * field(5, Image.BILINEAR)
    grain = rng.standard_normal(size=(h, w, 3), dtype=np.float32)

    def encode(sigma: float) -> bytes:
        pixels = np.clip(base + sigma * grain, 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=JPEG_QUALITY)
        return buf.getvalue()

    # Size grows roughly linearly with sigma over this range (~3 kB per unit at 500x375).
    slope = 3000.0 * (w * h) / (500 * 375)
    sigma = 15.0
    data = encode(sigma)
    best = data
    for _ in range(4):
        if abs(len(data) - target) < 1500:
            break
        sigma = min(max(sigma + (target - len(data)) / slope, 0.5), 60.0)
        data = encode(sigma)
        if abs(len(data) - target) < abs(len(best) - target):
            best = data
    return best


def _render_job(job: tuple[int, str, str, int]) -> int:
    index, rel, root, seed = job
    path = os.path.join(root, rel)
    if os.path.exists(path):  # resuming: files are written atomically, so a present one is whole
        return 0
    data = render_jpeg(index, seed)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return 1


def tree_params(args) -> dict:
    return {
        "images": args.images,
        "classes": args.classes,
        "seed": args.seed,
        "generator_version": GENERATOR_VERSION,
        "jpeg_quality": JPEG_QUALITY,
    }


def marker_path(tree: Path) -> Path:
    # A sibling of the tree, so the tree itself holds nothing but class folders.
    return tree.parent / f"{tree.name}.complete.json"


def size_stats(sizes: list[int]) -> dict:
    s = sorted(sizes)
    q = lambda p: s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]  # noqa: E731
    return {
        "count": len(s),
        "total_bytes": sum(s),
        "min": s[0],
        "p05": q(0.05),
        "median": q(0.5),
        "p95": q(0.95),
        "max": s[-1],
        "mean": sum(s) / len(s),
        "in_range": sum(MIN_BYTES <= x <= MAX_BYTES for x in s),
    }


def print_size_distribution(sizes: list[int]) -> dict:
    st = size_stats(sizes)
    print(
        f"  {st['count']} files, {st['total_bytes'] / MB:.1f} MB total; size kB: min {st['min'] / 1e3:.1f}, "
        f"p5 {st['p05'] / 1e3:.1f}, median {st['median'] / 1e3:.1f}, mean {st['mean'] / 1e3:.1f}, "
        f"p95 {st['p95'] / 1e3:.1f}, max {st['max'] / 1e3:.1f}"
    )
    lo = (min(sizes) // 5000) * 5000
    hist: dict[int, int] = {}
    for x in sizes:
        b = (x // 5000) * 5000
        hist[b] = hist.get(b, 0) + 1
    width = max(hist.values())
    for b in range(lo, max(sizes) + 1, 5000):
        n = hist.get(b, 0)
        print(f"    {b / 1e3:5.0f}-{(b + 5000) / 1e3:<5.0f} kB {n:6d} {'#' * round(40 * n / width)}")
    ok = st["in_range"] == st["count"]
    print(
        f"  {'OK' if ok else 'WARNING'}: {st['in_range']}/{st['count']} files within "
        f"{MIN_BYTES / 1e3:.0f}-{MAX_BYTES / 1e3:.0f} kB"
    )
    return st


def ensure_tree(args, tree: Path) -> dict:
    """Generates the tree unless a matching completion marker exists. Returns the marker."""
    params = tree_params(args)
    marker = marker_path(tree)
    if marker.exists() and not args.regenerate:
        recorded = json.loads(marker.read_text())
        if recorded.get("params") != params:
            sys.exit(
                f"error: {tree} was generated with {recorded.get('params')}, not {params}; "
                "pass --regenerate to rebuild it, or choose another --tree"
            )
        print(f"tree: {tree} (cached; {marker.name} present)")
        return recorded
    if args.regenerate and tree.exists():
        print(f"tree: removing {tree} (--regenerate)")
        shutil.rmtree(tree)
        marker.unlink(missing_ok=True)

    plan = plan_tree(args.images, args.classes, args.seed)
    need = len(plan) * (TARGET_LO + TARGET_HI) / 2
    free = shutil.disk_usage(tree.parent if tree.parent.exists() else REPO).free
    print(f"tree: generating {len(plan)} JPEGs in {args.classes} classes under {tree} "
          f"(~{need / 1e9:.2f} GB; {free / 1e9:.0f} GB free) with {args.jobs} processes")
    if free < 4 * need:  # the tree plus three outputs of about its size
        sys.exit(f"error: not enough free disk space for the tree and the outputs (~{4 * need / 1e9:.1f} GB)")
    for wnid in sorted({rel.split("/")[0] for _, rel in plan}):
        (tree / wnid).mkdir(parents=True, exist_ok=True)
    jobs = [(i, rel, str(tree), args.seed) for i, rel in plan]
    started = time.perf_counter()
    made = 0
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for k, n in enumerate(pool.imap_unordered(_render_job, jobs, chunksize=64), 1):
            made += n
            if k % 1000 == 0 or k == len(jobs):
                el = time.perf_counter() - started
                print(f"  {k}/{len(jobs)} ({made} new) {el:.0f}s", flush=True)
    # Sanity: exactly the planned files, nothing else.
    expected = {rel for _, rel in plan}
    present = {f"{d.name}/{f.name}" for d in tree.iterdir() if d.is_dir() for f in d.iterdir()}
    if present != expected:
        extra, missing = sorted(present - expected)[:5], sorted(expected - present)[:5]
        sys.exit(f"error: {tree} does not match the plan (extra e.g. {extra}, missing e.g. {missing}); "
                 "pass --regenerate")
    sizes = [os.path.getsize(tree / rel) for _, rel in plan]
    print("tree: size distribution")
    stats = print_size_distribution(sizes)
    record = {
        "params": params,
        "stats": stats,
        "generated_seconds": round(time.perf_counter() - started, 1),
        "pillow": __import__("PIL").__version__,
        "numpy": __import__("numpy").__version__,
    }
    os.sync()
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, marker)
    return record


def tree_files(tree: Path) -> list[Path]:
    return sorted(p for d in tree.iterdir() if d.is_dir() for p in d.rglob("*") if p.is_file())


def warm_up(files: list[Path]) -> float:
    """Reads every file once so the timed runs start from a warm page cache. (Not with
    `tar -cf /dev/null`: GNU tar notices /dev/null and skips reading file contents.)"""
    started = time.perf_counter()
    buf = bytearray(1 << 20)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - started


def resident_fraction(files: list[Path]) -> float | None:
    """Fraction of the tree's bytes in the page cache (via util-linux fincore), or None."""
    if not shutil.which("fincore") or not files:
        return None
    res = total = 0
    for i in range(0, len(files), 2000):
        batch = [str(p) for p in files[i:i + 2000]]
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", *batch],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        for line in out.stdout.split("\n"):
            if line.strip():
                r, s = line.split()
                res += int(r)
                total += -(-int(s) // PAGE) * PAGE  # RES counts whole pages
    return res / total if total else None


# --------------------------------------------------------------------------------------------
# Timed runs
# --------------------------------------------------------------------------------------------


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# GNU time, if present, reports the peak RSS: a child forked from this Python process counts
# the parent's memory at the fork in its own ru_maxrss (the kernel keeps the larger of the
# pre-exec and post-exec peaks), which once added ~30-150 MB to every command's figure. GNU time
# is a 30 kB program: what it adds is ~2 MB.
GNU_TIME = "/usr/bin/time"


def run_timed(argv: list[str], stdout_path: Path, stderr_path: Path) -> dict:
    """Runs argv, returning wall seconds, exit code, the child's rusage (os.wait4) and its
    peak RSS (from GNU time when installed, else from the rusage, overstated)."""
    rss_path = stdout_path.with_suffix(".maxrss")
    wrapped = [GNU_TIME, "-f", "%M", "-o", str(rss_path), *argv] if os.access(GNU_TIME, os.X_OK) else argv
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by us, not by Popen
    # ru_maxrss is in KiB on Linux; for a shell it is the max over itself and reaped children.
    peak_kib = ru.ru_maxrss
    if wrapped is not argv:
        try:
            peak_kib = int(rss_path.read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            pass  # the command failed before GNU time wrote it; the exit code says so
    return {
        "wall_s": wall,
        "exit": proc.returncode,
        "peak_rss_mb": peak_kib * 1024 / MB,
        "rss_from": "gnu-time" if wrapped is not argv else "rusage (includes this script's memory at fork)",
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
        "major_faults": ru.ru_majflt,
        "vol_ctx_switches": ru.ru_nvcsw,
        "invol_ctx_switches": ru.ru_nivcsw,
        "fs_in_blocks": ru.ru_inblock,
        "fs_out_blocks": ru.ru_oublock,
    }


def make_commands(args, tree: Path, out: Path, tree_bytes: int) -> dict[str, dict]:
    pack_out = out / "pack.lmdb"
    wds_out = out / "p.wds"
    tar_out = out / "tar.tar"
    py_out = out / "py.lmdb"
    py_wds_out = out / "py.wds"
    return {
        "pack": {
            "label": "pack imagefolder --to lmdb",
            "argv": [str(args.pack), "imagefolder", str(tree), "--to", "lmdb", "-o", str(pack_out),
                     "--overwrite", "--quiet", "--json"],
            "outputs": [pack_out, out / f".{pack_out.name}.imgpack-tmp", out / f".{pack_out.name}.imgpack-tmp-old"],
        },
        "pack-wds": {
            "label": "pack imagefolder --to webdataset",
            "argv": [str(args.pack), "imagefolder", str(tree), "--to", "webdataset", "-o", str(wds_out),
                     "--shard-size", "1GB", "--overwrite", "--quiet", "--json"],
            "outputs": [wds_out, out / f".{wds_out.name}.imgpack-tmp", out / f".{wds_out.name}.imgpack-tmp-old"],
        },
        "pack-wds-md5": {
            "label": "pack imagefolder --to webdataset --md5",
            "argv": [str(args.pack), "imagefolder", str(tree), "--to", "webdataset", "-o", str(out / "p5.wds"),
                     "--shard-size", "1GB", "--md5", "--overwrite", "--quiet", "--json"],
            "outputs": [out / "p5.wds", out / ".p5.wds.imgpack-tmp", out / ".p5.wds.imgpack-tmp-old"],
        },
        "tar": {
            "label": "tar -cf + sync (durable tar)",
            "argv": ["bash", "-c", 'tar -cf "$1" -C "$2" . && sync "$1"', "bash", str(tar_out), str(tree)],
            "outputs": [tar_out],
        },
        # The floor of any durable packing on this disk: as many bytes as the tree holds,
        # written straight to the device (O_DIRECT, 8 MiB blocks) and fsynced, with nothing to
        # read. A command that takes about this long is waiting on the disk, not on itself.
        "disk": {
            "label": "dd oflag=direct of the tree's bytes + fsync (disk floor)",
            "argv": ["dd", "if=/dev/zero", f"of={out / 'disk.bin'}", f"bs={DISK_BLOCK}",
                     f"count={-(-tree_bytes // DISK_BLOCK)}", "oflag=direct", "conv=fsync", "status=none"],
            "outputs": [out / "disk.bin"],
        },
        "py-lmdb": {
            "label": "py-lmdb script (benches/py_lmdb_pack.py)",
            "argv": [str(args.python), str(HERE / "py_lmdb_pack.py"), str(tree), str(py_out)],
            "outputs": [py_out],
        },
        "py-wds": {
            "label": "py-wds script (benches/py_wds_pack.py)",
            "argv": [str(args.python), str(HERE / "py_wds_pack.py"), str(tree), str(py_wds_out)],
            "outputs": [py_wds_out],
        },
        "litdata": {
            "label": "litdata optimize() (benches/py_litdata_pack.py)",
            "argv": [str(args.peers_python), str(HERE / "py_litdata_pack.py"), str(tree), str(out / "lit")],
            "outputs": [out / "lit"],
        },
        "mds": {
            "label": "MosaicML MDSWriter (benches/py_mds_pack.py)",
            "argv": [str(args.peers_python), str(HERE / "py_mds_pack.py"), str(tree), str(out / "mds")],
            "outputs": [out / "mds"],
        },
    }


def count_tar_members(path: Path) -> tuple[int, list[str]]:
    """(number of members, the first few names) of a tar file, reading only its headers."""
    import tarfile

    n = 0
    first: list[str] = []
    with tarfile.open(path, "r:") as t:
        for m in t:
            n += 1
            if len(first) < 3:
                first.append(m.name)
    return n, first


def check_shards(directory: Path, n_files: int, tree_bytes: int, members_per_sample: int,
                 max_overhead: int, max_shard_bytes: int | None) -> tuple[list[Path], str | None]:
    """Checks a directory of shard-NNNNNN.tar files: present, numbered from 0, total size
    plausible for the tree, every member counted. Returns (shards, problem or None)."""
    shards = sorted(directory.glob("shard-*.tar"))
    if not shards:
        return shards, f"no shard-*.tar in {directory}"
    expected_names = [f"shard-{i:06d}.tar" for i in range(len(shards))]
    if [p.name for p in shards] != expected_names:
        return shards, f"shards are not numbered from 0: {[p.name for p in shards][:5]}"
    sizes = [p.stat().st_size for p in shards]
    total = sum(sizes)
    # Each shard ends with at least two zero blocks and is padded to a whole record (10240 bytes).
    upper = tree_bytes + n_files * max_overhead + len(shards) * 20 * 512
    if not tree_bytes <= total <= upper:
        return shards, f"shards total {total} bytes, expected {tree_bytes} to {upper}"
    if max_shard_bytes is not None and max(sizes) > max_shard_bytes:
        return shards, f"a shard is {max(sizes)} bytes, over the {max_shard_bytes}-byte shard size"
    members = 0
    for p in shards:
        n, first = count_tar_members(p)
        members += n
        if p == shards[0] and (not first or not first[0].startswith("00000000.")):
            return shards, f"{p.name} starts with {first}, not sample 00000000"
    if members != members_per_sample * n_files:
        return shards, f"{members} tar members, expected {members_per_sample} x {n_files}"
    return shards, None


def check_output(name: str, result: dict, cmd: dict, n_files: int, tree_bytes: int, stdout: str) -> str | None:
    """Light correctness check of a run's output; returns a problem or None."""
    if result["exit"] != 0:
        return f"exit code {result['exit']}"
    if name in ("pack", "pack-wds", "pack-wds-md5"):
        try:
            summary = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"stdout is not a JSON summary: {stdout[:200]!r}"
        result["pack_summary"] = {k: summary.get(k) for k in ("packed", "found", "bytes_in", "bytes_out", "seconds")}
        if summary.get("packed") != n_files or summary.get("skipped"):
            return f"packed {summary.get('packed')} of {n_files}, skipped {len(summary.get('skipped') or [])}"
        result["output_bytes"] = summary.get("bytes_out")
    if name in ("pack-wds", "pack-wds-md5"):
        out = cmd["outputs"][0]
        if not out.is_dir():
            return f"{out} is not a directory"
        shards, problem = check_shards(out, n_files, tree_bytes, 3, PACK_WDS_MAX_OVERHEAD, WDS_SHARD_SIZE)  # jpg, cls, json
        if problem:
            return problem
        for extra in ("shardindex.json", "imgpack.json", "imgpack.index", *(p.with_suffix(".idx").name for p in shards)):
            if not (out / extra).is_file():
                return f"{out / extra} is missing"
        try:
            listed = json.loads((out / "shardindex.json").read_text())["shardlist"]
        except (ValueError, KeyError) as e:
            return f"shardindex.json unreadable: {e}"
        if [e.get("url") for e in listed] != [p.name for p in shards]:
            return f"shardindex.json lists {[e.get('url') for e in listed][:5]}, not the shards on disk"
        if sum(e.get("nsamples", 0) for e in listed) != n_files:
            return f"shardindex.json counts {sum(e.get('nsamples', 0) for e in listed)} samples, not {n_files}"
        if any(e.get("filesize") != p.stat().st_size for e, p in zip(listed, shards)):
            return "shardindex.json file sizes differ from the shards on disk"
        result["shards"] = len(shards)
        # Everything written: shards, .idx files and the indexes.
        result["output_bytes"] = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    elif name == "py-wds":
        out = cmd["outputs"][0]
        shards, problem = check_shards(out, n_files, tree_bytes, 2, PY_WDS_MAX_OVERHEAD, None)  # jpg, cls
        if problem:
            return problem
        result["shards"] = len(shards)
        result["output_bytes"] = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    elif name in ("litdata", "mds"):
        out = cmd["outputs"][0]
        files = [p for p in out.rglob("*") if p.is_file()]
        result["output_bytes"] = sum(p.stat().st_size for p in files)
        if result["output_bytes"] < tree_bytes:
            return f"{out} holds {result['output_bytes']} bytes, less than the tree's {tree_bytes}"
    elif name in ("tar", "disk"):
        size = cmd["outputs"][0].stat().st_size
        result["output_bytes"] = size
        if size < tree_bytes:
            return f"{name} output is {size} bytes, smaller than the tree ({tree_bytes})"
    elif name == "py-lmdb":
        import lmdb

        path = cmd["outputs"][0]
        env = lmdb.open(str(path), readonly=True, lock=False)
        entries = env.stat()["entries"]
        env.close()
        result["output_bytes"] = (path / "data.mdb").stat().st_size
        if entries != 2 * n_files:
            return f"{entries} records, expected {2 * n_files}"
    return None


def fmt(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def summarise(runs: dict[str, list[dict]], n_files: int, tree_bytes: int) -> dict[str, dict]:
    summary = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r.get("problem") is None]
        if not ok:
            summary[name] = {"ok_runs": 0}
            continue
        walls = [r["wall_s"] for r in ok]
        med = statistics.median(walls)
        summary[name] = {
            "ok_runs": len(ok),
            "median_s": med,
            "min_s": min(walls),
            "max_s": max(walls),
            "images_per_s": n_files / med,
            "mb_per_s": tree_bytes / MB / med,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ok),
            "median_user_s": statistics.median(r["user_s"] for r in ok),
            "median_sys_s": statistics.median(r["sys_s"] for r in ok),
            "output_mb": statistics.median(r.get("output_bytes") or 0 for r in ok) / MB,
        }
    tar = summary.get("tar", {}).get("median_s")
    tar_fastest = summary.get("tar", {}).get("min_s")
    disk = summary.get("disk", {}).get("median_s")
    for s in summary.values():
        if tar and "median_s" in s:
            s["ratio_to_tar"] = s["median_s"] / tar
            # This VM's tar rounds are often bimodal: against the fast mode too, never only the
            # flattering median.
            s["ratio_to_fastest_tar"] = s["median_s"] / tar_fastest
        if disk and "median_s" in s:
            s["ratio_to_disk"] = s["median_s"] / disk
    return summary


def markdown(summary: dict, commands: dict, meta: dict) -> str:
    lines = [
        f"### pack vs durable tar: {meta['images']:,} JPEGs, {meta['classes']} classes, "
        f"{meta['tree_bytes'] / MB:,.0f} MB, warm cache, "
        f"{meta['rounds']} timed round{'s' if meta['rounds'] != 1 else ''} "
        f"(+{meta['warmup_rounds']} untimed warm-up), {meta['settle_s']:g} s settle before each run",
        "",
        "| command | median s | min s | images/s | MB/s | peak RSS MB | × durable tar | × tar's fastest | × disk floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        label = commands[name]["label"]
        if not s.get("ok_runs"):
            lines.append(f"| {label} | failed | | | | | | | |")
            continue
        ratios = [f"{s[k]:.2f}" if k in s else "n/a" for k in ("ratio_to_tar", "ratio_to_fastest_tar", "ratio_to_disk")]
        lines.append(
            f"| {label} | {fmt(s['median_s'])} | {fmt(s['min_s'])} | {fmt(s['images_per_s'], 0)} | "
            f"{fmt(s['mb_per_s'], 0)} | {fmt(s['peak_rss_mb'], 1)} | {' | '.join(ratios)} |"
        )
    lines += [
        "",
        "| command | median user s | median sys s | output MB |",
        "|---|---:|---:|---:|",
    ]
    for name, s in summary.items():
        if s.get("ok_runs"):
            lines.append(f"| {commands[name]['label']} | {fmt(s['median_user_s'])} | {fmt(s['median_sys_s'])} | "
                         f"{fmt(s['output_mb'], 0)} |")
    lines += [
        "",
        f"MB = 10^6 bytes of source images; peak RSS is the maximum over rounds (GNU time %M); "
        f"ratios = median / median of durable tar, / durable tar's fastest round, / median of the disk "
        f"floor (dd oflag=direct of as many bytes). Machine: {meta['machine']}.",
    ]
    return "\n".join(lines) + "\n"


def verdicts(summary: dict) -> list[str]:
    """PASS/FAIL lines for the targets of whichever of pack and pack-wds ran."""
    out = []
    for name, rss_limit, ratio_limit in (("pack", RSS_LIMIT_MB, RATIO_LIMIT),
                                         ("pack-wds", WDS_RSS_LIMIT_MB, WDS_RATIO_LIMIT)):
        if name not in summary:
            continue
        s = summary[name]
        if not s.get("ok_runs"):
            out.append(f"FAIL: {name} did not complete successfully")
            continue
        rss = s["peak_rss_mb"]
        if rss <= rss_limit:
            out.append(f"PASS: {name} peak RSS {rss:.1f} MB <= {rss_limit:.0f} MB")
        else:
            out.append(f"FAIL: {name} peak RSS {rss:.1f} MB > {rss_limit:.0f} MB")
        ratio = s.get("ratio_to_tar")
        if ratio is None:
            out.append(f"FAIL: no durable-tar time to compare {name} with")
        elif ratio <= ratio_limit:
            out.append(f"PASS: {name}/tar median time ratio {ratio:.2f} <= {ratio_limit}")
        else:
            out.append(f"FAIL: {name}/tar median time ratio {ratio:.2f} > {ratio_limit}")
    return out


def loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def tool_version(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}"


# --------------------------------------------------------------------------------------------


def default_peers_python() -> str:
    return str(Path.home() / ".cache/imgpack-peers-venv/bin/python")


def default_python() -> str:
    venv = Path.home() / ".cache/imgpack-venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, default=None,
                   help="where the generated ImageFolder tree is cached [default: OUT/imagenet-like, "
                        "or OUT/imagenet-like-quick with --quick]")
    p.add_argument("--out", type=Path, default=REPO / "bench-out",
                   help="output directory for the packed outputs and the results [default: bench-out in the repository]")
    p.add_argument("--images", type=int, default=None, help="number of images [default: 15000; 500 with --quick]")
    p.add_argument("--classes", type=int, default=None, help="number of classes [default: 150; 10 with --quick]")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds of the commands [default: 3; 1 with --quick]")
    p.add_argument("--warmup-rounds", type=int, default=None,
                   help="untimed rounds of all commands before the timed ones [default: 1; 0 with --quick]")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds to wait after deleting the previous outputs and syncing, before each run "
                        "[default: 5; 0 with --quick]")
    p.add_argument("--seed", type=int, default=20240601, help="generator seed [default: %(default)s]")
    p.add_argument("--jobs", type=int, default=2, help="processes used to generate the tree [default: %(default)s]")
    p.add_argument("--pack", type=Path, default=REPO / "target/release/pack", help="the pack binary [default: target/release/pack in the repository]")
    p.add_argument("--peers-python", default=default_peers_python(),
                   help="python of the venv with litdata and mosaicml-streaming [default: %(default)s]")
    p.add_argument("--python", default=default_python(),
                   help="python with py-lmdb and webdataset, for the py-lmdb and py-wds baselines [default: %(default)s]")
    p.add_argument("--only", default=",".join(COMMANDS),
                   help=f"comma-separated subset of {','.join(COMMANDS)}, in the order given [default: all]")
    p.add_argument("--quick", action="store_true", help="small tree, one round: a smoke test")
    p.add_argument("--build", action="store_true", help="run `cargo build --release` first")
    p.add_argument("--regenerate", action="store_true", help="delete and regenerate the tree")
    p.add_argument("--generate-only", action="store_true", help="make the tree and stop")
    args = p.parse_args()
    if args.images is None:
        args.images = 500 if args.quick else 15_000
    if args.classes is None:
        args.classes = 10 if args.quick else 150
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.settle is None:
        args.settle = 0.0 if args.quick else 5.0
    if args.warmup_rounds is None:
        args.warmup_rounds = 0 if args.quick else 1
    if args.tree is None:
        args.tree = args.out / ("imagenet-like-quick" if args.quick else "imagenet-like")
    if args.images < args.classes or args.classes < 1 or args.rounds < 1:
        p.error("need --classes >= 1, --images >= --classes and --rounds >= 1")
    return args


def main() -> int:
    args = parse_args()
    out = args.out.resolve()
    tree = args.tree.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree.parent.mkdir(parents=True, exist_ok=True)

    record = ensure_tree(args, tree)
    if args.generate_only:
        return 0

    if args.build:
        subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    pack = Path(args.pack).resolve()
    args.pack = pack
    if not os.access(pack, os.X_OK):
        sys.exit(f"error: no pack binary at {pack}; run `cargo build --release` (or pass --build / --pack)")
    newest_src = max((p.stat().st_mtime for d in ("src", "reader/src") for p in (REPO / d).rglob("*.rs")), default=0)
    if pack.stat().st_mtime < newest_src:
        print(f"warning: {pack} is older than the Rust sources; rebuild with `cargo build --release`")

    files = tree_files(tree)
    n_files = len(files)
    tree_bytes = sum(p.stat().st_size for p in files)
    if n_files != args.images:
        sys.exit(f"error: {tree} holds {n_files} files, expected {args.images}; pass --regenerate")

    commands = make_commands(args, tree, out, tree_bytes)
    order = [n.strip() for n in args.only.split(",") if n.strip()]
    if not Path(args.peers_python).exists():
        missing = [n for n in order if n in ("litdata", "mds")]
        if missing and args.only != ",".join(COMMANDS):
            sys.exit(f"error: {args.peers_python} does not exist; see benches/requirements-peers.txt")
        order = [n for n in order if n not in missing]
    unknown = set(order) - set(commands)
    if unknown:
        sys.exit(f"error: --only: unknown command(s) {sorted(unknown)}")
    commands = {n: commands[n] for n in order}

    load = loadavg()
    if load is not None and load > 0.5:
        print(f"warning: 1-minute load average is {load:.2f}; other work on the machine skews the timings")
    print(f"warm-up: reading {n_files} files ({tree_bytes / MB:,.0f} MB) once, untimed ...", flush=True)
    warm = warm_up(files)
    resident = resident_fraction(files)
    print(f"warm-up: {warm:.1f}s" + (f"; {resident:.1%} of the tree is in the page cache" if resident is not None else ""))

    logs = out / ("logs-quick" if args.quick else "logs")
    if logs.exists():
        shutil.rmtree(logs)  # only this run's logs, so none is mistaken for a current one
    logs.mkdir()
    runs: dict[str, list[dict]] = {n: [] for n in commands}
    warmups: dict[str, list[dict]] = {n: [] for n in commands}
    names = list(commands)
    total = args.warmup_rounds + args.rounds
    for k in range(total):
        warming = k < args.warmup_rounds
        rnd = k - args.warmup_rounds
        tag = f"warm-up {k + 1}/{args.warmup_rounds}" if warming else f"round {rnd + 1}/{args.rounds}"
        # Alternate the commands, rotating which goes first each round, so no command always
        # runs right after the same other one.
        rotated = names[k % len(names):] + names[:k % len(names)]
        for name in rotated:
            cmd = commands[name]
            for o in cmd["outputs"]:
                remove(o)
            os.sync()  # the deletion's writeback/discard happens here, not in the timed run
            # Let the kernel settle (free-page reporting to a VM host, writeback of metadata) so
            # every run starts from the same state, whatever ran just before it.
            time.sleep(args.settle)
            stem = f"{name}-w{k + 1}" if warming else f"{name}-r{rnd + 1}"
            stdout_path = logs / f"{stem}.stdout"
            stderr_path = logs / f"{stem}.stderr"
            run_load = loadavg()
            result = run_timed(cmd["argv"], stdout_path, stderr_path)
            result["loadavg_1m_before"] = run_load
            result["round"] = None if warming else rnd + 1
            result["problem"] = check_output(name, result, cmd, n_files, tree_bytes,
                                             stdout_path.read_text(errors="replace"))
            (warmups if warming else runs)[name].append(result)
            note = f"  PROBLEM: {result['problem']} (see {stderr_path})" if result["problem"] else ""
            print(f"{tag:13s} {name:8s} {result['wall_s']:7.2f}s  "
                  f"peak RSS {result['peak_rss_mb']:7.1f} MB  user {result['user_s']:6.2f}s  "
                  f"sys {result['sys_s']:6.2f}s{note}", flush=True)
            for o in cmd["outputs"]:
                remove(o)
    os.sync()
    resident_after = resident_fraction(files)

    summary = summarise(runs, n_files, tree_bytes)
    meta = {
        "images": n_files,
        "classes": args.classes,
        "tree": str(tree),
        "tree_bytes": tree_bytes,
        "tree_stats": record.get("stats"),
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "settle_s": args.settle,
        "machine": machine_description(),
        "warm_up_s": warm,
        "tree_resident_before": resident,
        "tree_resident_after": resident_after,
        "pack": str(pack),
        "pack_version": tool_version([str(pack), "--version"]),
        "git_commit": tool_version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "tar_version": tool_version(["tar", "--version"]),
        "sync_version": tool_version(["sync", "--version"]),
        "python": args.python,
        "py_lmdb_version": tool_version([args.python, "-c", "import lmdb; print(lmdb.__version__)"]),
        "webdataset_version": tool_version([args.python, "-c", "import webdataset; print(webdataset.__version__)"]),
        "filesystem": tool_version(["findmnt", "-no", "FSTYPE,OPTIONS", "-T", str(out)]),
        "loadavg_1m_at_start": load,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    table = markdown(summary, commands, meta)
    checks = verdicts(summary)
    print()
    print(table)
    for line in checks:
        print(line)

    stem = "pack_vs_tar-quick" if args.quick else "pack_vs_tar"
    (out / f"{stem}.md").write_text(table + "\n" + "\n".join(checks) + "\n")
    raw = {
        "meta": meta,
        "commands": {n: {"label": c["label"], "argv": c["argv"]} for n, c in commands.items()},
        "runs": runs,
        "warmup_runs": warmups,
        "summary": summary,
        "checks": checks,
        "limits": {"pack_peak_rss_mb": RSS_LIMIT_MB, "pack_over_tar": RATIO_LIMIT,
                   "pack_wds_peak_rss_mb": WDS_RSS_LIMIT_MB, "pack_wds_over_tar": WDS_RATIO_LIMIT},
    }
    (out / f"{stem}.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    print(f"\nwrote {out / f'{stem}.md'} and {out / f'{stem}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
