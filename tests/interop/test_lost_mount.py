"""A source on a FUSE mount whose daemon dies mid-run (sshfs, s3fs, gcsfuse, a crashed Lustre
client): every file of the mount then answers `ENOTCONN`. pack must stop, name the file and
say to mount again and `--resume`, leave no output that looks complete, and, once the source
is mounted again, `--resume` must finish into exactly what an uninterrupted run writes. It used
to skip every remaining file as "unreadable" and publish a dataset missing most of them.

The mount is benches/slowfs (a read-only FUSE passthrough that sleeps in each read, so the run
is still going when its daemon is killed), built here; it needs /dev/fuse and fusermount3
(Debian's `fuse3`, installed by .ci/run).

Run: PACK=$PWD/target/debug/pack ~/.cache/imgpack-venv/bin/python -m pytest tests/interop/test_lost_mount.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from interop_util import Mount, big_tree, local_files, read_lmdb

JOURNAL = "imgpack-resume.json"


@pytest.mark.parametrize("to", ["webdataset", "lmdb"])
def test_a_mount_lost_mid_run_stops_the_run_and_resume_finishes_it(pack_bin, run_pack, slowfs, tmp_path, to):
    tree = big_tree(tmp_path / "tree", copies=12)
    sources = local_files(tree)
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    temp = tmp_path / ".out.imgpack-tmp"
    # Small checkpoints (the hidden --checkpoint-bytes), so some are taken before the kill.
    args = [mnt, "--to", to, "-o", out, "--threads", "1", "--checkpoint-bytes", "64KiB"]
    if to == "webdataset":
        args += ["--shard-size", "64KiB"]

    with Mount(slowfs, tree, mnt) as mount:
        proc = subprocess.Popen([pack_bin, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not (temp / JOURNAL).exists():
            assert proc.poll() is None, f"pack ended before its first checkpoint: {proc.communicate()}"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        mount.kill()
        stdout, stderr = proc.communicate(timeout=120)
        print(f"--- killed mount: pack exit {proc.returncode}\n{stdout}\n{stderr}")

    # The run stopped as a failure, naming a file of the lost mount and what to do...
    assert proc.returncode == 1, stderr
    assert f"{mnt}/" in stderr and "Transport endpoint is not connected" in stderr, stderr
    assert "mount it again" in stderr and "--resume" in stderr, stderr
    assert "skipped" not in stderr, f"files of the lost mount were skipped as unreadable:\n{stderr}"
    # ... published nothing, and kept what it had packed for --resume.
    assert not out.exists(), f"a run whose source vanished published {sorted(os.listdir(out))}"
    assert (temp / JOURNAL).is_file(), sorted(os.listdir(temp))

    with Mount(slowfs, tree, mnt):
        resumed = run_pack(*args, "--resume", "--json")
        assert resumed.returncode == 0, resumed.stderr
        summary = next(line for line in resumed.stdout.splitlines() if '"summary"' in line)
        uninterrupted = run_pack(*[tmp_path / "whole" if a == out else a for a in args], "-q")
        assert uninterrupted.returncode == 0, uninterrupted.stderr

    summary = json.loads(summary)
    assert summary["resumed"] > 0, summary
    found = len(sources)
    assert (summary["found"], summary["packed"], summary["skipped"]) == (found, found, []), summary
    assert not temp.exists(), "--resume left its temporary behind"
    # What an uninterrupted run writes: file for file, or LMDB record for record, where the
    # images are the source tree's, in its order.
    if to == "lmdb":
        packed = read_lmdb(out)
        assert packed.records == read_lmdb(tmp_path / "whole").records, "resumed output differs"
        assert [s.image for s in packed.samples] == list(sources.values())
    else:
        assert local_files(out) == local_files(tmp_path / "whole"), "resumed output differs"
