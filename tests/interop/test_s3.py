"""`pack ... --to webdataset -o s3://bucket/prefix/` against a real S3 server (SeaweedFS, started
by the `s3_server` fixture on 127.0.0.1): every object byte for byte what a local run writes,
read back by the `webdataset` library over presigned URLs, no multipart upload left behind,
"already exists" and `--overwrite` as on disk, a clear error of its own for bad credentials, a
missing bucket and an unreachable endpoint, no `imgpack.json` after a killed run, nothing left
after Ctrl-C, and a run that outlasts the server being killed and restarted mid-upload.

Run: PACK=$PWD/target/debug/pack ~/.cache/imgpack-venv/bin/python -m pytest tests/interop/test_s3.py -q
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import botocore.exceptions
import pytest
import webdataset as wds

from interop_util import BAD, IMAGEFOLDER, big_tree, check_webdataset_checksums, copy_into, local_files
from interop_util import testdata_images as tree_images  # not collected as a test
import s3_server as server_module
from s3_server import closed_port

META = "imgpack.json"


def run(pack_bin: Path, env: dict, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [str(pack_bin), *(os.fspath(a) for a in args)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=timeout, env=env
    )
    print(f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def objects(client, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """Every object under `prefix` (names relative to it) with its bytes."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            out[key[len(prefix) :]] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return out


def pending_uploads(client, bucket: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.mark.parametrize(
    "options",
    [["--shard-samples", "7"], ["--shard-size", "64KiB", "--md5", "--shuffle", "--seed", "3"]],
    ids=["shard-samples", "shard-size-md5-shuffled"],
)
def test_every_object_is_the_local_run_byte_for_byte(pack_bin, s3_server, bucket, tmp_path, options):
    local = tmp_path / "local"
    ok = run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "webdataset", "-o", local, *options, "-q")
    assert ok.returncode == 0, ok.stderr
    url = f"s3://{bucket}/datasets/train/"
    stored = run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "webdataset", "-o", url, *options, "--json")
    assert stored.returncode == 0, stored.stderr
    assert f'"output":"{url}' in stored.stdout.replace(" ", "") or url.rstrip("/") in stored.stdout

    client = s3_server.client()
    got = objects(client, bucket, "datasets/train/")
    want = local_files(local)
    assert sorted(got) == sorted(want), "the store holds other objects than the local run's files"
    assert any(name.endswith(".tar") for name in got) and {"imgpack.index", META, "shardindex.json"} <= set(got)
    assert any(name.endswith(".idx") for name in got), "no DALI index uploaded"
    for name in want:
        assert got[name] == want[name], f"{name} differs from the local run's"
    assert pending_uploads(client, bucket) == [], "a finished run left multipart uploads behind"
    # And what was stored checks out on its own, through its checksums.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data in got.items():
        (copy / name).write_bytes(data)
    assert len(check_webdataset_checksums(copy)) > 0


def test_a_shard_of_many_parts_is_the_local_shard_byte_for_byte(pack_bin, s3_server, bucket, tmp_path):
    # ~23 MB in one shard: more than two 8 MiB parts, so parts go up while the shard is written.
    tree = big_tree(tmp_path / "tree", copies=70)
    env, client = s3_server.env(), s3_server.client()
    local = tmp_path / "local"
    assert run(pack_bin, env, tree, "--to", "webdataset", "-o", local, "-q").returncode == 0
    shard = local / "shard-000000.tar"
    assert shard.stat().st_size > 2 * 8 * 2**20, "the tree is too small to need three parts"
    proc = run(pack_bin, env, tree, "--to", "webdataset", "-o", f"s3://{bucket}/big/", "-q")
    assert proc.returncode == 0, proc.stderr
    assert objects(client, bucket, "big/") == local_files(local)
    assert pending_uploads(client, bucket) == []


@pytest.mark.parametrize("source", ["lmdb", "plan"])
def test_a_conversion_or_a_plan_stores_what_it_writes_locally(pack_bin, s3_server, bucket, tmp_path, source):
    env = s3_server.env()
    if source == "lmdb":
        src = tmp_path / "train.lmdb"
        made = run(pack_bin, env, IMAGEFOLDER, "--to", "lmdb", "-o", src, "-q")
    else:
        src = tmp_path / "train.plan"
        made = run(pack_bin, env, "plan", IMAGEFOLDER, "-o", src, "--shuffle", "--seed", "5", "-q")
    assert made.returncode == 0, made.stderr
    local = tmp_path / "local"
    assert run(pack_bin, env, src, "--to", "webdataset", "-o", local, "--shard-samples", "6", "-q").returncode == 0
    stored = run(pack_bin, env, src, "--to", "webdataset", "-o", f"s3://{bucket}/{source}/", "--shard-samples", "6", "-q")
    assert stored.returncode == 0, stored.stderr
    assert objects(s3_server.client(), bucket, f"{source}/") == local_files(local)


def peak_rss_mb(pack_bin: Path, env: dict, *args) -> float:
    """Runs `pack *args` and returns its peak resident memory (MB), from the kernel's rusage."""
    proc = subprocess.Popen(
        [str(pack_bin), *(os.fspath(a) for a in args)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    stderr = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, stderr
    return usage.ru_maxrss / 1024


def test_a_large_shard_is_streamed_not_held_in_memory(pack_bin, s3_server, bucket, tmp_path):
    # ~150 MB of JPEGs (hard links to testdata, so building the tree is cheap) in one shard.
    images = [IMAGEFOLDER / f for f in tree_images() if f.lower().endswith((".jpg", ".jpeg"))]
    for n in range(450):
        for image in images:
            dest = tmp_path / "tree" / image.parent.name / f"{n:04d}_{image.name}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(image, dest)
    env = s3_server.env()
    args = [tmp_path / "tree", "--to", "webdataset", "-q", "--threads", "2"]
    local = peak_rss_mb(pack_bin, env, *args, "-o", tmp_path / "local")
    shard_mb = (tmp_path / "local" / "shard-000000.tar").stat().st_size / 2**20
    assert shard_mb > 120
    stored = peak_rss_mb(pack_bin, env, *args, "-o", f"s3://{bucket}/big/")
    print(f"peak RSS: {local:.0f} MB to disk, {stored:.0f} MB to the store, for a {shard_mb:.0f} MB shard")
    # The parts in flight (at most 5 of 8 MiB: 40 MiB; measured 44 MB more) and the HTTP
    # client, not the shard.
    assert stored - local < min(72, shard_mb / 2), f"the store run took {stored - local:.0f} MB more than the local one"
    client = s3_server.client()
    head = client.head_object(Bucket=bucket, Key="big/shard-000000.tar")
    assert head["ContentLength"] == (tmp_path / "local" / "shard-000000.tar").stat().st_size
    assert pending_uploads(client, bucket) == []


def test_the_webdataset_library_reads_it_over_presigned_urls(pack_bin, s3_server, bucket, tmp_path):
    url = f"s3://{bucket}/wds/"
    proc = run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "webdataset", "-o", url, "--shard-samples", "5", "-q")
    assert proc.returncode == 0, proc.stderr
    client = s3_server.client()
    shards = sorted(k for k in objects(client, bucket, "wds/") if k.endswith(".tar"))
    assert len(shards) > 1
    urls = [
        client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": f"wds/{s}"}, ExpiresIn=600)
        for s in shards
    ]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    keys = [s["__key__"] for s in samples]
    assert keys == [f"{i:08d}" for i in range(len(keys))], keys
    # The labels and images are the local tree's, in torchvision's order.
    expected = [(rel.split("/")[0], (IMAGEFOLDER / rel).read_bytes()) for rel in tree_images()]
    classes = sorted({cls for cls, _ in expected})
    assert len(samples) == len(expected)
    for sample, (cls, data) in zip(samples, expected):
        assert int(sample["cls"]) == classes.index(cls)
        image = next(v for k, v in sample.items() if k not in ("__key__", "__url__", "cls", "json", "__local_path__"))
        assert image == data


def test_a_prefix_that_holds_anything_is_refused_and_overwrite_replaces_it(pack_bin, s3_server, bucket, tmp_path):
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/ds/"
    args = [IMAGEFOLDER, "--to", "webdataset", "-o", url, "--shard-samples", "9", "-q"]
    assert run(pack_bin, env, *args).returncode == 0
    first = objects(client, bucket, "ds/")
    again = run(pack_bin, env, *args)
    assert again.returncode == 1
    assert f"{url}: already exists: holds {len(first)} objects (a dataset" in again.stderr
    assert "--overwrite" in again.stderr
    assert objects(client, bucket, "ds/") == first, "a refused run changed the dataset"

    # Not a dataset, but not empty either: refused too.
    client.put_object(Bucket=bucket, Key="other/notes.txt", Body=b"mine")
    other = run(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", f"s3://{bucket}/other", "-q")
    assert other.returncode == 1, other.stderr
    assert "already exists: holds 1 object (but no imgpack.json: not a complete dataset" in other.stderr
    assert objects(client, bucket, "other/") == {"notes.txt": b"mine"}

    # --overwrite: what was under the prefix is gone, the new dataset is whole; a neighbour
    # prefix that merely starts with the same letters is left alone.
    client.put_object(Bucket=bucket, Key="ds/stale-000099.tar", Body=b"old")
    client.put_object(Bucket=bucket, Key="ds-neighbour/keep.txt", Body=b"keep")
    replaced = run(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", url, "--shard-samples", "4", "--overwrite", "-q")
    assert replaced.returncode == 0, replaced.stderr
    local = tmp_path / "local"
    assert run(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", local, "--shard-samples", "4", "-q").returncode == 0
    assert objects(client, bucket, "ds/") == local_files(local)
    assert objects(client, bucket, "ds-neighbour/") == {"keep.txt": b"keep"}


def test_bad_credentials_are_their_own_error_naming_bucket_and_key(pack_bin, s3_server, bucket):
    for overrides, code in [
        ({"AWS_SECRET_ACCESS_KEY": "wrong-secret"}, "SignatureDoesNotMatch"),
        ({"AWS_ACCESS_KEY_ID": "nobody"}, "InvalidAccessKeyId"),
    ]:
        proc = run(pack_bin, s3_server.env(**overrides), IMAGEFOLDER, "--to", "webdataset", "-o", f"s3://{bucket}/x/", "-q")
        assert proc.returncode == 1
        err = proc.stderr
        assert f"s3://{bucket}/x/" in err and f'bucket "{bucket}"' in err and 'key "x/"' in err, err
        assert "denied access" in err and code in err and "AWS_ACCESS_KEY_ID" in err, err
        assert "no bucket" not in err and "cannot connect" not in err
    assert objects(s3_server.client(), bucket) == {}


def test_a_missing_bucket_is_its_own_error_saying_to_create_it(pack_bin, s3_server):
    proc = run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "webdataset", "-o", "s3://no-such-bucket-here/x/", "-q")
    assert proc.returncode == 1
    err = proc.stderr
    assert 'there is no bucket "no-such-bucket-here"' in err and s3_server.endpoint in err, err
    assert "aws s3 mb s3://no-such-bucket-here" in err
    assert "denied" not in err and "cannot connect" not in err


def test_an_unreachable_endpoint_is_its_own_error_and_fails_fast(pack_bin, s3_server, bucket):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    # The flag wins over AWS_ENDPOINT_URL (which names the live server).
    proc = run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "webdataset", "-o", f"s3://{bucket}/x/", "--endpoint", endpoint, "-q")
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    err = proc.stderr
    assert f"cannot connect to the store at {endpoint}" in err and f'bucket "{bucket}"' in err, err
    assert "--endpoint or AWS_ENDPOINT_URL" in err
    assert elapsed < 30, f"an unreachable endpoint took {elapsed:.0f} s to report"
    # The same through the environment variable alone.
    env = s3_server.env(AWS_ENDPOINT_URL=endpoint)
    proc = run(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", f"s3://{bucket}/x/", "-q")
    assert proc.returncode == 1 and f"cannot connect to the store at {endpoint}" in proc.stderr
    # AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL, as in the AWS CLI...
    env = s3_server.env(AWS_ENDPOINT_URL_S3=endpoint)
    proc = run(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", f"s3://{bucket}/x/", "-q")
    assert proc.returncode == 1 and f"cannot connect to the store at {endpoint}" in proc.stderr
    # ...and --endpoint over both: this run reaches the live server.
    proc = run(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", f"s3://{bucket}/x/", "--endpoint", s3_server.endpoint, "-q")
    assert proc.returncode == 0, proc.stderr


def test_what_is_not_supported_yet_is_refused_saying_so(pack_bin, s3_server, bucket):
    proc = run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "lmdb", "-o", f"s3://{bucket}/x/", "-q")
    assert proc.returncode == 2, proc.stderr
    assert "--to lmdb is not supported for object storage yet" in proc.stderr
    assert objects(s3_server.client(), bucket) == {}


def scratch(names) -> list[str]:
    return sorted(n for n in names if n.startswith("imgpack-resume/"))


def test_a_run_that_fails_keeps_its_checkpoint_and_resumes_once_fixed(pack_bin, s3_server, bucket, tmp_path):
    # The bad file is in the last class, after the first chunk of 64 samples, and later chunks
    # are small (the hidden --checkpoint-bytes): shards of the first classes are stored by then.
    tree = big_tree(tmp_path / "tree", copies=6)
    copy_into(tree, {"zzz_last/truncated.jpg": BAD / "truncated.jpg"})
    url = f"s3://{bucket}/failed/"
    args = [tree, "--to", "webdataset", "-o", url, "--shard-samples", "3", "--on-error", "fail", "-q"]
    proc = run(pack_bin, s3_server.env(), *args, "--checkpoint-bytes", "32KiB")
    assert proc.returncode == 1
    assert "truncated.jpg" in proc.stderr and "--on-error fail" in proc.stderr, proc.stderr
    client = s3_server.client()
    left = objects(client, bucket, "failed/")
    assert META not in left and any(k.endswith(".tar") for k in left)
    assert "imgpack-resume/imgpack-resume.json" in left, sorted(left)
    assert pending_uploads(client, bucket) == []
    # Fixed, the run continues from its checkpoint and ends as a run that never failed.
    (tree / "zzz_last" / "truncated.jpg").unlink()
    # The listing changed: --resume says so rather than mixing two trees...
    changed = run(pack_bin, s3_server.env(), *args, "--resume")
    assert changed.returncode == 1 and "the source changed" in changed.stderr and "1 removed" in changed.stderr
    # ...and a run without it discards the interrupted one, saying so, and starts over.
    again = run(pack_bin, s3_server.env(), *args)
    assert again.returncode == 0, again.stderr
    assert f"discarded the unfinished run in {url}" in again.stderr
    local = tmp_path / "local"
    local_args = [tree, "--to", "webdataset", "--shard-samples", "3", "--on-error", "fail", "-o", local, "-q"]
    assert run(pack_bin, s3_server.env(), *local_args).returncode == 0
    assert objects(client, bucket, "failed/") == local_files(local)


def start_pack(pack_bin: Path, env: dict, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [str(pack_bin), *(os.fspath(a) for a in args)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


JOURNAL = "imgpack-resume/imgpack-resume.json"


def wait_for_checkpoint(client, bucket: str, prefix: str, proc: subprocess.Popen) -> None:
    """Waits until the run has stored its first journal under `prefix`: a checkpoint."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix + JOURNAL).get("Contents", [])
        if listed:
            return
        assert proc.poll() is None, f"pack ended (exit {proc.returncode}) before its first checkpoint"
        time.sleep(0.05)
    pytest.fail("no checkpoint was stored within 120 s")


def wait_for_shards(client, bucket: str, prefix: str, proc: subprocess.Popen, count: int) -> None:
    """Waits until `count` shards are stored under `prefix` (the run is mid-upload then)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        if sum(o["Key"].endswith(".tar") for o in listed) >= count:
            return
        assert proc.poll() is None, f"pack ended (exit {proc.returncode}) before {count} shards were stored"
        time.sleep(0.05)
    pytest.fail("no shard was stored within 120 s")


def interrupted_run(pack_bin, env, client, bucket, prefix, *args, shards, sig, checkpoint=False):
    """Starts pack with `args`, waits until it has stored `shards` shards under `prefix` (with
    `checkpoint`, and a journal first), then sends it `sig`. Returns its exit code and stderr."""
    proc = start_pack(pack_bin, env, *args)
    if checkpoint:
        wait_for_checkpoint(client, bucket, prefix, proc)
    wait_for_shards(client, bucket, prefix, proc, shards)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr


def test_a_killed_run_leaves_no_dataset_and_resume_ends_as_an_uninterrupted_run(
    pack_bin, s3_server, bucket, tmp_path
):
    tree = big_tree(tmp_path / "tree", copies=12)
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/killed/"
    args = [tree, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1"]
    # Small chunks (the hidden --checkpoint-bytes), so checkpoints come while shards go up.
    interrupted_run(
        pack_bin, env, client, bucket, "killed/", *args, "-o", url, "--checkpoint-bytes", "64KiB",
        shards=3, sig=signal.SIGKILL, checkpoint=True,
    )
    left = objects(client, bucket, "killed/")
    assert any(k.endswith(".tar") for k in left), "the run was killed before it stored anything"
    assert META not in left, "a killed run left imgpack.json: its prefix looks like a complete dataset"
    assert JOURNAL in left, sorted(left)
    # A reader refuses the prefix, naming what is missing.
    ls = run(pack_bin, env, "info", url)
    assert ls.returncode != 0 and "imgpack.json" in ls.stderr, ls.stderr
    # An upload the killed run started but had not recorded yet (the store lists it), and one of
    # someone else's, outside the prefix.
    client.create_multipart_upload(Bucket=bucket, Key="killed/shard-000099.tar")
    client.create_multipart_upload(Bucket=bucket, Key="elsewhere/big.bin")
    # --resume keeps the stored shards and ends object for object as an uninterrupted run, with
    # the killed run's open uploads aborted and nothing kept for resuming left behind.
    resumed = run(pack_bin, env, *args, "-o", url, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["resumed"] > 0, resumed.stdout
    local = tmp_path / "local"
    assert run(pack_bin, env, *args, "-o", local).returncode == 0
    assert objects(client, bucket, "killed/") == local_files(local)
    assert pending_uploads(client, bucket) == ["elsewhere/big.bin"], "another's upload was aborted"
    # Resuming a finished dataset has nothing to do; without --resume it already exists.
    again = run(pack_bin, env, *[a for a in args if a != "-q"], "-o", url, "--resume")
    assert again.returncode == 0 and "nothing was written" in again.stdout, again.stdout
    exists = run(pack_bin, env, *args, "-o", url)
    assert exists.returncode == 1 and "already exists" in exists.stderr


def test_a_resume_refuses_shards_replaced_behind_its_back(pack_bin, s3_server, bucket, tmp_path):
    tree = big_tree(tmp_path / "tree", copies=12)
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/replaced/"
    args = [tree, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1", "-o", url]
    code, stderr = interrupted_run(pack_bin, env, client, bucket, "replaced/", *args, shards=3, sig=signal.SIGINT)
    assert code == 130, stderr
    key = "replaced/shard-000000.tar"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[700] ^= 0xFF  # same size, other bytes
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    proc = run(pack_bin, env, *args, "--resume")
    assert proc.returncode == 1, proc.stderr
    assert "shard-000000.tar has ETag" in proc.stderr and "it was replaced" in proc.stderr, proc.stderr
    assert "run without --resume to start over" in proc.stderr


def test_a_bucket_deleted_mid_run_stops_it_at_once_naming_the_bucket(pack_bin, s3_server, tmp_path):
    client = s3_server.client()
    client.create_bucket(Bucket="deleted-mid-run")
    tree = big_tree(tmp_path / "tree", copies=48)
    args = [tree, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1"]
    proc = start_pack(pack_bin, s3_server.env(), *args, "-o", "s3://deleted-mid-run/ds/")
    wait_for_shards(client, "deleted-mid-run", "ds/", proc, 2)
    # The run is held still until the store says the bucket is gone (SeaweedFS's delete takes
    # a moment to reach its S3 gateway): else a fast machine can finish first.
    with stopped(proc):
        delete_until_gone(client, "deleted-mid-run")
        started = time.monotonic()
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 1, stderr
    assert 'there is no bucket "deleted-mid-run"' in stderr and "s3://deleted-mid-run/ds/" in stderr, stderr
    # A permanent error is not retried for minutes.
    assert time.monotonic() - started < 60


@contextlib.contextmanager
def stopped(proc: subprocess.Popen):
    """Holds `proc` still (SIGSTOP) while the block changes the store under it."""
    proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


def delete_until_gone(client, bucket: str) -> None:
    """Deletes `bucket` (SeaweedFS deletes one that holds objects) until the store says it is
    gone: a part upload the stopped run had in flight at SeaweedFS's gateway, written after the
    delete, makes the bucket's folder again (seen in CI: the bucket still there 60 s after one
    delete). So the bucket is deleted again every 2 s while it is not gone."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            client.delete_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError:
            pass  # already gone
        if gone_within(client, bucket, 2):
            return
    pytest.fail(f"bucket {bucket} was still there 60 s after it was first deleted")


def wait_until_gone(client, bucket: str) -> None:
    if not gone_within(client, bucket, 60):
        pytest.fail(f"bucket {bucket} was still there 60 s after it was deleted")


def gone_within(client, bucket: str, seconds: float) -> bool:
    """Whether the store says `bucket` is gone within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # Both answers: SeaweedFS's HEAD says "gone" a moment before its listing does.
        try:
            client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError:
            try:
                client.list_objects_v2(Bucket=bucket, MaxKeys=1)
            except botocore.exceptions.ClientError:
                return True
        time.sleep(0.05)
    return False


def test_an_upload_aborted_by_someone_else_is_named_with_the_fix(pack_bin, s3_server, bucket, tmp_path):
    # One shard for the whole run, so its multipart upload is open from start to end; another
    # client aborting it (a second run, a cleanup script) must be told apart from a deleted
    # bucket, which stores also answer with NoSuchUpload.
    tree = big_tree(tmp_path / "tree", copies=48)
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/aborted/"
    proc = start_pack(pack_bin, env, tree, "--to", "webdataset", "-q", "--threads", "1", "-o", url)
    deadline = time.monotonic() + 120
    while not (uploads := client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])):
        assert proc.poll() is None, f"pack ended (exit {proc.returncode}) before its upload was seen"
        assert time.monotonic() < deadline, "no upload was started within 120 s"
        time.sleep(0.02)
    with stopped(proc):  # so the run cannot complete the upload before it is aborted
        for upload in uploads:
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 1, stderr
    assert f"{url}shard-000000.tar: the store at {env['AWS_ENDPOINT_URL']}" in stderr, stderr
    assert "no longer has this run's unfinished upload" in stderr and "only one run" in stderr, stderr
    assert "there is no bucket" not in stderr, stderr
    assert META not in objects(client, bucket, "aborted/")


def test_ctrl_c_stops_at_a_checkpoint_leaves_no_upload_and_resumes(pack_bin, s3_server, bucket, tmp_path):
    tree = big_tree(tmp_path / "tree", copies=12)
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/stopped/"
    args = [tree, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1", "-o", url]
    code, stderr = interrupted_run(pack_bin, env, client, bucket, "stopped/", *args, shards=2, sig=signal.SIGINT)
    assert code == 130, stderr
    assert re.search(rf"interrupted: \d+ samples are safely stored under {re.escape(url)}; run the same command with --resume", stderr), stderr
    left = objects(client, bucket, "stopped/")
    assert META not in left and "imgpack-resume/imgpack-resume.json" in left
    assert pending_uploads(client, bucket) == [], "an interrupted run left a multipart upload"
    resumed = run(pack_bin, env, *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    local = tmp_path / "local"
    assert run(pack_bin, env, *args[:-2], "-o", local).returncode == 0
    assert objects(client, bucket, "stopped/") == local_files(local)


def wait_until_readable(client, bucket: str, key: str) -> None:
    """Waits until `key` reads back: a restarted SeaweedFS answers S3 requests a moment before
    its volume server is back and serving data (InternalError until then)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            client.get_object(Bucket=bucket, Key=key)["Body"].read()
            return
        except botocore.exceptions.ClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_run_killed_with_the_store_resumes_once_it_is_back(pack_bin, tmp_path):
    # The store and the machine go away together (the server killed mid-upload, then the run):
    # once the store is back, --resume aborts the upload the run left open and continues.
    server = server_module.start(tmp_path / "seaweedfs")
    try:
        client = server.client()
        client.create_bucket(Bucket="crashed")
        tree = big_tree(tmp_path / "tree", copies=12)
        args = [tree, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1", "--md5"]
        proc = start_pack(pack_bin, server.env(), *args, "-o", "s3://crashed/ds/", "--checkpoint-bytes", "64KiB")
        wait_for_checkpoint(client, "crashed", "ds/", proc)
        wait_for_shards(client, "crashed", "ds/", proc, 3)
        server.kill()
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        server.restart()
        wait_until_readable(client, "crashed", "ds/" + JOURNAL)
        assert META not in objects(client, "crashed", "ds/")
        resumed = run(pack_bin, server.env(), *args, "-o", "s3://crashed/ds/", "--resume")
        assert resumed.returncode == 0, resumed.stderr
        local = tmp_path / "local"
        assert run(pack_bin, server.env(), *args, "-o", local).returncode == 0
        assert objects(client, "crashed", "ds/") == local_files(local)
        assert pending_uploads(client, "crashed") == []
    finally:
        server.stop()


def test_the_store_going_away_mid_upload_is_retried_until_it_is_back(pack_bin, tmp_path):
    # A server of its own, killed and restarted on the same ports and data.
    server = server_module.start(tmp_path / "seaweedfs")
    try:
        client = server.client()
        client.create_bucket(Bucket="restarted")
        tree = big_tree(tmp_path / "tree", copies=12)
        args = [tree, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1"]
        proc = start_pack(pack_bin, server.env(), *args, "-o", "s3://restarted/ds/")
        wait_for_shards(client, "restarted", "ds/", proc, 2)
        server.kill()
        time.sleep(1.0)
        assert proc.poll() is None, "pack gave up at once when the store went away"
        server.restart()
        _, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr
        local = tmp_path / "local"
        assert run(pack_bin, server.env(), *args, "-o", local).returncode == 0
        assert objects(client, "restarted", "ds/") == local_files(local)
        assert pending_uploads(client, "restarted") == []
    finally:
        server.stop()


def test_parts_of_a_plan_pack_into_the_store_as_into_a_directory(pack_bin, s3_server, bucket, tmp_path):
    # A cluster job with no shared volume: each task packs its part straight into the store;
    # a task killed mid-part and run again (as a scheduler re-queues it) continues it by itself.
    tree = big_tree(tmp_path / "tree", copies=24)
    env, client = s3_server.env(), s3_server.client()
    plan = tmp_path / "train.plan"
    assert run(pack_bin, env, "plan", tree, "-o", plan, "-q").returncode == 0
    options = ["--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1"]
    local = tmp_path / "parts"
    for k in (0, 1, 2):
        assert run(pack_bin, env, plan, "--part", f"{k}/3", *options, "-o", local).returncode == 0
    url = f"s3://{bucket}/parts/"
    interrupted_run(
        pack_bin, env, client, bucket, "parts/part-0001-of-0003/",
        plan, "--part", "1/3", *options, "-o", url, "--checkpoint-bytes", "64KiB",
        shards=2, sig=signal.SIGKILL, checkpoint=True,
    )
    for k in (0, 1, 2):
        proc = run(pack_bin, env, plan, "--part", f"{k}/3", *options, "-o", url, "--json")
        assert proc.returncode == 0, proc.stderr
        assert (json.loads(proc.stdout)["resumed"] > 0) == (k == 1), proc.stdout
    stored = objects(client, bucket, "parts/")
    assert stored == local_files(local), sorted(set(stored) ^ set(local_files(local)))
    assert pending_uploads(client, bucket) == []
    # A finished part run again does nothing.
    again = run(pack_bin, env, plan, "--part", "0/3", *[o for o in options if o != "-q"], "-o", url)
    assert again.returncode == 0 and "nothing was done" in again.stdout + again.stderr, again.stderr
