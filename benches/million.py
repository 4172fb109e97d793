#!/usr/bin/env python3
"""Memory and time per file of `pack plan`, `pack --to lmdb` and `pack --to webdataset` on trees
of 100,000 to 1,000,000 small files: does anything grow per sample?

    cargo build --release
    ~/.cache/imgpack-venv/bin/python benches/million.py                  # 100k, 300k, 1M files
    ~/.cache/imgpack-venv/bin/python benches/million.py --sizes 100000   # one size

1. Makes (once, cached under --work) an ImageFolder tree per size with 1,000 classes of small
   JPEGs (~1 kB, 32x32, each file its own pixels, so every file is a distinct valid image).
   File names are 20-odd bytes, like ImageNet's (`n01440764_10026.JPEG` is 20).
2. Runs each command, and `tar -cf + sync` of the same tree (the file system's own cost per
   file), under `/usr/bin/time -v` (peak RSS = "Maximum resident set size") with `-q --json`, outputs deleted and `sync` run between runs, warm cache (the tree is read once
   first), --rounds rounds each, alternating commands.
3. Prints a Markdown table: per size and command, median wall s, µs per file, peak RSS MB, and
   the RSS slope between the smallest and largest size in bytes per file — what a 10 M-file tree
   would add — and PASS/FAIL lines for issue #16 item 4 (peak RSS <= 300 MB; µs per file within
   15% from the smallest to the largest size).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RSS_LIMIT_MB = 300.0
FLAT_LIMIT = 1.15


def make_tree(root: Path, files: int, classes: int) -> None:
    """The tree of `files` small JPEGs in `classes` classes, made once (a `.complete` marker)."""
    marker = root / ".complete"
    if marker.exists():
        return
    from PIL import Image  # the interop venv has Pillow

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    started = time.time()
    per_class = files // classes
    base = Image.new("RGB", (32, 32))
    for c in range(classes):
        d = root / f"n{c:08d}"
        d.mkdir()
        for i in range(per_class):
            n = c * per_class + i
            # Distinct pixels per file: a few bytes of the index painted in.
            img = base.copy()
            img.putpixel((n % 32, (n // 32) % 32), (n & 255, (n >> 8) & 255, (n >> 16) & 255))
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=90)
            (d / f"n{c:08d}_{i:07d}.JPEG").write_bytes(buf.getvalue())
        if c % 100 == 99:
            print(f"  {root.name}: {(c + 1) * per_class:,} files, {time.time() - started:.0f} s", flush=True)
    marker.write_text("ok\n")


def read_tree(root: Path) -> None:
    """Reads every file once, so every timed run starts warm."""
    subprocess.run(["bash", "-c", f"find {root} -type f -print0 | xargs -0 cat > /dev/null"], check=True)


def timed(argv: list[str]) -> dict:
    """Runs argv under /usr/bin/time -v; wall seconds and peak RSS in MB."""
    started = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True)
    wall = time.perf_counter() - started
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{argv} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return {"wall": wall, "rss_mb": rss_kb / 1024, "stdout": proc.stdout}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/imgpack-million"), help="trees and outputs [default: %(default)s]")
    p.add_argument("--sizes", default="100000,300000,1000000", help="tree sizes, comma-separated [default: %(default)s]")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--pack", type=Path, default=REPO / "target/release/pack")
    p.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    pack = str(args.pack)
    results: dict[tuple[int, str], list[dict]] = {}
    for size in sizes:
        tree = args.work / f"tree-{size}"
        make_tree(tree, size, args.classes)
        read_tree(tree)
        out = args.work / "out"
        commands = {
            "pack plan": [pack, "plan", str(tree), "-o", str(out / "t.plan"), "--overwrite", "-q", "--json"],
            "pack --to lmdb": [pack, str(tree), "--to", "lmdb", "-o", str(out / "t.lmdb"), "--overwrite", "-q", "--json"],
            "pack --to webdataset": [pack, str(tree), "--to", "webdataset", "-o", str(out / "t.wds"), "--shuffle",
                                     "--overwrite", "-q", "--json"],
            # The file system's own cost per file: does it grow with the tree too?
            "tar -cf + sync": ["bash", "-c", 'tar -cf "$1" -C "$2" . && sync "$1"', "bash", str(out / "t.tar"), str(tree)],
        }
        for r in range(args.rounds):
            for name, argv in commands.items():
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                subprocess.run(["sync"], check=True)
                result = timed(argv)
                if name.startswith("pack"):
                    summary = json.loads(result["stdout"].strip().splitlines()[-1])
                    got = summary.get("samples", summary.get("packed"))
                    if got != size - size % args.classes:
                        raise SystemExit(f"{name} on {size}: {got} samples: {summary}")
                del result["stdout"]
                results.setdefault((size, name), []).append(result)
                print(f"  {size:>9,} {name:<22} round {r + 1}: {result['wall']:.2f} s, {result['rss_mb']:.0f} MB", flush=True)
        shutil.rmtree(out, ignore_errors=True)

    print(f"\n### pack on trees of small files ({args.classes} classes, ~1 kB JPEGs), warm cache, "
          f"median of {args.rounds} rounds, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print("| files | command | median s | µs per file | peak RSS MB |")
    print("|---:|---|---:|---:|---:|")
    for (size, name), runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        rss = max(r["rss_mb"] for r in runs)
        print(f"| {size:,} | `{name}` | {wall:.2f} | {wall / size * 1e6:.1f} | {rss:.0f} |")
    lo, hi = min(sizes), max(sizes)
    if lo != hi:
        print()
        for name in ("pack plan", "pack --to lmdb", "pack --to webdataset", "tar -cf + sync"):
            a, b = results[(lo, name)], results[(hi, name)]
            rss_a, rss_b = max(r["rss_mb"] for r in a), max(r["rss_mb"] for r in b)
            per_file = (rss_b - rss_a) * 2**20 / (hi - lo)
            us_a = statistics.median(r["wall"] for r in a) / lo * 1e6
            us_b = statistics.median(r["wall"] for r in b) / hi * 1e6
            at_10m = rss_b + per_file * (10_000_000 - hi) / 2**20
            print(f"{name}: RSS slope {per_file:.0f} B per file (10 M files: ~{at_10m:.0f} MB); "
                  f"{us_a:.1f} -> {us_b:.1f} µs per file")
            if not name.startswith("pack"):
                continue
            ok_rss = rss_b <= RSS_LIMIT_MB
            ok_flat = us_b <= us_a * FLAT_LIMIT
            print(f"  {'PASS' if ok_rss else 'FAIL'}: peak RSS {rss_b:.0f} MB at {hi:,} files (<= {RSS_LIMIT_MB:.0f})")
            print(f"  {'PASS' if ok_flat else 'FAIL'}: time per file {us_b / us_a:.2f}x from {lo:,} to {hi:,} (<= {FLAT_LIMIT})")
    if args.json:
        args.json.write_text(json.dumps({f"{s}|{n}": v for (s, n), v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
