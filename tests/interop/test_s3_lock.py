"""One run at a time writes a store prefix (src/store/lock.rs), against a real S3 server
(SeaweedFS, on 127.0.0.1): a second run on a prefix being written is refused, naming the first
run, and touches nothing of it, even with --overwrite; a killed run's lock is taken over once it
goes stale (3 s in these tests, IMGPACK_STORE_LEASE_SECS); a run whose lock another run takes
over stops, publishes nothing and leaves the other's lock alone; `pack merge` of a prefix
another holds is refused, and takes a stale lock over; a wait for a stale lock is told as it
begins and ends at once on Ctrl-C, for a run and for a merge.

Run: PACK=$PWD/target/debug/pack ~/.cache/imgpack-venv/bin/python -m pytest tests/interop/test_s3_lock.py -q
"""

from __future__ import annotations

import json
import signal
import threading
import time

from interop_util import IMAGEFOLDER, Mount, big_tree, local_files
from test_s3 import META, objects, pending_uploads, run, start_pack, wait_for_checkpoint

LOCK = "imgpack-resume/lock"


def packing(tmp_path, url: str, copies: int = 24) -> list:
    tree = big_tree(tmp_path / "tree", copies=copies)
    # One thread, small shards and chunks: the run lasts seconds, storing shards all along.
    return [tree, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1", "-o", url,
            "--checkpoint-bytes", "64KiB"]


def holder(client, bucket: str, key: str) -> dict:
    return json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())


def local_run(pack_bin, env, tmp_path, args) -> dict:
    local = tmp_path / "local"
    out = args.index("-o")
    assert run(pack_bin, env, *args[:out], "-o", local, *args[out + 2 :]).returncode == 0
    return local_files(local)


def test_a_second_run_on_a_prefix_being_written_is_refused_and_touches_nothing(
    pack_bin, s3_server, slowfs, bucket, tmp_path
):
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/busy/"
    tree = big_tree(tmp_path / "tree", copies=12)
    # The first run reads a slow mount of the tree one file at a time (20 ms a read: ~5 s in
    # all), so it is still writing while the second runs are tried.
    mnt = tmp_path / "mnt"
    args = [mnt, "--to", "webdataset", "--shard-size", "256KiB", "-q", "--threads", "1", "-o", url,
            "--checkpoint-bytes", "64KiB"]
    with Mount(slowfs, tree, mnt, latency_ms=20):
        first = start_pack(pack_bin, env, *args, "--io-threads", "1")
        wait_for_checkpoint(client, bucket, "busy/", first)
        assert holder(client, bucket, "busy/" + LOCK)["pid"] == first.pid
        # The same command again, one that would delete the prefix, one that would resume it:
        # each refused at once, naming the first run.
        for extra in [[], ["--overwrite"], ["--resume"]]:
            second = run(pack_bin, env, *args, *extra)
            assert second.returncode == 1, second.stderr
            assert "another pack run is writing it right now" in second.stderr, second.stderr
            assert f"pid {first.pid} on host" in second.stderr and url in second.stderr, second.stderr
        assert first.poll() is None, "the first run ended before the second ones were refused"
        _, stderr = first.communicate(timeout=300)
        assert first.returncode == 0, stderr
        # The first run was not disturbed: its prefix is a local run's files (of the same
        # source path, which imgpack.json records), and no lock is left.
        assert objects(client, bucket, "busy/") == local_run(pack_bin, env, tmp_path, args)
    assert pending_uploads(client, bucket) == []


def test_a_killed_runs_lock_is_taken_over_once_stale_and_the_run_resumed(pack_bin, s3_server, bucket, tmp_path):
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/taken/"
    args = packing(tmp_path, url, copies=12)
    killed = start_pack(pack_bin, env, *args)
    wait_for_checkpoint(client, bucket, "taken/", killed)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    left = objects(client, bucket, "taken/")
    assert LOCK in left and json.loads(left[LOCK])["pid"] == killed.pid, sorted(left)
    assert META not in left
    started = time.monotonic()
    resumed = run(pack_bin, env, *[a for a in args if a != "-q"], "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "took over the lock" in resumed.stderr and f"pid {killed.pid} on host" in resumed.stderr, resumed.stderr
    assert time.monotonic() - started >= 3, "the lock was taken over before it went stale"
    assert "resumed" in resumed.stdout, resumed.stdout
    assert objects(client, bucket, "taken/") == local_run(pack_bin, env, tmp_path, args)
    assert pending_uploads(client, bucket) == []


def test_a_run_whose_lock_is_taken_over_stops_and_publishes_nothing(pack_bin, s3_server, bucket, tmp_path):
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/lost/"
    args = packing(tmp_path, url)
    proc = start_pack(pack_bin, env, *args)
    wait_for_checkpoint(client, bucket, "lost/", proc)
    # Another run takes the lock over (as one does a stale lock): a new object, a new ETag.
    other = {"pid": 424242, "host": "elsewhere", "since": 0, "renewal": 0}
    client.put_object(Bucket=bucket, Key="lost/" + LOCK, Body=json.dumps(other).encode())
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "lost its lock" in stderr and "pid 424242 on host elsewhere took it over" in stderr, stderr
    left = objects(client, bucket, "lost/")
    assert META not in left, "a run that lost its lock published the dataset"
    assert json.loads(left[LOCK]) == other, "the run deleted or replaced the lock another run holds"
    assert "imgpack-resume/imgpack-resume.json" in left, "the run cleared what the other run now owns"


def test_a_renewal_that_landed_unseen_is_taken_as_the_runs_own(pack_bin, s3_server, bucket, tmp_path):
    # As when a renewal's answer is lost: the object holds a newer write of the same run, with an
    # ETag the run has not seen. Its next renewal fails its If-Match, finds itself named, and
    # goes on.
    env, client = s3_server.env(), s3_server.client()
    url = f"s3://{bucket}/unseen/"
    args = packing(tmp_path, url)
    proc = start_pack(pack_bin, env, *args)
    wait_for_checkpoint(client, bucket, "unseen/", proc)
    own = holder(client, bucket, "unseen/" + LOCK)
    assert own["pid"] == proc.pid
    client.put_object(Bucket=bucket, Key="unseen/" + LOCK, Body=json.dumps({**own, "renewal": own["renewal"] + 1000}).encode())
    assert proc.poll() is None, "the run ended before its lock was rewritten: make the tree bigger"
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert objects(client, bucket, "unseen/") == local_run(pack_bin, env, tmp_path, args)


def test_ctrl_c_while_waiting_for_a_stale_lock_stops_at_once_touching_nothing(pack_bin, s3_server, bucket, tmp_path):
    client = s3_server.client()
    url = f"s3://{bucket}/waiting/"
    other = {"pid": 31337, "host": "gone", "since": 0, "renewal": 0}
    client.put_object(Bucket=bucket, Key="waiting/" + LOCK, Body=json.dumps(other).encode())
    # A 60 s lease: the run would wait a minute before taking the lock over.
    env = s3_server.env(IMGPACK_STORE_LEASE_SECS="60")
    proc = start_pack(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", url)
    stderr = interrupt_the_wait(proc, "pid 31337 on host gone", says="pack: stopping at the next checkpoint, please wait")
    assert "nothing was kept or published" in stderr, stderr
    assert objects(client, bucket, "waiting/") == {LOCK: json.dumps(other).encode()}


def interrupt_the_wait(proc, holder: str, says: str) -> str:
    """Checks that `proc` says it waits for the lock `holder` holds (60 s lease), sends it
    Ctrl-C, and checks that it says `says` and stops at once (exit 130). Returns its stderr."""
    # The wait is told as it begins, also where no progress bar is drawn (stderr is a pipe
    # here, as in a batch job's log): a minute's silence would look like a hang.
    note = first_line(proc.stderr, timeout=10)
    assert note.startswith("note: ") and f"held by {holder}" in note, note
    assert "waiting up to 60 s" in note, note
    assert proc.poll() is None, proc.communicate()
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert time.monotonic() - stopped_at < 10, "Ctrl-C was not seen while waiting for the lock"
    assert says in stderr, stderr
    return stderr


def first_line(stream, timeout: float) -> str:
    """The first line `stream` gives within `timeout` seconds, or "" if none came."""
    line = []
    reader = threading.Thread(target=lambda: line.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return line[0] if line else ""


class Renewing:
    """A lock object under `prefix` rewritten every 0.2 s, as a live run renews its lease."""

    def __init__(self, client, bucket: str, prefix: str, pid: int):
        self.client, self.bucket, self.key, self.pid = client, bucket, prefix + LOCK, pid
        self.stop = threading.Event()
        self.write(0)
        self.thread = threading.Thread(target=self.renew, daemon=True)

    def write(self, renewal: int) -> None:
        holder = {"pid": self.pid, "host": "node07", "since": 0, "renewal": renewal}
        self.client.put_object(Bucket=self.bucket, Key=self.key, Body=json.dumps(holder).encode())

    def renew(self) -> None:
        n = 0
        while not self.stop.wait(0.2):
            n += 1
            self.write(n)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def stored_parts(pack_bin, env, client, bucket, tmp_path, prefix: str) -> dict:
    """Parts of the testdata tree packed locally and uploaded under `prefix`; returns what a local
    merge of them leaves."""
    plan, parts = tmp_path / "tree.plan", tmp_path / "parts"
    assert run(pack_bin, env, "plan", IMAGEFOLDER, "-o", plan, "-q").returncode == 0
    for k in range(2):
        assert run(pack_bin, env, plan, "--part", f"{k}/2", "--to", "webdataset", "-o", parts, "-q").returncode == 0
    for rel, data in local_files(parts).items():
        client.put_object(Bucket=bucket, Key=f"{prefix}{rel}", Body=data)
    assert run(pack_bin, env, "merge", parts, "-q").returncode == 0
    return local_files(parts)


def test_a_merge_is_refused_while_another_holds_the_prefix_and_takes_a_stale_lock_over(
    pack_bin, s3_server, bucket, tmp_path
):
    env, client = s3_server.env(), s3_server.client()
    merged = stored_parts(pack_bin, env, client, bucket, tmp_path, "out/")
    url = f"s3://{bucket}/out/"
    with Renewing(client, bucket, "out/", pid=777):
        busy = run(pack_bin, env, "merge", url)
    assert busy.returncode == 1, busy.stderr
    assert "another pack run is writing it right now" in busy.stderr and "pid 777 on host node07" in busy.stderr
    assert META not in objects(client, bucket, "out/"), "a refused merge stored the dataset"
    # The holder stopped renewing (its lock is still there): taken over once stale, and merged.
    assert LOCK in objects(client, bucket, "out/")
    done = run(pack_bin, env, "merge", url)
    assert done.returncode == 0, done.stderr
    assert "took over the lock" in done.stderr and "pid 777 on host node07" in done.stderr, done.stderr
    assert "note: " in done.stderr and "waiting up to 3 s" in done.stderr, "the merge waited without a word"
    assert objects(client, bucket, "out/") == merged, "the merge left its lock, or differs from a local one"


def test_ctrl_c_stops_a_merge_waiting_for_a_stale_lock_leaving_the_prefix_as_it_was(
    pack_bin, s3_server, bucket, tmp_path
):
    client = s3_server.client()
    stored_parts(pack_bin, s3_server.env(), client, bucket, tmp_path, "stop/")
    other = {"pid": 4040, "host": "gone", "since": 0, "renewal": 0}
    client.put_object(Bucket=bucket, Key="stop/" + LOCK, Body=json.dumps(other).encode())
    before = objects(client, bucket, "stop/")
    # A 60 s lease: the merge would wait a minute before taking the lock over.
    proc = start_pack(pack_bin, s3_server.env(IMGPACK_STORE_LEASE_SECS="60"), "merge", f"s3://{bucket}/stop/")
    # A merge has no checkpoints: it says where it stops instead.
    stderr = interrupt_the_wait(proc, "pid 4040 on host gone", says="pack merge: stopping before the merged dataset is published")
    assert "checkpoint" not in stderr and "--resume" not in stderr, stderr
    assert f"run `pack merge s3://{bucket}/stop/` again" in stderr, stderr
    assert objects(client, bucket, "stop/") == before, "the stopped merge changed the prefix"
