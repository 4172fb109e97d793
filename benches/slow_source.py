#!/usr/bin/env python3
"""`pack --to lmdb` from a high-latency source: a FUSE mount that sleeps in each open and read.

    cargo build --release --bin pack
    python3 benches/slow_source.py                       # 5,000 files, 2 ms per open and read, 3 rounds
    python3 benches/slow_source.py --pack old=bench-out/pack-before --pack new=target/release/pack --reencode

ImageFolder trees usually live on NFS, Lustre or a disk, where every open and read waits
milliseconds whatever the CPU does. This benchmark makes such a source out of a local tree:

1. Generates (once, cached) an ImageFolder tree of --images JPEGs of 80-110 kB in --classes
   folders with pack_vs_tar.py's generator (needs numpy and Pillow: the venv python), and reads
   it once so the local copy is in the page cache.
2. Builds (once) and mounts benches/slowfs, a read-only FUSE passthrough of the tree that sleeps
   --latency-ms in each request named by --ops (default: each open and each read of a file).
   The kernel drops a FUSE file's cached pages when it is opened again, so every run pays the
   latency. The mount is always taken down at the end (the shim's SIGTERM, then
   `fusermount3 -u`), even when a run fails or the script is interrupted.
3. Runs, in rounds whose order rotates, for every --pack binary: `pack MNT --to lmdb -o OUT
   --overwrite --quiet --json` with the default thread counts, with each --threads N, and (for
   binaries that have the flag) each --io-threads N; and durable tar of the mount (`tar -cf
   OUT/slow.tar -C MNT . && sync OUT/slow.tar`). With --reencode, also a CPU-bound run on the
   local tree (not the mount) per binary: `--mode reencode --resize-shorter 256`, default threads.
   Each pack run must exit 0 and pack every file (its JSON summary says so). Wall time and CPU
   time (user + system, from the children's rusage) are recorded per run.
4. Prints a Markdown table (median and range of wall seconds, files/s, ratio to the binary's
   best setting on the mount) and one line per binary: its default run on the mount against its
   best --threads/--io-threads setting (target: within 1.2x). Also written to
   OUT/slow_source.md, raw numbers to OUT/slow_source.json. Exits 0 whether targets are met
   or not; it is a benchmark, not a test.

Needs Linux with /dev/fuse and fusermount3 (Debian: `apt-get install -y fuse3`), cargo, GNU tar
and coreutils `sync`. Other processes on the machine (compilers above all) add noise: the script
records the load average before every run; compare rows of one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
VENV_PYTHON = Path.home() / ".cache/imgpack-venv/bin/python"


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}"


def count_files(tree: Path) -> tuple[int, int]:
    files = total = 0
    for root, _dirs, names in os.walk(tree):
        for name in names:
            files += 1
            total += os.path.getsize(os.path.join(root, name))
    return files, total


def warm(tree: Path) -> None:
    """Reads every file once, so the shim's own reads are page-cache hits."""
    for root, _dirs, names in os.walk(tree):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def ensure_tree(args) -> None:
    marker = args.tree.parent / f"{args.tree.name}.complete.json"
    if marker.exists():
        return
    python = args.python if Path(args.python).exists() else sys.executable
    cmd = [python, str(HERE / "pack_vs_tar.py"), "--generate-only", "--images", str(args.images),
           "--classes", str(args.classes), "--tree", str(args.tree)]
    print("generating the tree:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build_shim() -> Path:
    target = REPO / "target/slowfs"
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path", str(HERE / "slowfs/Cargo.toml"),
                    "--target-dir", str(target)], check=True)
    return target / "release/slowfs"


def unmount(mnt: Path) -> None:
    if os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
    if os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)


class Mount:
    """The shim mounted at `mnt` for the duration of a `with` block."""

    def __init__(self, shim: Path, tree: Path, mnt: Path, latency_ms: float, ops: str, threads: int):
        self.cmd = [str(shim), str(tree), str(mnt), "--latency-ms", str(latency_ms), "--ops", ops,
                    "--threads", str(threads)]
        self.mnt = mnt
        self.proc: subprocess.Popen | None = None
        self.served = ""

    def __enter__(self) -> "Mount":
        unmount(self.mnt)  # a mount left by an earlier run that was killed
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("mounted"):
            self.proc.wait()
            raise SystemExit(f"slowfs did not mount: {line}{self.proc.stderr.read()}")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                _, err = self.proc.communicate(timeout=30)
                self.served = err.strip()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        unmount(self.mnt)


def has_flag(pack: Path, flag: str) -> bool:
    out = subprocess.run([str(pack), "imagefolder", "--help"], capture_output=True, text=True).stdout
    return flag in out


def commands(args, mnt: Path, out: Path) -> list[dict]:
    """Every command of a round: {name, binary, kind, argv, output}."""
    cmds = []
    for label, pack in args.pack:
        variants = [("default", [])]
        variants += [(f"--threads {n}", ["--threads", str(n)]) for n in args.threads]
        if has_flag(pack, "--io-threads"):
            variants += [(f"--io-threads {n}", ["--io-threads", str(n)]) for n in args.io_threads]
        for name, extra in variants:
            output = out / f"slow-{label}.lmdb"
            argv = [str(pack), "imagefolder", str(mnt), "--to", "lmdb", "-o", str(output), "--overwrite",
                    "--quiet", "--json", *extra]
            cmds.append({"name": f"{label} {name}", "binary": label, "kind": "mount", "variant": name,
                         "argv": argv, "output": output})
        if args.reencode:
            output = out / f"slow-{label}-reencode.lmdb"
            argv = [str(pack), "imagefolder", str(args.tree), "--to", "lmdb", "-o", str(output), "--overwrite",
                    "--quiet", "--json", "--mode", "reencode", "--resize-shorter", "256"]
            cmds.append({"name": f"{label} reencode, local disk", "binary": label, "kind": "local",
                         "variant": "reencode", "argv": argv, "output": output})
    if args.tar:
        output = out / "slow.tar"
        cmds.append({"name": "durable tar", "binary": "tar", "kind": "mount", "variant": "tar",
                     "argv": ["bash", "-c", f"tar -cf {output} -C {mnt} . && sync {output}"], "output": output})
    return cmds


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def run_one(cmd: dict, files: int) -> dict:
    remove(cmd["output"])
    subprocess.run(["sync"], check=True)
    load = loadavg()
    # CPU time of the run: the growth of this process's reaped children's totals (the shim is
    # a child too, but is reaped only at the end). Less disturbed than wall time by other load.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd["argv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd['name']} failed (exit {proc.returncode}):\n{stderr.decode()[-2000:]}")
    if cmd["binary"] != "tar":
        summary = json.loads(stdout.decode().strip().splitlines()[-1])
        if summary.get("packed") != files:
            raise SystemExit(f"{cmd['name']}: packed {summary.get('packed')} of {files} files")
    remove(cmd["output"])
    return {"name": cmd["name"], "seconds": seconds, "cpu_seconds": cpu, "loadavg_1m_before": load}


def report(args, cmds: list[dict], runs: list[dict], files: int, size: int, served: str) -> str:
    by_name = {c["name"]: [r["seconds"] for r in runs if r["name"] == c["name"]] for c in cmds}
    median = {name: statistics.median(s) for name, s in by_name.items()}
    best = {}
    for c in cmds:
        if c["kind"] == "mount" and c["binary"] != "tar":
            b = best.get(c["binary"])
            if b is None or median[c["name"]] < median[b]:
                best[c["binary"]] = c["name"]
    lines = [
        f"{files:,} files ({size / 1e6:.0f} MB) behind slowfs: {args.latency_ms:g} ms in each {args.ops.replace(',', ', ')}; "
        f"{len(runs) // len(cmds)} rounds; {date.today()}, {machine()}",
        "",
        "| command | median s | min–max s | files/s | CPU s (median) | ÷ best setting |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in cmds:
        s = by_name[c["name"]]
        cpu = statistics.median(r["cpu_seconds"] for r in runs if r["name"] == c["name"])
        ratio = ""
        if c["binary"] in best and c["kind"] == "mount":
            ratio = f"{median[c['name']] / median[best[c['binary']]]:.2f}"
        lines.append(f"| {c['name']} | {median[c['name']]:.2f} | {min(s):.2f}–{max(s):.2f} | "
                     f"{files / median[c['name']]:,.0f} | {cpu:.2f} | {ratio} |")
    lines.append("")
    for binary, name in best.items():
        ratio = median[f"{binary} default"] / median[name]
        verdict = "PASS" if ratio <= 1.2 else "FAIL"
        lines.append(f"{verdict}: {binary} default / best ({name}) on the mount = {ratio:.2f} (target <= 1.2)")
    if served:
        lines.append(f"\nshim: {served}")
    return "\n".join(lines)


def interrupted(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    # Ctrl-C, and SIGTERM too (a background job or a CI runner stopping it), unwind through the
    # `with Mount` block, which takes the mount down. SIGINT is ignored in background jobs.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, default=REPO / "bench-out/slow-src", help="the local tree [default: bench-out/slow-src]")
    p.add_argument("--images", type=int, default=5000, help="images to generate [default: %(default)s]")
    p.add_argument("--classes", type=int, default=100, help="classes to generate [default: %(default)s]")
    p.add_argument("--out", type=Path, default=REPO / "bench-out", help="outputs and results [default: bench-out]")
    p.add_argument("--pack", action="append", default=None, metavar="LABEL=PATH",
                   help="a binary to run, repeatable [default: pack=target/release/pack]")
    p.add_argument("--threads", default="4,8,16,32", help="--threads values to try on the mount [default: %(default)s]")
    p.add_argument("--io-threads", default="8,16,64", help="--io-threads values to try, where the binary has it [default: %(default)s]")
    p.add_argument("--no-tar", dest="tar", action="store_false", help="leave out durable tar")
    p.add_argument("--reencode", action="store_true", help="also a CPU-bound run on the local tree per binary")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds [default: %(default)s]")
    p.add_argument("--latency-ms", type=float, default=2.0, help="the shim's wait per request [default: %(default)s]")
    p.add_argument("--ops", default="open,read",
                   help="requests that wait: open,read,opendir,readdir,lookup,getattr or all [default: %(default)s]")
    p.add_argument("--shim-threads", type=int, default=64, help="requests the shim serves at once [default: %(default)s]")
    p.add_argument("--python", default=str(VENV_PYTHON), help="python with numpy and Pillow, for the generator")
    args = p.parse_args()
    args.pack = [tuple(x.split("=", 1)) if "=" in x else ("pack", x) for x in (args.pack or ["pack=target/release/pack"])]
    args.pack = [(label, Path(path).resolve()) for label, path in args.pack]
    args.threads = [int(x) for x in args.threads.split(",") if x]
    args.io_threads = [int(x) for x in args.io_threads.split(",") if x]
    args.tree = args.tree.resolve()
    args.out = args.out.resolve()
    for _, pack in args.pack:
        if not pack.exists():
            raise SystemExit(f"{pack} does not exist; run `cargo build --release --bin pack` first")
    if not Path("/dev/fuse").exists() or shutil.which("fusermount3") is None:
        raise SystemExit("needs /dev/fuse and fusermount3: apt-get install -y fuse3 (and modprobe fuse)")

    ensure_tree(args)
    files, size = count_files(args.tree)
    warm(args.tree)
    shim = build_shim()
    mnt = args.out / "slow-mnt"
    runs: list[dict] = []
    with Mount(shim, args.tree, mnt, args.latency_ms, args.ops, args.shim_threads) as mount:
        cmds = commands(args, mnt, args.out)
        for round_ in range(args.rounds):
            shift = round_ % len(cmds)
            for cmd in cmds[shift:] + cmds[:shift]:
                run = run_one(cmd, files)
                run["round"] = round_
                runs.append(run)
                print(f"round {round_ + 1}: {run['name']}: {run['seconds']:.2f} s (load {run['loadavg_1m_before']:.2f})",
                      flush=True)
    text = report(args, cmds, runs, files, size, mount.served)
    print()
    print(text)
    (args.out / "slow_source.md").write_text(text + "\n")
    raw = {"date": str(date.today()), "machine": machine(), "files": files, "bytes": size,
           "latency_ms": args.latency_ms, "ops": args.ops, "commands": [{k: str(v) if isinstance(v, Path) else v
                                                                        for k, v in c.items()} for c in cmds],
           "runs": runs, "shim": mount.served}
    (args.out / "slow_source.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
