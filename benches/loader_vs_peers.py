#!/usr/bin/env python3
"""Benchmark `imgpack.Loader` against torchvision, NVIDIA DALI (CPU) and a plain py-lmdb DataLoader,
and `imgpack.open(lmdb)[i]` against py-lmdb `txn.get` on a cold page cache.

See benches/README.md for what it measures and how to read the results. In short:

    ~/.cache/imgpack-venv/bin/pip install --no-deps --force-reinstall target/wheels/imgpack-*.whl
    ~/.cache/imgpack-venv/bin/python benches/loader_vs_peers.py            # 5,000 images, 5 rounds
    ~/.cache/imgpack-venv/bin/python benches/loader_vs_peers.py --quick    # smoke test

1. Generates (once; cached) an ImageNet-like tree of ~500x375 JPEGs with pack_vs_tar.py's
   generator, and packs it with `pack imagefolder TREE --to lmdb` and `--to webdataset`.
2. Loaders, warm page cache: every loader runs in a fresh subprocess, round-robin over --rounds
   rounds (after one untimed warm-up round). Each makes 224x224 uint8 RGB batches of 64 with
   random-resized crops on 2 threads/workers; the first batch is a warm-up, the next --batches
   are timed (images/s):
     imgpack-lmdb : imgpack.Loader(imgpack.open(LMDB), 64, crop="random-resized", size=224, threads=2)
     imgpack-wds  : the same on the WebDataset directory
     torchvision  : DataLoader(ImageFolder(TREE, Compose([RandomResizedCrop(224), PILToTensor()])),
                               batch_size=64, num_workers=2, shuffle=True)
     dali         : fn.readers.webdataset(shards, idx files, ext=["jpg", "cls"], random_shuffle=True)
                    -> fn.decoders.image_random_crop(device="cpu", output_type=RGB)
                    -> fn.resize(resize_x=224, resize_y=224); batch_size=64, num_threads=2, device_id=None
     py-lmdb      : DataLoader(py-lmdb txn.get + PIL + RandomResizedCrop + PILToTensor, 64, 2 workers)
3. Cold random reads: the LMDB (and the shards) evicted from the page cache before each run,
   then --reads seeded random distinct indices, one at a time, every byte copied out:
     imgpack-lmdb      : bytes(imgpack.open(LMDB)[i].image)
     imgpack-wds       : the same on the WebDataset directory
     py-lmdb           : lmdb.open(LMDB, readonly=True, lock=False, readahead=False); txn.get(jpg), txn.get(cls)
     py-lmdb-readahead : the same with readahead=True (py-lmdb's default)
4. Before every timed run it waits until no compiler (rustc, cc1, cargo, maturin, ...) has run for
   --quiet seconds and other processes have used at most --max-other cores for 5 s; a run during
   which a compiler appeared or others used more is redone (at most --max-redo times).
5. Prints Markdown tables (also OUT/loader/loader_vs_peers.md; raw numbers in .json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import pack_vs_tar as pvt  # noqa: E402  (the tree generator and the machine-description helpers)

LOADERS = ("imgpack-lmdb", "imgpack-wds", "torchvision", "dali", "py-lmdb")
COLD_READERS = ("imgpack-lmdb", "imgpack-wds", "py-lmdb", "py-lmdb-readahead")
LABELS = {
    "imgpack-lmdb": "`imgpack.Loader`, LMDB",
    "imgpack-wds": "`imgpack.Loader`, WebDataset",
    "torchvision": "torchvision `ImageFolder` + `DataLoader`",
    "dali": "DALI CPU pipeline, WebDataset",
    "py-lmdb": "py-lmdb + PIL `Dataset` + `DataLoader`",
}
COLD_LABELS = {
    "imgpack-lmdb": "`bytes(imgpack.open(lmdb)[i].image)`",
    "imgpack-wds": "`bytes(imgpack.open(wds)[i].image)`",
    "py-lmdb": "py-lmdb `readahead=False` `txn.get`",
    "py-lmdb-readahead": "py-lmdb `readahead=True` `txn.get`",
}
# Processes that mean someone is compiling: a timed run during which one appears is redone.
BUILD_PROCESSES = {"rustc", "cc1", "cc1plus", "cargo", "maturin", "cmake", "nasm", "ld", "collect2"}
MB = 1e6
IDLE_S = 5.0  # seconds of an idle machine required before each timed run


# --------------------------------------------------------------------------------------------
# Child side: one loader or one cold reader in a fresh process, JSON on the last stdout line
# --------------------------------------------------------------------------------------------


def proc_tree_cpu_s() -> float:
    """User + system CPU seconds of this process and its live descendants (all threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parent[pid] = int(rest[1])
        cpu[pid] = int(rest[11]) + int(rest[12])  # utime, stime
    ours = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                grew = True
    return sum(cpu.get(p, 0) for p in ours) / tick


def system_cpu() -> dict[str, int]:
    """System-wide jiffies from /proc/stat: busy (user, nice, system: processes' CPU time, not
    interrupts, whose time is mostly our own I/O's), steal (the host's), total."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return {"busy": v[0] + v[1] + v[2], "irq": v[5] + v[6], "steal": v[7], "total": sum(v[:8])}


def make_loader(name: str, ctx: dict):
    """Returns an iterator of (images, labels) batches as the loader gives them."""
    bs, threads, seed = ctx["batch_size"], ctx["threads"], ctx["seed"]
    if name in ("imgpack-lmdb", "imgpack-wds"):
        import imgpack

        path = ctx["lmdb"] if name == "imgpack-lmdb" else ctx["wds"]
        loader = imgpack.Loader(imgpack.open(path), batch_size=bs, shuffle=True, seed=seed, drop_last=True,
                                crop="random-resized", size=224, threads=threads)
        return iter(loader)
    if name in ("torchvision", "py-lmdb"):
        import torch
        from torch.utils.data import DataLoader
        from torchvision import transforms

        torch.manual_seed(seed)
        tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.PILToTensor()])
        if name == "torchvision":
            from torchvision.datasets import ImageFolder

            dataset = ImageFolder(ctx["tree"], transform=tf)
        else:
            dataset = PyLmdbDataset(ctx["lmdb"], tf)
        loader = DataLoader(dataset, batch_size=bs, num_workers=threads, shuffle=True, drop_last=True)
        return iter(loader)
    if name == "dali":
        import numpy as np
        from nvidia.dali import fn, pipeline_def, types

        shards = sorted(str(p) for p in Path(ctx["wds"]).glob("*.tar"))
        idx = [s[:-4] + ".idx" for s in shards]

        @pipeline_def(batch_size=bs, num_threads=threads, device_id=None, seed=seed + 1)
        def pipe():
            jpegs, cls = fn.readers.webdataset(paths=shards, index_paths=idx, ext=["jpg", "cls"],
                                               random_shuffle=True, name="reader")
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_x=224, resize_y=224)
            return images, cls

        p = pipe()
        p.build()

        def batches():
            while True:
                images, cls = p.run()
                arr = np.asarray(images.as_tensor())  # [B, 224, 224, 3] uint8, no copy
                labels = np.array([int(np.asarray(cls[j]).tobytes()) for j in range(len(cls))], dtype=np.int64)
                yield arr, labels

        return batches()
    raise ValueError(name)


class PyLmdbDataset:
    """What a user writes with py-lmdb alone (README: "Python, with the lmdb package alone"):
    the environment opened lazily in each worker, `txn.get` of `{i:08d}.jpg` and `.cls`."""

    def __init__(self, path: str, transform):
        import lmdb

        self.path = path
        self.transform = transform
        self.env = None
        env = lmdb.open(path, readonly=True, lock=False)
        with env.begin() as txn:
            self.n = json.loads(txn.get(b"__meta__"))["samples"]
        env.close()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import io

        import lmdb
        from PIL import Image

        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False)
        with self.env.begin() as txn:
            data = txn.get(b"%08d.jpg" % i)
            label = int(txn.get(b"%08d.cls" % i))
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return self.transform(img), label


def check_batch(name: str, images, labels, bs: int, classes: int) -> None:
    shape = tuple(images.shape)
    want = (bs, 3, 224, 224) if name in ("torchvision", "py-lmdb") else (bs, 224, 224, 3)
    if shape != want or str(images.dtype) not in ("uint8", "torch.uint8"):
        raise RuntimeError(f"{name}: batch of shape {shape} {images.dtype}, expected {want} uint8")
    if tuple(labels.shape) != (bs,) or int(labels.min()) < 0 or int(labels.max()) >= classes:
        raise RuntimeError(f"{name}: labels of shape {tuple(labels.shape)}, range "
                           f"{int(labels.min())}..{int(labels.max())}, expected ({bs},) in 0..{classes - 1}")


def child_loader(name: str, ctx: dict) -> dict:
    started = time.perf_counter()
    it = make_loader(name, ctx)
    built = time.perf_counter()
    images, labels = next(it)  # warm-up batch: worker start, pipeline fill; untimed
    first = time.perf_counter()
    check_batch(name, images, labels, ctx["batch_size"], ctx["classes"])
    if name == "dali":  # the warm-up pixels are not all one value (the decoder did something)
        import numpy as np

        if np.ptp(images) == 0:
            raise RuntimeError("dali: the first batch is constant")
    cpu0, sys0 = proc_tree_cpu_s(), system_cpu()
    t0 = time.perf_counter()
    count = 0
    for _ in range(ctx["batches"]):
        images, labels = next(it)
        check_batch(name, images, labels, ctx["batch_size"], ctx["classes"])
        count += len(labels)
    t1 = time.perf_counter()
    cpu1, sys1 = proc_tree_cpu_s(), system_cpu()
    window = t1 - t0
    total = sys1["total"] - sys0["total"]
    ncpu = os.cpu_count() or 1
    return {
        "images": count,
        "seconds": window,
        "images_per_s": count / window,
        "setup_s": built - started,
        "first_batch_s": first - built,
        "own_cpu_s": cpu1 - cpu0,
        "own_cores": (cpu1 - cpu0) / window,
        # Whole-machine busy cores during the window (ours and everyone else's), and steal.
        "system_busy_cores": (sys1["busy"] - sys0["busy"]) / total * ncpu if total else None,
        "steal_cores": (sys1["steal"] - sys0["steal"]) / total * ncpu if total else None,
    }


def child_cold(name: str, ctx: dict) -> dict:
    import numpy as np

    rng = np.random.default_rng([ctx["seed"], 0xC01D])
    indices = rng.choice(ctx["samples"], size=min(ctx["reads"], ctx["samples"]), replace=False).tolist()
    lat = []
    nbytes = 0
    started = time.perf_counter()
    if name.startswith("imgpack"):
        import imgpack

        ds = imgpack.open(ctx["lmdb"] if name == "imgpack-lmdb" else ctx["wds"])
        opened = time.perf_counter()
        clock = time.perf_counter_ns
        for i in indices:
            t = clock()
            s = ds[i]
            data = bytes(s.image)
            label = s.label
            lat.append(clock() - t)
            nbytes += len(data) + (label >= 0)
    else:
        import lmdb

        env = lmdb.open(ctx["lmdb"], readonly=True, lock=False, readahead=(name == "py-lmdb-readahead"))
        txn = env.begin()
        opened = time.perf_counter()
        clock = time.perf_counter_ns
        for i in indices:
            t = clock()
            data = txn.get(b"%08d.jpg" % i)
            label = int(txn.get(b"%08d.cls" % i))
            lat.append(clock() - t)
            nbytes += len(data) + (label >= 0)
        txn.abort()
        env.close()
    lat_us = sorted(x / 1e3 for x in lat)
    q = lambda p: lat_us[min(len(lat_us) - 1, int(p * (len(lat_us) - 1) + 0.5))]  # noqa: E731
    return {
        "reads": len(lat_us),
        "bytes": nbytes,
        "open_s": opened - started,
        "p50_us": q(0.50),
        "p90_us": q(0.90),
        "p99_us": q(0.99),
        "mean_us": sum(lat_us) / len(lat_us),
        "max_us": lat_us[-1],
        "total_s": sum(lat_us) / 1e6,
    }


def child_main(kind: str, name: str, ctx_json: str) -> int:
    ctx = json.loads(ctx_json)
    result = child_loader(name, ctx) if kind == "loader" else child_cold(name, ctx)
    print(json.dumps(result), flush=True)
    # Skip interpreter teardown (DataLoader workers, DALI threads): nothing after this is timed,
    # and a loader that hangs on exit should not stall the benchmark.
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


def build_processes() -> list[str]:
    """Names of compiler processes running now (from /proc/*/comm)."""
    seen = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm in BUILD_PROCESSES:
                seen.append(comm)
    return seen


class BuildMonitor:
    """Polls /proc every `interval` seconds in a thread for the whole benchmark, so that "no
    compiler for Q seconds" and "a compiler appeared during this run" are both known."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.started = time.monotonic()
        self.last_seen = self.started  # nothing is known before the first observations
        self.events: list[tuple[float, list[str]]] = []
        self.cpu: list[tuple[float, dict[str, int]]] = []  # (time, /proc/stat jiffies)
        self._lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            seen = build_processes()
            now = time.monotonic()
            with self._lock:
                if seen:
                    self.last_seen = now
                    self.events.append((now, sorted(set(seen))))
                self.cpu.append((now, system_cpu()))
                del self.cpu[:-200]
            time.sleep(self.interval)

    def busy_cores(self, over_s: float) -> float | None:
        """Whole-machine busy cores over the last over_s seconds, or None if not yet known."""
        with self._lock:
            if not self.cpu or self.cpu[-1][0] - self.cpu[0][0] < over_s:
                return None
            t1, c1 = self.cpu[-1]
            t0, c0 = next((t, c) for t, c in reversed(self.cpu) if t1 - t >= over_s)
        total = c1["total"] - c0["total"]
        return (c1["busy"] - c0["busy"]) / total * (os.cpu_count() or 1) if total else None

    def wait_quiet(self, quiet_s: float, idle_s: float, max_busy: float) -> float:
        """Blocks until no compiler has been seen for quiet_s seconds and the machine has used
        at most max_busy cores over the last idle_s seconds (we run nothing meanwhile, so that
        is everyone else); returns the wait."""
        started = time.monotonic()
        announced = False
        while True:
            with self._lock:
                quiet_for = time.monotonic() - self.last_seen
            busy = self.busy_cores(idle_s)
            if quiet_for >= quiet_s and busy is not None and busy <= max_busy:
                return time.monotonic() - started
            if not announced and time.monotonic() - started > max(quiet_s, idle_s) + 1:
                why = (f"a compiler {quiet_for:.0f} s ago" if quiet_for < quiet_s
                       else f"the machine busy ({busy:.2f} cores)")
                print(f"  (waiting for {quiet_s:g} s without a compiler and {idle_s:g} s with at most "
                      f"{max_busy:g} cores busy: {why})", flush=True)
                announced = True
            time.sleep(0.5)

    def seen_between(self, t0: float, t1: float) -> list[str]:
        seen = set(build_processes())
        with self._lock:
            for t, names in self.events:
                if t0 - self.interval <= t <= t1 + self.interval:
                    seen.update(names)
        return sorted(seen)


MONITOR: BuildMonitor | None = None


def run_child(args, kind: str, name: str, ctx: dict, log_stem: Path) -> dict:
    argv = [args.python, str(Path(__file__).resolve()), "--child", kind, name, json.dumps(ctx)]
    with open(f"{log_stem}.stdout", "wb") as out, open(f"{log_stem}.stderr", "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=REPO)
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.kill()
            raise
        wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    result: dict = {"exit": code, "process_wall_s": wall, "peak_rss_mb": ru.ru_maxrss * 1024 / MB,
                    "process_cpu_s": ru.ru_utime + ru.ru_stime}
    lines = Path(f"{log_stem}.stdout").read_text(errors="replace").strip().splitlines()
    try:
        result.update(json.loads(lines[-1]))
    except (IndexError, json.JSONDecodeError):
        tail = Path(f"{log_stem}.stderr").read_text(errors="replace").strip().splitlines()[-15:]
        result["problem"] = f"exit {code}, no result; stderr ends:\n    " + "\n    ".join(tail)
    return result


def timed(args, kind: str, name: str, ctx: dict, log_stem: Path, quiet: bool, before=None, after=None) -> dict:
    """Runs one child, under quiet conditions if asked (and --quiet > 0): waits for no compiler,
    redoes the run if one appeared during it (at most --max-redo times). `before` and `after`
    run around each attempt and return fields for its result."""
    redone: list[str] = []
    while True:
        strict = quiet and args.quiet > 0
        waited = MONITOR.wait_quiet(args.quiet, IDLE_S, args.max_other) if strict else 0.0
        extra = before() if before else {}
        load = pvt.loadavg()
        t0 = time.monotonic()
        sys0 = system_cpu()
        result = run_child(args, kind, name, ctx, log_stem)
        sys1 = system_cpu()
        seen = MONITOR.seen_between(t0, time.monotonic())
        result.update(extra)
        result["quiet_wait_s"] = waited
        result["loadavg_1m_before"] = load
        result["build_seen"] = seen
        if "own_cores" in result and result.get("system_busy_cores") is not None:
            # Loaders: the timed window, measured in the child.
            result["other_cores"] = result["system_busy_cores"] - result["own_cores"]
        else:
            # Cold reads: the child's whole life (its CPU from wait4).
            total = sys1["total"] - sys0["total"]
            busy = (sys1["busy"] - sys0["busy"]) / total * (os.cpu_count() or 1) if total else 0.0
            result["other_cores"] = busy - result["process_cpu_s"] / result["process_wall_s"]
        if after:
            result.update(after())
        noisy = [f"{', '.join(seen)} ran"] if seen else []
        if result["other_cores"] > args.max_other:
            noisy.append(f"other processes used {result['other_cores']:.2f} cores")
        result["noise"] = noisy
        if not strict or not noisy or len(redone) >= args.max_redo:
            result["redone_because"] = redone
            return result
        redone.append("; ".join(noisy))
        print(f"  ({name}: {'; '.join(noisy)} during the run; redoing it)", flush=True)


def pack_outputs(args, tree: Path, work: Path) -> tuple[Path, Path]:
    lmdb_out, wds_out = work / "p.lmdb", work / "p.wds"
    for to, out in (("lmdb", lmdb_out), ("webdataset", wds_out)):
        argv = [str(args.pack), "imagefolder", str(tree), "--to", to, "-o", str(out), "--overwrite", "--quiet"]
        print("$ " + " ".join(argv), flush=True)
        subprocess.run(argv, check=True)
    return lmdb_out, wds_out


def evict(paths: list[Path], method: str) -> None:
    """Drops `paths` from the page cache: fadvise(DONTNEED) on each after a sync, or drop_caches."""
    os.sync()
    if method == "drop_caches":
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: list[Path]) -> int | None:
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *map(str, paths)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return sum(int(x) for x in out.stdout.split())


def pick_evict_method(paths: list[Path], total: int) -> str:
    """fadvise if fincore shows it empties the files, else drop_caches (needs root)."""
    pvt.warm_up(paths)
    evict(paths, "fadvise")
    res = resident_bytes(paths)
    if res is None:
        print("cold reads: no fincore to check eviction; using drop_caches")
        return "drop_caches"
    print(f"cold reads: after fadvise(DONTNEED), {res / MB:.1f} of {total / MB:.1f} MB still resident")
    if res <= 0.01 * total:
        return "fadvise"
    evict(paths, "drop_caches")
    res = resident_bytes(paths)
    print(f"cold reads: after drop_caches, {res / MB:.1f} MB resident")
    return "drop_caches"


# -- summaries -------------------------------------------------------------------------------


def modes(values: list[float]) -> dict:
    """Median, range, and whether the values split into two clusters of at least two runs each
    (a gap between sorted neighbours of >10% that is >3x every other gap; one outlying run is
    not a mode); then the fast (higher) cluster's median."""
    v = sorted(values)
    out = {"median": statistics.median(v), "min": v[0], "max": v[-1], "n": len(v), "bimodal": False}
    if len(v) >= 4:
        gaps = [(v[i + 1] - v[i]) / v[i] for i in range(len(v) - 1)]
        k = max(range(1, len(gaps) - 1), key=gaps.__getitem__)  # both sides keep >= 2 runs
        others = [g for j, g in enumerate(gaps) if j != k]
        if gaps[k] > 0.10 and gaps[k] > 3 * max(others, default=0):
            out["bimodal"] = True
            out["fast_mode"] = statistics.median(v[k + 1:])
            out["slow_mode"] = statistics.median(v[:k + 1])
    return out


def fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def loader_table(summary: dict, meta: dict) -> str:
    ours = [n for n in ("imgpack-lmdb", "imgpack-wds") if n in summary and summary[n].get("n")]
    cols = [f"{n} ÷ this" for n in ours] + (["imgpack-lmdb ÷ this's best round"] if "imgpack-lmdb" in ours else [])
    lines = [
        f"### Loaders: {meta['images']:,} JPEGs (~500x375, {meta['tree_bytes'] / MB:,.0f} MB), "
        f"{meta['batch_size']}-image batches of 224x224 uint8 RGB random-resized crops, "
        f"{meta['threads']} threads/workers, warm cache; {meta['batches']} timed batches after a warm-up batch, "
        f"{meta['rounds']} round{'s' if meta['rounds'] != 1 else ''}, round-robin, fresh process per run",
        "",
        "| loader | images/s median | min–max | start to first batch s | CPU cores used | peak RSS MB | "
        + " | ".join(cols) + " |",
        "|---|---:|---:|---:|---:|---:|" + "---:|" * len(cols),
    ]
    for name, s in summary.items():
        if not s.get("n"):
            lines.append(f"| {LABELS[name]} | failed | | | | |" + " |" * len(cols))
            continue
        rng = f"{fmt(s['min'])}–{fmt(s['max'])}" + (" (bimodal)" if s["bimodal"] else "")
        ratios = []
        for o in ours:
            cell = f"{summary[o]['median'] / s['median']:.2f}"
            if s["bimodal"] and name not in ours:
                cell += f" ({summary[o]['median'] / s['fast_mode']:.2f} vs fast mode)"
            ratios.append(cell)
        if "imgpack-lmdb" in ours:
            ratios.append(f"{summary['imgpack-lmdb']['median'] / s['max']:.2f}")
        lines.append(f"| {LABELS[name]} | {fmt(s['median'])} | {rng} | {s['first_batch_s']:.2f} | "
                     f"{s['own_cores']:.2f} | {s['peak_rss_mb']:,.0f} | " + " | ".join(ratios) + " |")
    lines += ["", "images/s over the timed batches, per run; start to first batch = building the loader and its "
              "first batch (after imports); CPU cores = CPU seconds of the process and its workers in the "
              "timed window / window; peak RSS includes the pages of memory-mapped files; ratios = median / "
              "median (bimodal: also / the peer's fast-mode median); best round = a bound that favours the peer."]
    return "\n".join(lines) + "\n"


def summarise(raw: dict) -> tuple[dict, dict]:
    summary: dict[str, dict] = {}
    for name, rs in raw["runs"].items():
        ok = [r for r in rs if "problem" not in r]
        if not ok:
            summary[name] = {"n": 0}
            continue
        s = modes([r["images_per_s"] for r in ok])
        s.update(first_batch_s=statistics.median(r["first_batch_s"] for r in ok),
                 own_cores=statistics.median(r["own_cores"] for r in ok),
                 peak_rss_mb=max(r["peak_rss_mb"] for r in ok),
                 noisy_runs=sum(bool(r.get("noise")) for r in ok))
        summary[name] = s
    cold: dict[str, dict] = {}
    for name, rs in raw["cold_runs"].items():
        ok = [r for r in rs if "problem" not in r]
        if not ok:
            cold[name] = {"n": 0}
            continue
        res = [r["resident_before_bytes"] for r in ok]
        aft = [r["resident_after_bytes"] for r in ok]
        cold[name] = {
            "n": len(ok),
            **{k: statistics.median(r[k] for r in ok) for k in ("p50_us", "p90_us", "p99_us", "mean_us", "total_s")},
            "p50_min": min(r["p50_us"] for r in ok), "p50_max": max(r["p50_us"] for r in ok),
            "resident_mb": None if None in res else max(res) / MB,
            "cached_after_mb": None if None in aft else statistics.median(aft) / MB,
            "copied_mb": statistics.median(r["bytes"] for r in ok) / MB,
            "noisy_runs": sum(bool(r.get("noise")) for r in ok),
        }
    return summary, cold


def render(raw: dict) -> str:
    meta = raw["meta"]
    summary, cold = raw["summary"], raw["cold_summary"]
    text = ""
    if summary:
        text += loader_table(summary, meta) + "\n"
    if cold:
        text += cold_table(cold, meta) + "\n"
    noisy = [f"{n} ({s['noisy_runs']})" for part in (summary, cold) for n, s in part.items() if s.get("noisy_runs")]
    text += ("Noisy runs kept (a compiler ran, or other processes used more than --max-other cores; "
             "redone at most --max-redo times unless --quiet 0): " + ", ".join(noisy) + ".\n" if noisy else
             "Every run kept was quiet (no compiler, other processes within --max-other).\n")
    text += f"Machine: {meta['machine']}. {meta['time']}, {meta['pack_version']}, git {meta['git_commit']}; " \
            + ", ".join(meta["versions"]) + f"; imgpack extension sha256 {meta.get('imgpack_extension', '?').split()[-1]}.\n"
    return text


def cold_table(summary: dict, meta: dict) -> str:
    lines = [
        f"### Cold random reads: {meta['reads']:,} distinct random samples of {meta['images']:,} "
        f"(~98 kB JPEGs), one at a time, every byte copied; page cache evicted ({meta['evict']}) "
        f"before each run; medians over {meta['cold_rounds']} round{'s' if meta['cold_rounds'] != 1 else ''}",
        "",
        "| reader | p50 µs | p90 µs | p99 µs | mean µs | p50 range µs | all reads s | resident before MB "
        "| in cache after MB | ÷ imgpack-lmdb p50 | ÷ imgpack-lmdb p90 | ÷ imgpack-lmdb all reads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = summary.get("imgpack-lmdb", {})
    for name, s in summary.items():
        if not s.get("n"):
            lines.append(f"| {COLD_LABELS[name]} | failed | | | | | | | | | | |")
            continue
        r50 = f"{s['p50_us'] / base['p50_us']:.2f}" if base.get("n") else "n/a"
        r90 = f"{s['p90_us'] / base['p90_us']:.2f}" if base.get("n") else "n/a"
        rtot = f"{s['total_s'] / base['total_s']:.2f}" if base.get("n") else "n/a"
        res = "n/a" if s["resident_mb"] is None else f"{s['resident_mb']:.1f}"
        aft = "n/a" if s["cached_after_mb"] is None else f"{s['cached_after_mb']:,.0f}"
        lines.append(f"| {COLD_LABELS[name]} | {fmt(s['p50_us'])} | {fmt(s['p90_us'])} | {fmt(s['p99_us'])} | "
                     f"{fmt(s['mean_us'])} | {fmt(s['p50_min'])}–{fmt(s['p50_max'])} | {s['total_s']:.2f} | {res} | {aft} | "
                     f"{r50} | {r90} | {rtot} |")
    ra = meta.get("read_ahead_kb")
    lines += ["", "Each figure is the median over rounds of that run's value; all reads = the sum of the "
              f"{meta['reads']:,} latencies; in cache after = the data files' bytes in the page cache when the run "
              f"ended (the reads copied ~{meta['reads'] * 0.098:,.0f} MB): what readahead pulled in"
              + (f" (the disk's read_ahead_kb is {ra})" if ra else "")
              + "; ratios = this reader's / imgpack-lmdb's (above 1: slower than imgpack)."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------


def default_pack() -> Path:
    venv_pack = Path(pvt.default_python()).parent / "pack"
    return venv_pack if venv_pack.exists() else REPO / "target/release/pack"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, default=None,
                   help="the cached ImageFolder tree [default: OUT/imagenet-like-5k; --quick: OUT/imagenet-like-quick]")
    p.add_argument("--out", type=Path, default=REPO / "bench-out", help="output directory [default: bench-out]")
    p.add_argument("--images", type=int, default=None, help="images in the tree [default: 5000; --quick: 500]")
    p.add_argument("--classes", type=int, default=None, help="classes in the tree [default: 50; --quick: 10]")
    p.add_argument("--rounds", type=int, default=None, help="timed loader rounds [default: 5; --quick: 1]")
    p.add_argument("--warmup-rounds", type=int, default=None,
                   help="untimed rounds of every loader first [default: 1; --quick: 0]")
    p.add_argument("--batch-size", type=int, default=64, help="[default: %(default)s]")
    p.add_argument("--threads", type=int, default=2, help="decode threads / DataLoader workers [default: %(default)s]")
    p.add_argument("--batches", type=int, default=None,
                   help="timed batches per run, after the warm-up batch [default: one epoch minus the warm-up "
                        "batch: images // batch-size - 1]")
    p.add_argument("--reads", type=int, default=None, help="cold random reads per run [default: 1500; --quick: 300]")
    p.add_argument("--cold-rounds", type=int, default=None, help="cold-read rounds [default: 3; --quick: 1]")
    p.add_argument("--only", default=",".join(LOADERS), help=f"loaders to run, from {','.join(LOADERS)}; "
                   "empty to skip [default: all]")
    p.add_argument("--cold-only", default=",".join(COLD_READERS),
                   help=f"cold readers to run, from {','.join(COLD_READERS)}; empty to skip [default: all]")
    p.add_argument("--quiet", type=float, default=None,
                   help="seconds without a compiler process before every timed run; 0 turns the waiting and "
                        "the redoing off [default: 20; --quick: 0]")
    p.add_argument("--max-other", type=float, default=0.15,
                   help="most CPU cores other processes may use, over the 5 s before a timed run and during "
                        "it, or the run waits / is redone [default: %(default)s]")
    p.add_argument("--max-redo", type=int, default=5, help="redo a noisy run at most this often, then keep it "
                   "and say so [default: %(default)s]")
    p.add_argument("--seed", type=int, default=20240601, help="tree generator seed [default: %(default)s]")
    p.add_argument("--jobs", type=int, default=2, help="processes generating the tree [default: %(default)s]")
    p.add_argument("--pack", type=Path, default=default_pack(), help="the pack binary [default: %(default)s]")
    p.add_argument("--python", default=pvt.default_python(), help="python with imgpack, torch, torchvision, "
                   "DALI, lmdb [default: %(default)s]")
    p.add_argument("--quick", action="store_true", help="small tree, one round, no quiet wait: a smoke test")
    p.add_argument("--regenerate", action="store_true", help="delete and regenerate the tree")
    p.add_argument("--report", type=Path, metavar="JSON",
                   help="print the tables of an earlier run's loader_vs_peers.json and stop")
    p.add_argument("--child", nargs=3, metavar=("KIND", "NAME", "CTX"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child or args.report:
        return args
    q = args.quick
    args.images = args.images or (500 if q else 5000)
    args.classes = args.classes or (10 if q else 50)
    args.rounds = args.rounds or (1 if q else 5)
    args.warmup_rounds = args.warmup_rounds if args.warmup_rounds is not None else (0 if q else 1)
    args.reads = args.reads or (300 if q else 1500)
    args.cold_rounds = args.cold_rounds or (1 if q else 3)
    args.quiet = args.quiet if args.quiet is not None else (0.0 if q else 20.0)
    if args.tree is None:
        args.tree = args.out / ("imagenet-like-quick" if q else "imagenet-like-5k")
    if args.batches is None:
        args.batches = args.images // args.batch_size - 1
    if args.batches < 1 or args.batches + 1 > args.images // args.batch_size:
        p.error("--batches must be at least 1 and leave room for the warm-up batch within one epoch")
    return args


def main() -> int:
    global MONITOR
    args = parse_args()
    if args.child:
        return child_main(*args.child)
    if args.report:
        raw = json.loads(args.report.read_text())
        raw["summary"], raw["cold_summary"] = summarise(raw)
        print(render(raw))
        return 0
    MONITOR = BuildMonitor()
    out = args.out.resolve()
    tree = args.tree.resolve()
    work = out / ("loader-quick" if args.quick else "loader")
    work.mkdir(parents=True, exist_ok=True)
    record = pvt.ensure_tree(args, tree)
    files = pvt.tree_files(tree)
    n_files = len(files)
    tree_bytes = sum(p.stat().st_size for p in files)
    if n_files != args.images:
        sys.exit(f"error: {tree} holds {n_files} files, expected {args.images}; pass --regenerate")
    args.pack = args.pack.resolve()
    lmdb_path, wds_path = pack_outputs(args, tree, work)
    shards = sorted(wds_path.glob("*.tar"))
    ctx = {"tree": str(tree), "lmdb": str(lmdb_path), "wds": str(wds_path), "batch_size": args.batch_size,
           "threads": args.threads, "batches": args.batches, "classes": args.classes, "samples": n_files,
           "reads": args.reads}
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    if set(names) - set(LOADERS):
        sys.exit(f"error: --only: unknown loader(s) {sorted(set(names) - set(LOADERS))}")
    cold_names = [n.strip() for n in args.cold_only.split(",") if n.strip()]
    if set(cold_names) - set(COLD_READERS):
        sys.exit(f"error: --cold-only: unknown reader(s) {sorted(set(cold_names) - set(COLD_READERS))}")

    logs = work / "logs"
    if logs.exists():
        shutil.rmtree(logs)  # only this run's logs, so none is mistaken for a current one
    logs.mkdir()

    # ---- loaders, warm cache ----
    runs: dict[str, list[dict]] = {n: [] for n in names}
    warmups: dict[str, list[dict]] = {n: [] for n in names}
    if names:
        warm_files = files + [lmdb_path / "data.mdb"] + [p for p in wds_path.iterdir() if p.is_file()]
        print(f"warm-up: reading the tree, the LMDB and the shards once "
              f"({sum(p.stat().st_size for p in warm_files) / MB:,.0f} MB) ...", flush=True)
        pvt.warm_up(warm_files)
        resident = pvt.resident_fraction(warm_files)
        if resident is not None:
            print(f"warm-up: {resident:.1%} of them in the page cache")
    for k in range(args.warmup_rounds + args.rounds if names else 0):
        warming = k < args.warmup_rounds
        rnd = k - args.warmup_rounds
        tag = f"warm-up {k + 1}" if warming else f"round {rnd + 1}/{args.rounds}"
        # Round-robin, rotating which loader goes first each round.
        for name in names[k % len(names):] + names[:k % len(names)]:
            stem = logs / (f"{name}-w{k + 1}" if warming else f"{name}-r{rnd + 1}")
            r = timed(args, "loader", name, dict(ctx, seed=k), stem, quiet=not warming)
            r["round"] = None if warming else rnd + 1
            (warmups if warming else runs)[name].append(r)
            if "problem" in r:
                print(f"{tag:12s} {name:13s} PROBLEM: {r['problem']}", flush=True)
            else:
                print(f"{tag:12s} {name:13s} {r['images_per_s']:8.1f} images/s  first batch {r['first_batch_s']:5.2f}s  "
                      f"cores {r['own_cores']:.2f} (others {r['other_cores']:.2f}, steal {r['steal_cores']:.2f})  "
                      f"RSS {r['peak_rss_mb']:6.0f} MB" + (f"  NOISY: {'; '.join(r['noise'])}" if r["noise"] else ""),
                      flush=True)

    # ---- cold random reads ----
    cold_runs: dict[str, list[dict]] = {n: [] for n in cold_names}
    method = None
    if cold_names:
        data_files = [lmdb_path / "data.mdb"] + shards
        method = pick_evict_method(data_files, sum(p.stat().st_size for p in data_files))
        for k in range(args.cold_rounds):
            for name in cold_names[k % len(cold_names):] + cold_names[:k % len(cold_names)]:
                targets = shards if name == "imgpack-wds" else [lmdb_path / "data.mdb"]

                def before(targets=targets) -> dict:
                    evict(targets, method)
                    return {"resident_before_bytes": resident_bytes(targets)}

                def after(targets=targets) -> dict:
                    return {"resident_after_bytes": resident_bytes(targets)}

                stem = logs / f"cold-{name}-r{k + 1}"
                r = timed(args, "cold", name, dict(ctx, seed=k), stem, quiet=True, before=before, after=after)
                r["round"] = k + 1
                cold_runs[name].append(r)
                if "problem" in r:
                    print(f"cold {k + 1}/{args.cold_rounds} {name:18s} PROBLEM: {r['problem']}", flush=True)
                else:
                    res, aft = r["resident_before_bytes"], r["resident_after_bytes"]
                    print(f"cold {k + 1}/{args.cold_rounds} {name:18s} p50 {r['p50_us']:8.1f} µs  p90 {r['p90_us']:8.1f} µs  "
                          f"p99 {r['p99_us']:8.1f} µs  mean {r['mean_us']:8.1f} µs  resident before "
                          f"{'n/a' if res is None else f'{res / MB:.1f} MB'}, after "
                          f"{'n/a' if aft is None else f'{aft / MB:.1f} MB'}  others {r['other_cores']:.2f} cores"
                          + (f"  NOISY: {'; '.join(r['noise'])}" if r["noise"] else ""), flush=True)

    versions = subprocess.run(
        [args.python, "-c", "import importlib.metadata as m\nfor p in ('imgpack','torch','torchvision',"
         "'nvidia-dali-cuda130','lmdb','pillow','numpy'):\n  try: print(p, m.version(p))\n  except Exception: print(p, '-')"],
        capture_output=True, text=True).stdout.split("\n")
    meta = {
        "images": n_files, "classes": args.classes, "tree": str(tree), "tree_bytes": tree_bytes,
        "tree_stats": record.get("stats"), "batch_size": args.batch_size, "threads": args.threads,
        "batches": args.batches, "rounds": args.rounds, "warmup_rounds": args.warmup_rounds,
        "reads": min(args.reads, n_files), "cold_rounds": args.cold_rounds, "evict": method,
        "quiet_s": args.quiet, "max_other_cores": args.max_other, "machine": pvt.machine_description(),
        "read_ahead_kb": readahead_kb(out), "pack": str(args.pack),
        "pack_version": pvt.tool_version([str(args.pack), "--version"]),
        "git_commit": pvt.tool_version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "shards": [p.name for p in shards], "versions": [v for v in versions if v],
        "imgpack_extension": subprocess.run(
            [args.python, "-c", "import hashlib, imgpack._imgpack as m; print(m.__file__, "
             "hashlib.sha256(open(m.__file__, 'rb').read()).hexdigest()[:16])"],
            capture_output=True, text=True).stdout.strip(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    raw = {"meta": meta, "runs": runs, "warmup_runs": warmups, "cold_runs": cold_runs}
    raw["summary"], raw["cold_summary"] = summarise(raw)
    text = render(raw)
    print()
    print(text)
    (work / "loader_vs_peers.md").write_text(text)
    (work / "loader_vs_peers.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    print(f"wrote {work / 'loader_vs_peers.md'} and {work / 'loader_vs_peers.json'}")
    return 0


def readahead_kb(path: Path) -> int | None:
    """The block device's read_ahead_kb under `path` (what a page fault with readahead reads)."""
    try:
        dev = os.stat(path).st_dev
        sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        for q in (sysfs / "queue/read_ahead_kb", sysfs / "../queue/read_ahead_kb", sysfs / "bdi/read_ahead_kb"):
            if q.exists():
                return int(q.read_text())
    except (OSError, ValueError):
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
