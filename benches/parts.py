#!/usr/bin/env python3
"""Benchmark `pack PLAN --part K/N` and `pack merge`: does the cost per part stay flat as N grows?

See benches/README.md for what it measures and how to read the results. In short:

    cargo build --release
    ~/.cache/imgpack-venv/bin/python benches/parts.py            # bench-out/imagenet-like, N = 1, 2, 4
    ~/.cache/imgpack-venv/bin/python benches/parts.py --smoke    # 620 small images, well under a minute

1. `pack plan SRC -o WORK/src.plan` once (timed).
2. Reads every file of SRC once (untimed), so all runs start from a warm page cache.
3. For each format (lmdb, webdataset), after one untimed run of the smallest N (--warmup), for
   each N (1, 2, 4): deletes WORK/FORMAT-nN, syncs, waits --settle seconds, then runs the N commands
       pack WORK/src.plan --part K/N --to FORMAT -o WORK/FORMAT-nN --threads 1 -q --json
   at most --jobs (2) at a time, like a 2-node cluster, timing each one; then syncs, waits, and
   times `pack merge WORK/FORMAT-nN -q --json`. Checks every part's JSON summary and the
   merged dataset: its sample count equals the plan's (minus skipped files) and N = 1's, and
   its per-sample CRC-32s equal N = 1's (the merged datasets are the same dataset).
4. LMDB reads, one merged database vs N part databases: packs N = --read-parts (4) again,
   merges with --keep-parts, and times --reads (20,000) seeded random whole-sample reads
   (FORMAT.md's cursor set_range snippet) from the merged environment and from the N part
   environments (each global index routed to its part by the ranges in the parts' __meta__),
   warm cache, with a transaction per read and with one long-lived transaction.
5. Prints the tables (also written to WORK/parts.md), raw numbers with --json FILE.

Needs Python 3.9+; the read comparison (step 4) also needs the `lmdb` package (the project venv
has it) and is skipped without it. Exits non-zero only when a command fails or a check does not
hold, never because of a timing.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import itertools
import json
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pack_vs_tar import loadavg, machine_description, tool_version, warm_up  # noqa: E402  (shared with the tar benchmark)

REPO = Path(__file__).resolve().parent.parent
MB = 1e6  # all "MB" in this benchmark are 10^6 bytes
FORMATS = ("lmdb", "webdataset")
SMOKE_COPIES = 20  # --smoke: 20 copies of testdata/imagefolder's 31 images = 620 files


class CheckFailed(Exception):
    """A command failed or a result is not what it must be."""


# --------------------------------------------------------------------------------------------
# Small helpers (the same as benches/pack_vs_tar.py's)
# --------------------------------------------------------------------------------------------


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def tree_files(root: Path) -> list[Path]:
    """Every regular file under root (what the warm-up reads), in a stable order."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        files.extend(Path(dirpath) / f for f in sorted(filenames))
    return [p for p in files if p.is_file()]


def settle(seconds: float) -> None:
    """Flush what earlier steps wrote or deleted, then let the machine settle (see
    benches/README.md, "Reading the numbers", for why this matters on a ballooned VM)."""
    os.sync()
    time.sleep(seconds)


def part_dir_name(k: int, n: int) -> str:
    """OUT/part-KKKK-of-NNNN: both numbers the same width, at least 4 digits (FORMAT.md)."""
    width = max(4, len(str(n)))
    return f"part-{k:0{width}d}-of-{n:0{width}d}"


def fmt_ratio(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if x == float("inf"):
        return "inf"
    return f"{x:.{digits}f}"


# --------------------------------------------------------------------------------------------
# Running commands: a process pool that times each child (os.wait4)
# --------------------------------------------------------------------------------------------


def spawn(argv: list[str], stdout_path: Path, stderr_path: Path) -> int:
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(stdout_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_OPEN, 2, str(stderr_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    ]
    exe = shutil.which(argv[0]) or argv[0]
    return os.posix_spawn(exe, argv, os.environ, file_actions=actions)


def run_pool(jobs: list[dict], width: int) -> float:
    """Runs jobs ({"argv", "stdout", "stderr"}) with at most `width` at once, in the order
    given, each starting as soon as a slot is free. Fills in each job's wall time (from just
    before its spawn to its reaping by os.wait4), start and end (seconds from the pool's
    start), exit code, peak RSS and CPU times. Returns the pool's wall time."""
    pending = list(jobs)
    running: dict[int, dict] = {}
    t0 = time.perf_counter()
    while pending or running:
        while pending and len(running) < width:
            job = pending.pop(0)
            job["start_s"] = time.perf_counter() - t0
            running[spawn(job["argv"], job["stdout"], job["stderr"])] = job
        pid, status, ru = os.wait4(-1, 0)
        now = time.perf_counter() - t0
        job = running.pop(pid, None)
        if job is None:  # not ours (there are no other children, but be safe)
            continue
        job.update({
            "end_s": now,
            "wall_s": now - job["start_s"],
            "exit": os.waitstatus_to_exitcode(status),
            "peak_rss_mb": ru.ru_maxrss * 1024 / MB,  # ru_maxrss is in KiB on Linux
            "user_s": ru.ru_utime,
            "sys_s": ru.ru_stime,
        })
    return time.perf_counter() - t0


def json_record(path: Path, kind: str) -> dict | None:
    """The last JSON object of `"type": kind` that a command printed on stdout."""
    found = None
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("type") == kind:
                found = record
    return found


def run_checked(argv: list[str], logs: Path, stem: str, kind: str, ok_exits=(0, 3)) -> tuple[dict, dict]:
    """Runs one command alone, timed; returns (the run, its JSON record of `"type": kind`)."""
    job = {"argv": argv, "stdout": logs / f"{stem}.stdout", "stderr": logs / f"{stem}.stderr"}
    run_pool([job], 1)
    record = json_record(job["stdout"], kind)
    if job["exit"] not in ok_exits or record is None:
        raise CheckFailed(f"`{' '.join(argv)}` exited {job['exit']}"
                          f"{'' if record else ' without a JSON summary'}; see {job['stderr']}")
    return job, record


# --------------------------------------------------------------------------------------------
# Reading results back
# --------------------------------------------------------------------------------------------


def lmdb_module():
    try:
        import lmdb  # noqa: F401
        return lmdb
    except ImportError:
        return None


def lmdb_records(path: Path, keys: list[bytes]) -> list[bytes | None]:
    lmdb = lmdb_module()
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [txn.get(k) for k in keys]
    finally:
        env.close()


def merged_facts(out: Path, fmt: str) -> dict:
    """What the merged dataset in `out` says of itself: its sample count (from its own
    metadata) and a digest of its per-sample CRC-32s, which is the same for every N when the
    merged datasets hold the same samples in the same order (None when it cannot be read)."""
    if fmt == "webdataset":
        meta = json.loads((out / "imgpack.json").read_text())
        index = (out / "imgpack.index").read_bytes()
        magic, version, _meta_crc, count = struct.unpack_from("<8sIIQ", index)
        if magic != b"IMGPKIDX" or len(index) != 24 + 24 * count:
            raise CheckFailed(f"{out}/imgpack.index is not a sample index of {count} entries")
        # (length, crc) of every sample: offsets and shard numbers differ with N, these do not.
        digest = hashlib.md5()
        for _offset, length, _shard, crc in struct.iter_unpack("<QQII", index[24:]):
            digest.update(struct.pack("<QI", length, crc))
        shards = meta.get("shards", [])
        return {"samples": meta["samples"], "index_samples": count, "crc_digest": digest.hexdigest(),
                "shards": len(shards), "shard_bytes": sum(s["bytes"] for s in shards)}
    if not (out / "data.mdb").is_file():
        raise CheckFailed(f"{out}/data.mdb is missing after the merge")
    facts = {"samples": None, "crc_digest": None, "data_mdb_bytes": (out / "data.mdb").stat().st_size}
    if lmdb_module() is not None:
        meta_raw, table = lmdb_records(out, [b"__meta__", b"__checksums__"])
        if meta_raw is None or table is None:
            raise CheckFailed(f"{out}: no __meta__ or __checksums__ in the merged database")
        facts["samples"] = json.loads(meta_raw)["samples"]
        facts["crc_digest"] = hashlib.md5(table).hexdigest()
    return facts


# --------------------------------------------------------------------------------------------
# One split: N parts, then the merge
# --------------------------------------------------------------------------------------------


def run_split(args, fmt: str, n: int, plan: Path, out: Path, logs: Path, keep_parts: bool = False,
              tag: str | None = None) -> dict:
    tag = tag or f"{fmt}-n{n}" + ("-keep" if keep_parts else "")
    remove(out)  # a finished part run again does nothing, so every split starts from nothing
    settle(args.settle)
    load = loadavg()
    jobs = [{
        "part": k,
        "argv": [str(args.pack), str(plan), "--part", f"{k}/{n}", "--to", fmt, "-o", str(out),
                 "--threads", str(args.threads), "-q", "--json"],
        "stdout": logs / f"{tag}-part{k}.stdout",
        "stderr": logs / f"{tag}-part{k}.stderr",
    } for k in range(n)]
    pool_wall = run_pool(jobs, args.jobs)
    parts = []
    for job in jobs:
        summary = json_record(job["stdout"], "summary")
        where = f"{fmt} part {job['part']}/{n} (see {job['stderr']})"
        if job["exit"] not in (0, 3) or summary is None:
            raise CheckFailed(f"{where} exited {job['exit']}{'' if summary else ' without a JSON summary'}")
        expected = out / part_dir_name(job["part"], n)
        if Path(summary["output"]).resolve() != expected.resolve():
            raise CheckFailed(f"{where}: wrote {summary['output']}, expected {expected}")
        if summary["packed"] + len(summary["skipped"]) != summary["found"]:
            raise CheckFailed(f"{where}: packed + skipped != found in its summary")
        if any("already packed" in w for w in summary.get("warnings", [])):
            raise CheckFailed(f"{where}: found its part already packed; the timing is meaningless")
        parts.append({
            "part": job["part"], "wall_s": job["wall_s"], "start_s": job["start_s"], "end_s": job["end_s"],
            "exit": job["exit"], "peak_rss_mb": job["peak_rss_mb"], "user_s": job["user_s"], "sys_s": job["sys_s"],
            "reported_s": summary["seconds"], "found": summary["found"], "packed": summary["packed"],
            "skipped": len(summary["skipped"]), "bytes_in": summary["bytes_in"], "bytes_out": summary["bytes_out"],
        })
    settle(args.settle)
    merge_argv = [str(args.pack), "merge", str(out), "-q", "--json"] + (["--keep-parts"] if keep_parts else [])
    merge_run, merged = run_checked(merge_argv, logs, f"{tag}-merge", "merge")
    if merged.get("already_merged"):
        raise CheckFailed(f"{tag}: pack merge says {out} was already merged; the timing is meaningless")
    facts = merged_facts(out, fmt)
    left = sorted(p.name for p in out.glob("part-*-of-*"))
    if fmt == "lmdb" and not keep_parts and left:
        raise CheckFailed(f"{tag}: pack merge left the part databases {left} (it deletes them without --keep-parts)")
    if fmt == "lmdb" and keep_parts and len(left) != n:
        raise CheckFailed(f"{tag}: pack merge --keep-parts left {len(left)} part directories, not {n}")

    walls = [p["wall_s"] for p in parts]
    nonempty = [p for p in parts if p["packed"] > 0]
    bytes_in = [p["bytes_in"] for p in parts]
    result = {
        "format": fmt, "n": n, "keep_parts": keep_parts, "jobs": args.jobs, "threads": args.threads,
        "loadavg_1m_before": load,
        "wall_s": pool_wall,
        "part_mean_s": statistics.fmean(walls),
        "part_max_s": max(walls),
        "part_min_s": min(walls),
        "part_sum_s": sum(walls),
        "part_cpu_s": sum(p["user_s"] + p["sys_s"] for p in parts),
        "part_peak_rss_mb": max(p["peak_rss_mb"] for p in parts),
        "bytes_in": sum(bytes_in),
        "bytes_out_parts": sum(p["bytes_out"] for p in parts),
        "bytes_balance": (max(bytes_in) / min(bytes_in)) if min(bytes_in) > 0 else float("inf"),
        "samples_balance": (max(p["packed"] for p in parts) / min(p["packed"] for p in parts))
        if all(p["packed"] for p in parts) else float("inf"),
        "empty_parts": n - len(nonempty),
        "packed_parts": sum(p["packed"] for p in parts),
        "skipped": sum(p["skipped"] for p in parts),
        "merge_s": merge_run["wall_s"],
        "merge_reported_s": merged["seconds"],
        "merge_peak_rss_mb": merge_run["peak_rss_mb"],
        "merge_user_s": merge_run["user_s"],
        "merge_sys_s": merge_run["sys_s"],
        "merged_packed": merged["packed"],
        "merged_found": merged["found"],
        "merged_parts": merged["parts"],
        "merged_bytes_out": merged["bytes_out"],
        "merged": facts,
        "parts": parts,
    }
    # The merged dataset must hold every sample the parts packed, as its own metadata says.
    problems = []
    if merged["parts"] != n:
        problems.append(f"merge reports {merged['parts']} parts, not {n}")
    if merged["packed"] != result["packed_parts"]:
        problems.append(f"merge reports {merged['packed']} samples, the parts packed {result['packed_parts']}")
    if facts["samples"] is not None and facts["samples"] != merged["packed"]:
        problems.append(f"the merged metadata says {facts['samples']} samples, merge reported {merged['packed']}")
    if fmt == "webdataset" and merged["packed"] and not facts["shards"]:
        problems.append("the merged imgpack.json lists no shards")
    if facts.get("index_samples") is not None and facts["index_samples"] != merged["packed"]:
        problems.append(f"the merged imgpack.index has {facts['index_samples']} entries, not {merged['packed']}")
    if problems:
        raise CheckFailed(f"{tag}: " + "; ".join(problems))
    return result


def check_against_plan(results: list[dict], plan_samples: int) -> list[str]:
    """Every merged dataset holds the plan's samples minus the skipped ones, and the same
    samples (count and CRC-32s) as the smallest N's."""
    problems = []
    ref = results[0]
    for r in results:
        label = f"{r['format']} N={r['n']}"
        if r["merged_found"] != plan_samples:
            problems.append(f"{label}: merge found {r['merged_found']} planned samples, the plan has {plan_samples}")
        if r["merged_packed"] != plan_samples - r["skipped"]:
            problems.append(f"{label}: {r['merged_packed']} merged samples, expected {plan_samples} planned - "
                            f"{r['skipped']} skipped")
        if r["merged_packed"] != ref["merged_packed"]:
            problems.append(f"{label}: {r['merged_packed']} merged samples, N={ref['n']} has {ref['merged_packed']}")
        d, ref_d = r["merged"]["crc_digest"], ref["merged"]["crc_digest"]
        if d is not None and ref_d is not None and d != ref_d:
            problems.append(f"{label}: the merged samples' CRC-32s differ from N={ref['n']}'s")
    return problems


# --------------------------------------------------------------------------------------------
# LMDB reads: one merged database vs the N part databases
# --------------------------------------------------------------------------------------------


def read_sample(txn, prefix: bytes) -> dict:
    """FORMAT.md's LMDB snippet: every field of one sample, from a cursor at its prefix."""
    cursor = txn.cursor()
    cursor.set_range(prefix)
    return {k[len(prefix):].decode(): v
            for k, v in itertools.takewhile(lambda kv: kv[0].startswith(prefix), cursor)}


class Merged:
    """Sample i is key i of one environment."""

    def __init__(self, lmdb, path: Path):
        self.env = lmdb.open(str(path), readonly=True, lock=False)
        with self.env.begin() as txn:
            self.meta = json.loads(txn.get(b"__meta__"))
        self.width = self.meta["key_width"]
        self.txn = None

    def read(self, i: int) -> dict:
        with self.env.begin() as txn:
            return read_sample(txn, b"%0*d." % (self.width, i))

    def read_shared(self, i: int) -> dict:
        return read_sample(self.txn, b"%0*d." % (self.width, i))

    def envs(self):
        return [self.env]


class Parts:
    """Sample i lives in the part whose packed samples cover it: part k holds the merged
    indices start_k .. start_k + packed_k - 1 (start_k = samples packed by parts 0..k-1), under
    the keys first_k .. first_k + packed_k - 1 (first_k = the plan index of its first sample,
    from the "part" object of its __meta__). With no skipped file, start_k = first_k."""

    def __init__(self, lmdb, dirs: list[Path]):
        self.envs_ = [lmdb.open(str(d), readonly=True, lock=False) for d in dirs]
        self.starts, self.firsts, self.txns = [], [], []
        start = 0
        expected_first = 0
        for d, env in zip(dirs, self.envs_):
            with env.begin() as txn:
                meta = json.loads(txn.get(b"__meta__"))
            part = meta["part"]
            if part["first"] != expected_first or meta["samples"] + len(part.get("skipped", [])) != part["planned"]:
                raise CheckFailed(f"{d}: its part range ({part}) does not continue the part before it")
            expected_first = part["first"] + part["planned"]
            self.starts.append(start)
            self.firsts.append(part["first"])
            start += meta["samples"]
            self.width = meta["key_width"]
        self.samples = start

    def route(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.starts, i) - 1
        return k, self.firsts[k] + (i - self.starts[k])

    def read(self, i: int) -> dict:
        k, key = self.route(i)
        with self.envs_[k].begin() as txn:
            return read_sample(txn, b"%0*d." % (self.width, key))

    def read_shared(self, i: int) -> dict:
        k, key = self.route(i)
        return read_sample(self.txns[k], b"%0*d." % (self.width, key))

    def envs(self):
        return self.envs_


def warm_envs(envs) -> int:
    """Reads every record of every environment once (untimed): a warm page cache."""
    total = 0
    for env in envs:
        with env.begin() as txn:
            for _k, v in txn.cursor():
                total += len(v)
    return total


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def read_benchmark(args, out: Path, n: int) -> dict:
    lmdb = lmdb_module()
    dirs = [out / part_dir_name(k, n) for k in range(n)]
    merged = Merged(lmdb, out)
    parts = Parts(lmdb, dirs)
    samples = merged.meta["samples"]
    if parts.samples != samples:
        raise CheckFailed(f"the parts hold {parts.samples} samples, the merged database {samples}")
    rng = random.Random(args.seed)
    indices = [rng.randrange(samples) for _ in range(args.reads)]

    warm_bytes = warm_envs(merged.envs()) + warm_envs(parts.envs())
    # Same samples from both designs (outside the timing): routing is right, bytes are equal.
    check = indices[:500] + [0, samples - 1] + [s for s in parts.starts if s < samples]
    for i in check:
        a, b = merged.read(i), parts.read(i)
        if not a or a != b or "cls" not in a:
            raise CheckFailed(f"sample {i}: the merged database and part {parts.route(i)} disagree")

    merged.txn = merged.env.begin()
    parts.txns = [env.begin() for env in parts.envs()]
    designs = {
        ("merged", "txn per read"): merged.read,
        ("parts", "txn per read"): parts.read,
        ("merged", "one txn"): merged.read_shared,
        ("parts", "one txn"): parts.read_shared,
    }
    times: dict[tuple, list[float]] = {d: [] for d in designs}
    for fn in designs.values():  # untimed warm-up of the code paths
        for i in indices[:2000]:
            fn(i)
    # Interleave the designs in blocks, rotating which goes first, so drift hits all alike.
    block = 1000
    names = list(designs)
    clock = time.perf_counter_ns
    for b, lo in enumerate(range(0, len(indices), block)):
        chunk = indices[lo:lo + block]
        for name in names[b % len(names):] + names[:b % len(names)]:
            fn, sink = designs[name], times[name]
            for i in chunk:
                t = clock()
                fields = fn(i)
                sink.append((clock() - t) / 1000)
                if not fields:
                    raise CheckFailed(f"{name}: sample {i} not found")
    merged.txn.abort()
    for t in parts.txns:
        t.abort()
    for env in merged.envs() + parts.envs():
        env.close()

    rows = {}
    for (design, mode), ts in times.items():
        ts.sort()
        rows[f"{design}/{mode}"] = {
            "design": design, "mode": mode, "reads": len(ts),
            "p50_us": percentile(ts, 50), "p90_us": percentile(ts, 90), "p99_us": percentile(ts, 99),
            "max_us": ts[-1], "mean_us": statistics.fmean(ts),
        }
    for mode in ("txn per read", "one txn"):
        m, p = rows[f"merged/{mode}"], rows[f"parts/{mode}"]
        p["p50_ratio"] = p["p50_us"] / m["p50_us"]
        p["p99_ratio"] = p["p99_us"] / m["p99_us"]
    return {"n": n, "samples": samples, "reads": args.reads, "seed": args.seed, "warm_bytes": warm_bytes,
            "merged_data_mdb_bytes": (out / "data.mdb").stat().st_size,
            "parts_data_mdb_bytes": sum((d / "data.mdb").stat().st_size for d in dirs),
            "rows": rows}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def derive(results: list[dict]) -> None:
    """Ratios of each split to the smallest N of its format (results are in N order)."""
    for fmt in FORMATS:
        rs = [r for r in results if r["format"] == fmt]
        if not rs:
            continue
        ref = rs[0]
        for r in rs:
            # Summed part time per packed sample, relative to the reference split's.
            if r["packed_parts"] and ref["packed_parts"] and ref["part_sum_s"] > 0:
                r["flat_ratio"] = (r["part_sum_s"] / r["packed_parts"]) / (ref["part_sum_s"] / ref["packed_parts"])
            else:
                r["flat_ratio"] = None
            r["wall_ratio"] = r["wall_s"] / ref["wall_s"]
            r["merge_over_wall"] = r["merge_s"] / r["wall_s"]


def markdown(meta: dict, results: list[dict], reads: dict | None, keep: dict | None) -> str:
    lines = [
        f"### pack --part K/N + pack merge: {meta['plan_samples']:,} samples, {meta['plan_bytes'] / MB:,.0f} MB, "
        f"parts run {meta['jobs']} at a time with --threads {meta['threads']}, warm cache, "
        f"{meta['settle_s']:g} s settle before each step",
        "",
        f"`pack plan`: {meta['plan_s']:.2f} s ({meta['plan_samples'] / max(meta['plan_s'], 1e-9):,.0f} files/s). "
        f"Machine: {meta['machine']}.",
        "",
    ]
    for fmt in FORMATS:
        rs = [r for r in results if r["format"] == fmt]
        if not rs:
            continue
        ref = rs[0]
        lines += [
            f"#### `--to {fmt}`",
            "",
            "| N | wall s | × N=%d wall | part mean s | part max s | Σ part s | Σ part / N=%d | part bytes max/min "
            "| merge s | merge / wall | wall + merge s | samples |" % (ref["n"], ref["n"]),
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rs:
            lines.append(
                f"| {r['n']} | {r['wall_s']:.2f} | {r['wall_ratio']:.2f} | {r['part_mean_s']:.2f} | "
                f"{r['part_max_s']:.2f} | {r['part_sum_s']:.2f} | {fmt_ratio(r['flat_ratio'])} | {fmt_ratio(r['bytes_balance'], 3)} | "
                f"{r['merge_s']:.2f} | {r['merge_over_wall']:.2f} | {r['wall_s'] + r['merge_s']:.2f} | "
                f"{r['merged_packed']:,} |"
            )
        lines.append("")
    ref_n = min(meta["ns"])
    lines += [
        f"wall = first part start to last part end, {meta['jobs']} parts at a time; Σ part / N={ref_n} = summed part "
        f"wall time per packed sample relative to N={ref_n}'s (1.00 = flat per-sample cost); part bytes = source "
        "bytes each part packed; merge / wall = `pack merge` time over the parts' wall time.",
        "",
    ]
    if keep:
        lines += [
            f"#### LMDB: merging is a copy (N={keep['n']}, `pack merge --keep-parts`)",
            "",
            f"pack {keep['n']} parts: {keep['wall_s']:.2f} s wall, {keep['part_sum_s']:.2f} s summed; "
            f"merge (copy into one database): {keep['merge_s']:.2f} s = "
            f"**{keep['merge_s'] / keep['wall_s']:.2f} × the pack wall time**, "
            f"{keep['merge_s'] / keep['part_sum_s']:.2f} × the summed part time "
            f"({keep['merged']['data_mdb_bytes'] / MB:,.0f} MB data.mdb, "
            f"{keep['merged']['data_mdb_bytes'] / MB / max(keep['merge_s'], 1e-9):,.0f} MB/s).",
            "",
        ]
    if reads:
        lines += [
            f"#### LMDB random reads: one merged database vs {reads['n']} part databases "
            f"({reads['reads']:,} seeded whole-sample reads, warm cache)",
            "",
            "| design | transaction | p50 µs | p90 µs | p99 µs | mean µs | p50 × merged | p99 × merged |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for mode in ("txn per read", "one txn"):
            for design in ("merged", "parts"):
                r = reads["rows"][f"{design}/{mode}"]
                label = "merged (1 env)" if design == "merged" else f"parts ({reads['n']} envs, routed)"
                lines.append(
                    f"| {label} | {mode} | {r['p50_us']:.1f} | {r['p90_us']:.1f} | {r['p99_us']:.1f} | "
                    f"{r['mean_us']:.1f} | {fmt_ratio(r.get('p50_ratio', 1.0))} | {fmt_ratio(r.get('p99_ratio', 1.0))} |"
                )
        lines += [
            "",
            "A read is FORMAT.md's snippet: `cursor.set_range(b\"%08d.\")` and every field of the sample, copied "
            "into Python bytes; \"txn per read\" opens a read transaction for each read (as the snippet does), "
            "\"one txn\" keeps one per environment open. The parts design also routes the index to its part "
            "(bisect over the ranges in each part's `__meta__`).",
            "",
        ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------


def ensure_pack(args) -> Path:
    pack = Path(args.pack).resolve()
    if args.build or not os.access(pack, os.X_OK):
        if pack != (REPO / "target/release/pack").resolve():
            if not os.access(pack, os.X_OK):
                sys.exit(f"error: no pack binary at {pack}")
        else:
            print("building: cargo build --release", flush=True)
            subprocess.run(["cargo", "build", "--release"], cwd=REPO, check=True)
    if not os.access(pack, os.X_OK):
        sys.exit(f"error: no pack binary at {pack}; run `cargo build --release` (or pass --build / --pack)")
    newest_src = max((p.stat().st_mtime for d in ("src", "reader/src") for p in (REPO / d).rglob("*.rs")), default=0)
    if pack.stat().st_mtime < newest_src:
        print(f"warning: {pack} is older than the Rust sources; rebuild with `cargo build --release`")
    probe = subprocess.run([str(pack), "merge", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"error: {pack} has no `merge` command (built before --part/merge existed); "
                 "run `cargo build --release`")
    return pack


def make_smoke_tree(tree: Path, copies: int) -> None:
    """COPIES copies of every image of testdata/imagefolder, class by class (620 files for 20)."""
    source = REPO / "testdata/imagefolder"
    marker = tree.parent / f"{tree.name}.complete.json"
    params = {"source": str(source), "copies": copies}
    if marker.exists() and json.loads(marker.read_text()) == params and tree.is_dir():
        return
    remove(tree)
    for class_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        (tree / class_dir.name).mkdir(parents=True)
        for c in range(copies):
            for f in sorted(class_dir.iterdir()):
                shutil.copyfile(f, tree / class_dir.name / f"c{c:03d}_{f.name}")
    marker.write_text(json.dumps(params) + "\n")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=None,
                   help="the ImageFolder tree to pack [default: bench-out/imagenet-like, "
                        "or WORK/smoke-tree with --smoke]")
    p.add_argument("--work", type=Path, default=None,
                   help="where the plan, the outputs and the logs go [default: bench-out/parts; "
                        "bench-out/parts-smoke with --smoke]")
    p.add_argument("--parts", default="1,2,4", help="the N to run, comma-separated [default: %(default)s]")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of lmdb,webdataset "
                   "[default: %(default)s]")
    p.add_argument("--jobs", type=int, default=2, help="part commands running at once [default: %(default)s]")
    p.add_argument("--threads", type=int, default=1, help="--threads of each part command [default: %(default)s]")
    p.add_argument("--read-parts", type=int, default=4,
                   help="N of the LMDB read comparison (packed again, merged with --keep-parts); 0 skips it "
                        "[default: %(default)s]")
    p.add_argument("--reads", type=int, default=None, help="random reads per design [default: 20000; 2000 with --smoke]")
    p.add_argument("--seed", type=int, default=20240601, help="seed of the random reads [default: %(default)s]")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds to wait after a sync before each split and each merge [default: 5; 0 with --smoke]")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs of the smallest N (parts and merge) per format before the timed ones "
                        "[default: %(default)s]")
    p.add_argument("--pack", type=Path, default=REPO / "target/release/pack",
                   help="the pack binary [default: target/release/pack, built with `cargo build --release` if missing]")
    p.add_argument("--build", action="store_true", help="run `cargo build --release` first")
    p.add_argument("--keep", action="store_true", help="keep every output under WORK (default: delete each once measured)")
    p.add_argument("--json", type=Path, default=None, help="also write every raw number to this file")
    p.add_argument("--smoke", action="store_true",
                   help="smoke test: pack WORK/smoke-tree, --smoke-copies copies of testdata/imagefolder, made on "
                        "first use; no settling, 2,000 reads")
    p.add_argument("--smoke-copies", type=int, default=SMOKE_COPIES,
                   help="copies of testdata/imagefolder's 31 images in the --smoke tree [default: %(default)s: "
                        "620 files, ~10 MB]")
    args = p.parse_args()
    if args.work is None:
        args.work = REPO / "bench-out" / ("parts-smoke" if args.smoke else "parts")
    if args.src is None:
        args.src = args.work / "smoke-tree" if args.smoke else REPO / "bench-out/imagenet-like"
    if args.reads is None:
        args.reads = 2000 if args.smoke else 20_000
    if args.settle is None:
        args.settle = 0.0 if args.smoke else 5.0
    try:
        args.ns = sorted({int(x) for x in args.parts.split(",") if x.strip()})
    except ValueError:
        p.error(f"--parts {args.parts!r}: write numbers like 1,2,4")
    args.format_list = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not args.ns or min(args.ns) < 1:
        p.error("--parts: every N must be at least 1")
    if not args.format_list or set(args.format_list) - set(FORMATS):
        p.error(f"--formats: choose from {','.join(FORMATS)}")
    if args.smoke_copies < 1:
        p.error("--smoke-copies must be at least 1")
    if args.jobs < 1 or args.threads < 1 or args.reads < 1 or args.read_parts < 0 or args.warmup < 0:
        p.error("need --jobs >= 1, --threads >= 1, --reads >= 1, --read-parts >= 0 and --warmup >= 0")
    return args


def main() -> int:
    args = parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke and args.src.resolve() == work / "smoke-tree":
        make_smoke_tree(work / "smoke-tree", args.smoke_copies)
    src = args.src.resolve()
    if not src.is_dir():
        sys.exit(f"error: no source tree at {src}; make it with `benches/pack_vs_tar.py --generate-only`, "
                 "or pass --src DIR (or --smoke)")
    args.pack = ensure_pack(args)
    logs = work / "logs"
    if logs.exists():
        shutil.rmtree(logs)  # only this run's logs, so none is mistaken for a current one
    logs.mkdir()

    load = loadavg()
    if load is not None and load > 0.5:
        print(f"warning: 1-minute load average is {load:.2f}; other work on the machine skews the timings")

    # 1. The plan.
    plan = work / "src.plan"
    settle(args.settle)
    plan_run, plan_summary = run_checked([str(args.pack), "plan", str(src), "-o", str(plan), "--overwrite", "-q",
                                          "--json"], logs, "plan", "plan", ok_exits=(0,))
    plan_samples, plan_bytes = plan_summary["samples"], plan_summary["bytes"]
    print(f"plan: {plan_samples:,} samples, {plan_bytes / MB:,.1f} MB, {plan_summary['classes']} classes "
          f"in {plan_run['wall_s']:.2f} s -> {plan}", flush=True)
    if plan_samples == 0:
        sys.exit("error: the plan is empty")
    # At the peak, an LMDB merge holds the parts and the merged copy: twice the data, plus room.
    free = shutil.disk_usage(work).free
    if free < 3 * plan_bytes:
        print(f"warning: {free / 1e9:.1f} GB free under {work}; the LMDB merges need about "
              f"{2 * plan_bytes / 1e9:.1f} GB at their peak")

    files = tree_files(src)
    print(f"warm-up: reading {len(files):,} files ({sum(p.stat().st_size for p in files) / MB:,.0f} MB) once, "
          "untimed ...", flush=True)
    print(f"warm-up: {warm_up(files):.1f} s", flush=True)

    # 2. The splits.
    results = []
    problems = []
    try:
        for fmt in args.format_list:
            for w in range(args.warmup):
                # Untimed: the first run after a while pays for paging pack in and for fresh memory.
                n = args.ns[0]
                r = run_split(args, fmt, n, plan, work / f"{fmt}-warmup", logs, tag=f"{fmt}-warmup{w + 1}")
                print(f"{fmt:10s} N={n}: warm-up run {w + 1}/{args.warmup} (untimed): wall {r['wall_s']:6.2f} s",
                      flush=True)
                remove(work / f"{fmt}-warmup")
            for n in args.ns:
                out = work / f"{fmt}-n{n}"
                r = run_split(args, fmt, n, plan, out, logs)
                results.append(r)
                print(f"{fmt:10s} N={n}: wall {r['wall_s']:6.2f} s, parts mean {r['part_mean_s']:6.2f} s "
                      f"max {r['part_max_s']:6.2f} s, bytes max/min {fmt_ratio(r['bytes_balance'], 3)}, "
                      f"merge {r['merge_s']:5.2f} s, {r['merged_packed']:,} samples", flush=True)
                if r["skipped"]:
                    print(f"  note: the parts skipped {r['skipped']} files (see {logs}/{fmt}-n{n}-part*.stdout)")
                if not args.keep:
                    remove(out)
            problems += check_against_plan([r for r in results if r["format"] == fmt], plan_samples)

        # 3. One merged LMDB vs N part LMDBs.
        reads = keep = None
        if args.read_parts and "lmdb" in args.format_list:
            if lmdb_module() is None:
                print("reads: skipped, no `lmdb` module in this Python (use ~/.cache/imgpack-venv/bin/python)")
            else:
                n = args.read_parts
                out = work / f"lmdb-n{n}-keep"
                keep = run_split(args, "lmdb", n, plan, out, logs, keep_parts=True)
                problems += check_against_plan([r for r in results if r["format"] == "lmdb"][:1] + [keep],
                                               plan_samples)
                print(f"lmdb       N={n} --keep-parts: wall {keep['wall_s']:6.2f} s, merge {keep['merge_s']:5.2f} s "
                      f"({keep['merge_s'] / keep['wall_s']:.2f} × the pack wall)", flush=True)
                print(f"reads: {args.reads:,} random samples from the merged database and from the {n} parts ...",
                      flush=True)
                reads = read_benchmark(args, out, n)
                if not args.keep:
                    remove(out)
    except CheckFailed as e:
        print(f"\nFAIL: {e}", file=sys.stderr)
        return 1

    meta = {
        "src": str(src), "work": str(work), "plan": str(plan),
        "plan_samples": plan_samples, "plan_bytes": plan_bytes, "plan_classes": plan_summary["classes"],
        "plan_s": plan_run["wall_s"], "ns": args.ns, "formats": args.format_list, "jobs": args.jobs,
        "threads": args.threads, "settle_s": args.settle, "warmup_splits": args.warmup,
        "machine": machine_description(), "loadavg_1m_at_start": load,
        "pack": str(args.pack), "pack_version": tool_version([str(args.pack), "--version"]),
        "git_commit": tool_version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "python": sys.executable, "py_lmdb_version": getattr(lmdb_module(), "__version__", None),
        "filesystem": tool_version(["findmnt", "-no", "FSTYPE,OPTIONS", "-T", str(work)]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    derive(results)
    table = markdown(meta, results, reads, keep)
    verdicts = [f"FAIL: {p}" for p in problems] or [
        f"OK: every merged dataset holds the plan's {plan_samples:,} samples"
        + (" minus the skipped files" if any(r["skipped"] for r in results) else "")
        + (", with the same CRC-32s for every N" if all(r["merged"]["crc_digest"] for r in results) else "")
    ]
    print()
    print(table)
    for line in verdicts:
        print(line)
    (work / "parts.md").write_text(table + "\n" + "\n".join(verdicts) + "\n")
    if args.json:
        raw = {"meta": meta, "splits": results, "keep_parts_split": keep, "reads": reads, "checks": verdicts}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(raw, indent=2, default=str) + "\n")
        print(f"\nwrote {work / 'parts.md'} and {args.json}")
    else:
        print(f"\nwrote {work / 'parts.md'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
