#!/usr/bin/env python3
"""Benchmark packing straight into an object store against packing to disk and uploading.

    cargo build --release
    ~/.cache/imgpack-venv/bin/python benches/store_upload.py            # 5,000 images, 5 rounds
    ~/.cache/imgpack-venv/bin/python benches/store_upload.py --quick    # smoke test

Issue #17's question: is `pack TREE --to webdataset -o s3://...` at least as good as the
obvious alternative, `pack TREE --to webdataset -o DIR` followed by boto3's multipart
`upload_file` of every file (what a user scripts today)? Against a real S3 server on 127.0.0.1
(SeaweedFS, started and stopped here with tests/interop/s3_server.py), on the ImageNet-like
JPEG tree pack_vs_tar.py generates (cached under bench-out/):

  store       : pack TREE --to webdataset -o s3://bench/rN/ --shard-size SIZE
  disk+upload : pack TREE --to webdataset -o OUT/local --shard-size SIZE, then
                boto3 upload_file (its default TransferConfig: 8 MiB parts, 10 threads) of
                every file, the shards first and imgpack.json last, timed together

alternating for --rounds rounds (the order flips each round), each from a warm page cache with
the previous outputs deleted. Prints the median and range of each, the median of the per-round
ratios store / (disk+upload) with its range, both runs' peak RSS (GNU time), and then
`pack bench-read` of the local shards and the stored copy in one run: the whole-sample ranged
GET latencies the README quotes. The target (issue #17 item 9): ratio <= 1.2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benches"))
sys.path.insert(0, str(REPO / "tests" / "interop"))
import pack_vs_tar as pvt  # noqa: E402  (the tree generator and the machine helpers)
import s3_server  # noqa: E402  (the SeaweedFS the tests use)

BUCKET = "bench"


def upload_dir(client, local: Path, prefix: str) -> None:
    """What a user's script does: every file with boto3's multipart upload_file, the metadata
    last so the prefix is a dataset only when complete."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig()  # boto3's defaults: 8 MiB parts, 10 threads
    files = sorted(p for p in local.iterdir() if p.is_file())
    files.sort(key=lambda p: p.name == "imgpack.json")
    for path in files:
        client.upload_file(str(path), BUCKET, f"{prefix}{path.name}", Config=config)


def clear(client, prefix: str) -> None:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})


def stored_objects(client, prefix: str) -> dict[str, int]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = o["Size"]
    return out


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "bench-out")
    p.add_argument("--images", type=int, default=None, help="[default: 5000; 300 with --quick]")
    p.add_argument("--classes", type=int, default=None, help="[default: 50; 10 with --quick]")
    p.add_argument("--rounds", type=int, default=None, help="[default: 5; 1 with --quick]")
    p.add_argument("--shard-size", default="256MB")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--pack", type=Path, default=REPO / "target/release/pack")
    p.add_argument("--bench-samples", type=int, default=2000, help="reads per bench-read level")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--regenerate", action="store_true")
    args = p.parse_args()
    args.images = args.images or (300 if args.quick else 5000)
    args.classes = args.classes or (10 if args.quick else 50)
    args.rounds = args.rounds or (1 if args.quick else 5)
    out = args.out.resolve()
    tree = out / f"imagenet-like-{args.images}"
    pvt.ensure_tree(args, tree)
    files = pvt.tree_files(tree)
    tree_bytes = sum(f.stat().st_size for f in files)
    logs = out / "logs-store"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"machine: {pvt.machine_description()}; {pvt.tool_version([str(args.pack), '--version'])}")
    print(f"tree: {len(files)} JPEGs, {tree_bytes / 1e6:.0f} MB; shards of {args.shard_size}")

    pvt.remove(out / "seaweedfs-bench")  # a fresh store every run
    server = s3_server.start(out / "seaweedfs-bench")
    try:
        env = server.env()
        os.environ.update(env)  # run_timed's children inherit it: the store's credentials and endpoint
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        local = out / "store-bench-local"
        pack_args = [str(args.pack), str(tree), "--to", "webdataset", "--shard-size", args.shard_size, "-q", "--json"]
        times: dict[str, list[float]] = {"store": [], "disk+upload": [], "upload alone": []}
        rss: dict[str, list[float]] = {"store": [], "disk": []}
        ratios = []
        for r in range(args.rounds):
            order = ["store", "disk+upload"] if r % 2 == 0 else ["disk+upload", "store"]
            got = {}
            for name in order:
                clear(client, "r/")
                pvt.remove(local)
                subprocess.run(["sync"], check=True)
                pvt.warm_up(files)
                time.sleep(1)
                if name == "store":
                    run = pvt.run_timed([*pack_args, "-o", f"s3://{BUCKET}/r/"], logs / f"store-{r}.out", logs / f"store-{r}.err")
                    assert run["exit"] == 0, (logs / f"store-{r}.err").read_text()
                    got[name] = run["wall_s"]
                    rss["store"].append(run["peak_rss_mb"])
                else:
                    started = time.perf_counter()
                    run = pvt.run_timed([*pack_args, "-o", str(local)], logs / f"disk-{r}.out", logs / f"disk-{r}.err")
                    assert run["exit"] == 0, (logs / f"disk-{r}.err").read_text()
                    uploaded = time.perf_counter()
                    upload_dir(client, local, "r/")
                    ended = time.perf_counter()
                    got[name] = ended - started
                    times["upload alone"].append(ended - uploaded)
                    rss["disk"].append(run["peak_rss_mb"])
                assert "imgpack.json" in stored_objects(client, "r/"), f"{name} stored no complete dataset"
            for name, seconds in got.items():
                times[name].append(seconds)
            ratios.append(got["store"] / got["disk+upload"])
            print(f"round {r + 1}: store {got['store']:.2f} s, disk+upload {got['disk+upload']:.2f} s, "
                  f"ratio {ratios[-1]:.2f}", flush=True)
        print()
        print("| way | seconds, median (range) | peak RSS MB (pack) |")
        print("|---|---|---|")
        print(f"| pack -o s3:// | {spread(times['store'])} | {spread(rss['store'])} |")
        print(f"| pack -o DIR + boto3 upload_file | {spread(times['disk+upload'])} | {spread(rss['disk'])} |")
        print(f"| (its upload alone) | {spread(times['upload alone'])} | |")
        print(f"\nstore / (disk+upload), per round: {spread(ratios)}; target <= 1.2: "
              f"{'PASS' if statistics.median(ratios) <= 1.2 and max(ratios) <= 1.2 else 'FAIL'}")

        # Reads: the local shards and their stored copy, in one bench-read run.
        pvt.remove(local)
        assert subprocess.run([*pack_args, "-o", str(local)], capture_output=True).returncode == 0
        clear(client, "r/")
        assert subprocess.run([*pack_args, "-o", f"s3://{BUCKET}/r/"], env=env, capture_output=True).returncode == 0
        bench = subprocess.run(
            [str(args.pack), "bench-read", str(local), f"s3://{BUCKET}/r/", "--samples", str(args.bench_samples), "--json"],
            env=env, capture_output=True, text=True,
        )
        assert bench.returncode == 0, bench.stderr
        print("\n| path | access | threads | samples/s | p50 µs | p99 µs |")
        print("|---|---|---|---|---|---|")
        for line in bench.stdout.splitlines():
            m = json.loads(line)
            print(f"| {'s3 (SeaweedFS, 127.0.0.1)' if m['path'].startswith('s3://') else 'local shards'} | {m['access']} "
                  f"| {m['threads']} | {m['samples_per_s']:.0f} | {m['latency_us']['p50']:.0f} | {m['latency_us']['p99']:.0f} |")
        (out / "store_upload.json").write_text(json.dumps(
            {"times": times, "ratios": ratios, "rss": rss, "bench_read": bench.stdout.splitlines()}, indent=1))
    finally:
        server.stop()
        pvt.remove(out / "store-bench-local")
        pvt.remove(out / "seaweedfs-bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
