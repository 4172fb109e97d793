"""Benchmark `pack --mode reencode` against an OpenCV process pool doing the same work.

In one run, alternating the commands for --rounds rounds on a warm page cache, on a subset of
the ImageNet-like tree that benches/pack_vs_tar.py generates (~500x375 JPEGs):

  pack-1t   pack imagefolder SUB --to lmdb --mode reencode --resize-shorter 256 --quality 90 --threads 1
  pack-2t   the same with --threads 2 (all cores here)
  opencv    benches/opencv_reencode.py SUB OUT --workers 2: a multiprocessing pool doing
            cv2.imdecode, cv2.resize(INTER_AREA) to the same size, cv2.imencode q90, the parent
            writing the results into LMDB (py-lmdb)

It reports images/s, the 2-thread/1-thread scaling of pack and the ratio pack-2t / opencv, with
PASS/FAIL lines for the targets (scaling >= 1.8, ratio >= 2.0). Results go to
bench-out/reencode_vs_opencv.md.

Usage: python benches/reencode_vs_opencv.py [--images 3000] [--rounds 3] [--tree bench-out/imagenet-like]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def subset(tree: Path, out: Path, n: int) -> Path:
    """A tree of symlinks to the first n images (sorted) of `tree`, class folders kept."""
    sub = out / f"reencode-src-{n}"
    if (sub / ".complete").exists():
        return sub
    shutil.rmtree(sub, ignore_errors=True)
    files = sorted(p for p in tree.glob("*/*") if p.is_file())[:n]
    if len(files) < n:
        sys.exit(f"error: {tree} has only {len(files)} images; generate it with benches/pack_vs_tar.py --generate-only")
    for f in files:
        (sub / f.parent.name).mkdir(parents=True, exist_ok=True)
        os.symlink(f.resolve(), sub / f.parent.name / f.name)
    (sub / ".complete").write_text(str(n))
    return sub


def run(argv, env=None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tree", default=str(REPO / "bench-out" / "imagenet-like"))
    p.add_argument("--out", default=str(REPO / "bench-out"))
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pack", default=str(REPO / "target" / "release" / "pack"))
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args()
    out = Path(a.out)
    sub = subset(Path(a.tree), out, a.images)
    for f in sub.glob("*/*"):  # warm the page cache
        f.read_bytes()
    target = out / "reencode.lmdb"
    pack = [a.pack, "imagefolder", str(sub), "--to", "lmdb", "-o", str(target), "--overwrite", "-q",
            "--mode", "reencode", "--resize-shorter", "256", "--quality", "90"]
    commands = {
        "pack-1t": pack + ["--threads", "1"],
        "pack-2t": pack + ["--threads", "2"],
        "opencv": [a.python, str(REPO / "benches" / "opencv_reencode.py"), str(sub), str(target), "--workers", "2"],
    }
    times = {name: [] for name in commands}
    for r in range(a.rounds + 1):  # round 0 is an untimed warm-up
        for name, argv in commands.items():
            shutil.rmtree(target, ignore_errors=True)
            seconds = run(argv)
            if r > 0:
                times[name].append(seconds)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    rate = {name: a.images / s for name, s in med.items()}
    lines = [
        f"### pack --mode reencode --resize-shorter 256 --quality 90 vs an OpenCV pool: {a.images} JPEGs (~500x375), "
        f"warm cache, median of {a.rounds} rounds, {os.cpu_count()} cores",
        "",
        "| command | median s | images/s | x OpenCV pool |",
        "|---|---:|---:|---:|",
    ]
    labels = {
        "pack-1t": "pack --threads 1",
        "pack-2t": "pack --threads 2",
        "opencv": "OpenCV pool, 2 processes (imdecode, INTER_AREA, imencode q90)",
    }
    for name in commands:
        lines.append(f"| {labels[name]} | {med[name]:.2f} | {rate[name]:,.0f} | {rate[name] / rate['opencv']:.2f} |")
    scaling = rate["pack-2t"] / rate["pack-1t"]
    ratio = rate["pack-2t"] / rate["opencv"]
    lines += [
        "",
        f"{'PASS' if scaling >= 1.8 else 'FAIL'}: pack 2 threads / 1 thread = {scaling:.2f} (target >= 1.8)",
        f"{'PASS' if ratio >= 2.0 else 'FAIL'}: pack 2 threads / OpenCV pool = {ratio:.2f} (target >= 2.0)",
    ]
    text = "\n".join(lines)
    print(text)
    (out / "reencode_vs_opencv.md").write_text(text + "\n")
    (out / "reencode_vs_opencv.json").write_text(json.dumps({"times": times, "images": a.images}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
