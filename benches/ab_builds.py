#!/usr/bin/env python3
"""A/B timing of two builds of `pack`, on the commands of pack_vs_tar.py and reencode_vs_opencv.py.

    python benches/ab_builds.py OLD_PACK NEW_PACK [--rounds 5] [--warmup 1] [--settle 5]
    python benches/ab_builds.py --report bench-out/ab_builds.jsonl   # the table again, from raw results

Two groups of commands, each built by the benchmark it comes from (same argv, same tree):

  pack      pack_vs_tar.py's `pack` (--to lmdb) and `pack-wds` (--to webdataset --shard-size 1GB)
            with each binary, and its durable tar (`tar -cf && sync`), on bench-out/imagenet-like
  reencode  reencode_vs_opencv.py's `--mode reencode --resize-shorter 256 --quality 90`, with
            --threads 1 and 2, with each binary, on its 3,000-image subset (no OpenCV run)

A round is one pass over a group: pack group `lmdb A, lmdb B, tar, wds A, wds B`, reencode group
`1t A, 1t B, 2t A, 2t B`, where (A, B) is (OLD, NEW) in even rounds and (NEW, OLD) in odd ones,
so the binaries alternate and each is first equally often. Rounds alternate between the groups.
Every run is preceded, untimed, by deleting its output, `sync` and --settle seconds (as in
pack_vs_tar.py). Before every round the script waits until no compiler (rustc, cc1, cargo,
maturin) and no other benchmark or test (loader_vs_peers.py, pytest) has been seen for --quiet
seconds (pgrep every 2 s), then holds an exclusive flock on --lock for the round; if one of them
appears during the round, the round is discarded (kept in the raw file, marked) and redone.

Raw results: one JSON line per run in --raw (bench-out/ab_builds.jsonl, appended to), each with
its session (one per invocation) and the two builds (`pack --version` and SHA-256); the table of
this session (median seconds, min-max, NEW/OLD ratio of medians, ratio to durable tar, and for
re-encoding each build's 2 threads / 1 thread per round) goes to stdout and
bench-out/ab_builds.md. `--report RAW [--session ID|all]` prints a session's table again.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pack_vs_tar as pvt  # noqa: E402
import reencode_vs_opencv as rvo  # noqa: E402

NOISY_NAMES = "rustc|cc1|cc1plus|cargo|maturin"
NOISY_ARGS = r"loader_vs_peers\.py|pytest"


def noisy() -> str | None:
    """The first compiler / other benchmark running now, or None."""
    for flag, pattern in (("-x", NOISY_NAMES), ("-f", NOISY_ARGS)):
        out = subprocess.run(["pgrep", "-a", flag, pattern], capture_output=True, text=True).stdout.strip()
        if out:
            return out.splitlines()[0][:120]
    return None


def wait_quiet(quiet_s: float) -> None:
    last, since = None, time.monotonic()
    while time.monotonic() - since < quiet_s:
        seen = noisy()
        if seen:
            if seen != last:
                print(f"  waiting: {seen}", flush=True)
            last, since = seen, time.monotonic()
        time.sleep(2)


class Monitor(threading.Thread):
    """Polls for noisy processes during a round; .seen is the first one found."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen, self.stop = None, threading.Event()

    def run(self):
        while not self.stop.is_set() and self.seen is None:
            self.seen = noisy()
            self.stop.wait(1)


def groups(old: Path, new: Path, tree: Path, out: Path, python: str) -> dict[str, dict]:
    """name -> {argv, outputs, check} for every timed command, keyed 'cmd@old' / 'cmd@new'."""
    cmds = {}
    tree_bytes = sum(f.stat().st_size for f in tree.rglob("*") if f.is_file())
    for label, binary in (("old", old), ("new", new)):
        made = pvt.make_commands(SimpleNamespace(pack=binary, python=python, peers_python=python), tree, out, tree_bytes)
        cmds[f"pack@{label}"] = dict(made["pack"], kind="pack")
        cmds[f"pack-wds@{label}"] = dict(made["pack-wds"], kind="pack-wds")
        cmds["tar"] = dict(made["tar"], kind="tar")
        sub = rvo.subset(tree, out, 3000)
        target = out / "reencode.lmdb"
        base = [str(binary), "imagefolder", str(sub), "--to", "lmdb", "-o", str(target), "--overwrite", "-q",
                "--mode", "reencode", "--resize-shorter", "256", "--quality", "90"]
        for t in (1, 2):
            cmds[f"reencode-{t}t@{label}"] = {"argv": base + ["--threads", str(t)], "outputs": [target],
                                               "kind": "reencode", "warm": sub}
    return cmds


def order(group: str, k: int) -> list[str]:
    a, b = ("old", "new") if k % 2 == 0 else ("new", "old")
    if group == "pack":
        return [f"pack@{a}", f"pack@{b}", "tar", f"pack-wds@{a}", f"pack-wds@{b}"]
    return [f"reencode-1t@{a}", f"reencode-1t@{b}", f"reencode-2t@{a}", f"reencode-2t@{b}"]


def build_id(binary: Path) -> str:
    """What `pack --version` says, and the start of the binary's SHA-256: two builds of one
    commit (a dirty tree) still differ."""
    import hashlib
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    return f"{version}, sha256 {hashlib.sha256(binary.read_bytes()).hexdigest()[:12]}"


def report(raw: Path, session: str | None = None) -> str:
    """The table of one session of `raw` (by default the last one appended; "all" for every
    line): a raw file keeps every invocation, and "old" and "new" name different builds in each."""
    runs = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    if session != "all":
        session = session or (runs[-1].get("session") if runs else None)
        runs = [r for r in runs if r.get("session") == session]
    timed = [r for r in runs if not r["warmup"] and not r["discarded"] and not r["problem"]]
    walls: dict[str, list[float]] = {}
    for r in timed:
        walls.setdefault(r["name"], []).append(r["wall_s"])
    med = {n: statistics.median(w) for n, w in walls.items()}
    lines = ["| command | OLD median s (min–max) | NEW median s (min–max) | NEW/OLD | OLD × tar | NEW × tar | rounds |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for cmd in ("pack", "pack-wds", "reencode-1t", "reencode-2t"):
        o, n = walls.get(f"{cmd}@old"), walls.get(f"{cmd}@new")
        if not o or not n:
            continue
        tar = med.get("tar") if cmd.startswith("pack") else None
        x = lambda v: f"{v / tar:.2f}" if tar else "–"  # noqa: E731
        lines.append(f"| {cmd} | {med[cmd + '@old']:.2f} ({min(o):.2f}–{max(o):.2f}) | "
                     f"{med[cmd + '@new']:.2f} ({min(n):.2f}–{max(n):.2f}) | "
                     f"{med[cmd + '@new'] / med[cmd + '@old']:.3f} | {x(med[cmd + '@old'])} | {x(med[cmd + '@new'])} | "
                     f"{len(o)}+{len(n)} |")
    if "tar" in walls:
        t = walls["tar"]
        lines.append(f"| durable tar | {med['tar']:.2f} ({min(t):.2f}–{max(t):.2f}) | | | | | {len(t)} |")
    # The scaling the re-encode target is about: 1 thread / 2 threads of the same build, per round.
    by_round = {(r["name"], r["round"]): r["wall_s"] for r in timed}
    for label in ("old", "new"):
        ratios = [w1 / by_round[(f"reencode-2t@{label}", k)] for (n, k), w1 in sorted(by_round.items(), key=lambda x: x[0][1])
                  if n == f"reencode-1t@{label}" and (f"reencode-2t@{label}", k) in by_round]
        if ratios:
            lines.append(f"{label.upper()} 2 threads / 1 thread per round: {', '.join(f'{x:.2f}' for x in ratios)} "
                         f"(median {statistics.median(ratios):.2f})")
    binaries = sorted({(r.get("old_binary"), r.get("new_binary")) for r in runs} - {(None, None)})
    if binaries:
        lines += [f"Builds: old {o}, new {n}" for o, n in binaries]
    discarded = sum(bool(r["discarded"]) for r in runs)
    lines += ["", "All timed walls (s): " + "; ".join(f"{n}: {', '.join(f'{w:.2f}' for w in ws)}"
                                                  for n, ws in sorted(walls.items())),
              f"Runs discarded for noise: {discarded}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", nargs="?", type=Path)
    p.add_argument("new", nargs="?", type=Path)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per group [default: %(default)s]")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds per group first [default: %(default)s]")
    p.add_argument("--settle", type=float, default=5.0, help="seconds after each sync [default: %(default)s]")
    p.add_argument("--quiet", type=float, default=20.0, help="seconds without noisy processes before a round")
    p.add_argument("--lock", default="/tmp/imgpack-bench.lock", help="flock held during every round")
    p.add_argument("--out", type=Path, default=pvt.REPO / "bench-out")
    p.add_argument("--raw", type=Path, default=None, help="JSON lines, appended [default: OUT/ab_builds.jsonl]")
    p.add_argument("--groups", default="pack,reencode")
    p.add_argument("--report", type=Path, default=None, help="only print the table of this raw file")
    p.add_argument("--session", default=None,
                   help="with --report: the session (invocation) to tabulate, or 'all' [default: the last one]")
    a = p.parse_args()
    if a.report:
        print(report(a.report, a.session), end="")
        return 0
    if not (a.old and a.new):
        p.error("need OLD and NEW binaries")
    out = a.out.resolve()
    raw = a.raw or out / "ab_builds.jsonl"
    tree = out / "imagenet-like"
    pargs = SimpleNamespace(images=15_000, classes=150, seed=20240601, regenerate=False, jobs=2)
    pvt.ensure_tree(pargs, tree)  # the cached tree; refuses one of other parameters
    files = pvt.tree_files(tree)
    n_files, tree_bytes = len(files), sum(f.stat().st_size for f in files)
    cmds = groups(a.old.resolve(), a.new.resolve(), tree, out, pvt.default_python())
    logs = out / "ab_builds-logs"
    logs.mkdir(exist_ok=True)
    lock = open(a.lock, "a")
    # Each invocation is a session of its own in the raw file, named with its builds.
    session = time.strftime("%Y-%m-%dT%H:%M:%S") + f"-{os.getpid()}"
    builds = {"old_binary": f"{a.old} ({build_id(a.old)})", "new_binary": f"{a.new} ({build_id(a.new)})"}
    todo = [(g, k) for k in range(a.warmup + a.rounds) for g in a.groups.split(",")]
    while todo:
        group, k = todo[0]
        warm = k < a.warmup
        wait_quiet(a.quiet)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if noisy():  # appeared while we waited for the lock
                continue
            pvt.warm_up(files if group == "pack" else sorted(cmds["reencode-1t@old"]["warm"].glob("*/*")))
            mon = Monitor()
            mon.start()
            results = []
            for name in order(group, k):
                cmd = cmds[name]
                for o in cmd["outputs"]:
                    pvt.remove(o)
                os.sync()
                time.sleep(a.settle)
                stem = logs / f"{name.replace('@', '-')}-{'w' if warm else 'r'}{k + 1}"
                load = pvt.loadavg()
                r = pvt.run_timed(cmd["argv"], stem.with_suffix(".stdout"), stem.with_suffix(".stderr"))
                if cmd["kind"] == "reencode":
                    r["problem"] = f"exit code {r['exit']}" if r["exit"] else None
                else:
                    r["problem"] = pvt.check_output(cmd["kind"], r, cmd, n_files, tree_bytes,
                                                    stem.with_suffix(".stdout").read_text(errors="replace"))
                r.update(name=name, group=group, round=k + 1, warmup=warm, loadavg_1m_before=load, session=session, **builds,
                         argv=cmd["argv"], time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
                results.append(r)
                print(f"{group} {'warm-up' if warm else 'round'} {k + 1} {name:16s} {r['wall_s']:7.2f}s "
                      f"user {r['user_s']:6.2f} sys {r['sys_s']:6.2f} load {load}"
                      + (f"  PROBLEM: {r['problem']}" if r["problem"] else ""), flush=True)
                for o in cmd["outputs"]:
                    pvt.remove(o)
                if mon.seen:
                    break
            mon.stop.set()
            mon.join()
            for r in results:
                r["discarded"] = mon.seen
            with open(raw, "a") as f:
                for r in results:
                    f.write(json.dumps(r, default=str) + "\n")
            if mon.seen:
                print(f"  discarded, redoing: {mon.seen}", flush=True)
            else:
                todo.pop(0)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    table = report(raw, session)
    (out / "ab_builds.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
