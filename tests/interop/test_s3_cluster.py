"""A cluster job with no shared volume, against a real S3 server (SeaweedFS, the `s3_server`
fixture on 127.0.0.1): `pack plan SRC -o s3://...` stores exactly the bytes of a local plan, of a
local tree or of a tree stored under a prefix (the plan then names the prefix, and packing it
reads the images from the store); a stored plan is packed whole or as `--part K/N` just like
the same plan on disk; and `pack merge s3://bucket/out/` on WebDataset parts uploaded there
leaves, object for object, what a local merge of the same parts leaves on disk — also when a
part skipped a corrupt file, so the shards after it are streamed down, renumbered and uploaded
again; and a job with no shared volume at all (a stored tree, plan, parts packed into the store,
merge there) equals the same plan packed and merged on disk. LMDB parts and plans in the
wrong place are refused saying what to do.

Run: PACK=$PWD/target/debug/pack ~/.cache/imgpack-venv/bin/python -m pytest tests/interop/test_s3_cluster.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from interop_util import BAD, IMAGEFOLDER, copy_into, local_files
from interop_util import testdata_images as tree_images  # not collected as a test
from test_s3 import objects, run

PARTS = 3
SHARD = ["--shard-samples", "4", "--md5"]


def upload_tree(client, bucket: str, prefix: str, root: Path) -> None:
    for rel, data in local_files(root).items():
        client.put_object(Bucket=bucket, Key=f"{prefix}{rel}", Body=data)


def ok(proc) -> None:
    assert proc.returncode == 0, proc.stderr


def plan_and_parts(pack_bin, env, tree: Path, work: Path, expect_skipped: bool) -> tuple[Path, Path]:
    """A plan of `tree` and its PARTS WebDataset parts packed locally into `work/parts`."""
    plan = work / "tree.plan"
    ok(run(pack_bin, env, "plan", tree, "-o", plan, "-q"))
    parts = work / "parts"
    for k in range(PARTS):
        proc = run(pack_bin, env, plan, "--part", f"{k}/{PARTS}", "--to", "webdataset", "-o", parts, *SHARD, "-q")
        assert proc.returncode in ((0, 3) if expect_skipped else (0,)), proc.stderr
    return plan, parts


def test_a_plan_written_to_the_store_is_the_local_plan_byte_for_byte(pack_bin, s3_server, bucket, tmp_path):
    env = s3_server.env()
    local = tmp_path / "train.plan"
    ok(run(pack_bin, env, "plan", IMAGEFOLDER, "-o", local, "--shuffle", "--seed", "5", "-q"))
    url = f"s3://{bucket}/plans/train.plan"
    proc = run(pack_bin, env, "plan", IMAGEFOLDER, "-o", url, "--shuffle", "--seed", "5", "--json")
    ok(proc)
    summary = json.loads(proc.stdout)
    assert summary["plan"] == url and summary["samples"] > 0
    stored = objects(s3_server.client(), bucket)
    assert list(stored) == ["plans/train.plan"], "one object, no temporary left behind"
    assert stored["plans/train.plan"] == local.read_bytes()
    # As on disk: an existing plan is kept unless --overwrite.
    again = run(pack_bin, env, "plan", IMAGEFOLDER, "-o", url)
    assert again.returncode != 0 and "--overwrite" in again.stderr, again.stderr
    ok(run(pack_bin, env, "plan", IMAGEFOLDER, "-o", url, "--overwrite", "-q"))
    # --endpoint is honoured without the environment's endpoint.
    bare = {k: v for k, v in env.items() if not k.startswith("AWS_ENDPOINT_URL")}
    ok(run(pack_bin, bare, "plan", IMAGEFOLDER, "-o", url, "--overwrite", "-q", "--endpoint", s3_server.endpoint))


def test_a_stored_plan_packs_whole_and_in_parts_as_the_local_plan(pack_bin, s3_server, bucket, tmp_path):
    env = s3_server.env()
    plan = tmp_path / "train.plan"
    ok(run(pack_bin, env, "plan", IMAGEFOLDER, "-o", plan, "-q"))
    url = f"s3://{bucket}/train.plan"
    s3_server.client().put_object(Bucket=bucket, Key="train.plan", Body=plan.read_bytes())
    for name, args in [("whole", []), ("part", ["--part", f"1/{PARTS}"])]:
        local, remote = tmp_path / f"{name}-local", tmp_path / f"{name}-remote"
        ok(run(pack_bin, env, plan, "--to", "webdataset", "-o", local, *SHARD, *args, "-q"))
        ok(run(pack_bin, env, url, "--to", "webdataset", "-o", remote, *SHARD, *args, "-q"))
        assert local_files(remote) == local_files(local), name
    # Messages name the plan as given, not the temporary copy it is read from.
    proc = run(pack_bin, env, url, "--to", "webdataset", "-o", tmp_path / "x", "--shuffle")
    assert proc.returncode == 2 and f"the plan {url} fixed the order" in proc.stderr, proc.stderr


def test_a_plan_of_a_stored_tree_reads_the_images_from_the_store(pack_bin, s3_server, bucket, tmp_path):
    env = s3_server.env()
    client = s3_server.client()
    upload_tree(client, bucket, "trees/train/", IMAGEFOLDER)
    tree_url = f"s3://{bucket}/trees/train/"
    plan_url = f"s3://{bucket}/plans/train.plan"
    ok(run(pack_bin, env, "plan", tree_url, "-o", plan_url, "-q"))
    local_plan = tmp_path / "train.plan"
    ok(run(pack_bin, env, "plan", tree_url, "-o", local_plan, "-q"))
    assert objects(client, bucket, "plans/")["train.plan"] == local_plan.read_bytes()
    # Packing the plan reads the stored images, as packing the prefix itself does.
    direct, planned = tmp_path / "direct", tmp_path / "planned"
    ok(run(pack_bin, env, tree_url, "--to", "webdataset", "-o", direct, *SHARD, "-q"))
    ok(run(pack_bin, env, plan_url, "--to", "webdataset", "-o", planned, *SHARD, "-q"))
    assert local_files(planned) == local_files(direct)
    # Without its trailing slash the prefix is still the tree: no object has that name.
    no_slash = tmp_path / "no-slash"
    ok(run(pack_bin, env, tree_url.rstrip("/"), "--to", "webdataset", "-o", no_slash, *SHARD, "-q"))
    assert local_files(no_slash) == local_files(direct)
    meta = json.loads((planned / "imgpack.json").read_text())
    assert meta["source"]["root"] == tree_url
    # Every part of it too, on a machine that has no copy of the tree.
    parts = tmp_path / "parts"
    for k in range(PARTS):
        ok(run(pack_bin, env, plan_url, "--part", f"{k}/{PARTS}", "--to", "webdataset", "-o", parts, *SHARD, "-q"))
    ok(run(pack_bin, env, "merge", parts, "-q"))
    assert run(pack_bin, env, "verify", parts, "-q").returncode == 0


def merged_equals_local_merge(pack_bin, s3_server, bucket, tmp_path, tree: Path, expect_skipped: bool) -> dict:
    """Parts of `tree` packed locally, uploaded, merged in the store; compared, object for
    object, with a local merge of a copy of the same parts. Returns the store merge's summary."""
    env = s3_server.env()
    client = s3_server.client()
    _, parts = plan_and_parts(pack_bin, env, tree, tmp_path, expect_skipped)
    upload_tree(client, bucket, "out/", parts)
    local = tmp_path / "local-merge"
    shutil.copytree(parts, local)
    code = 3 if expect_skipped else 0
    assert run(pack_bin, env, "merge", local, "-q").returncode == code
    proc = run(pack_bin, env, "merge", f"s3://{bucket}/out/", "--json")
    assert proc.returncode == code, proc.stderr
    summary = json.loads(proc.stdout)
    assert objects(client, bucket, "out/") == local_files(local)
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads"), "no upload left behind"
    # The merged dataset reads from the store: every checksum holds.
    ok(run(pack_bin, env, "verify", f"s3://{bucket}/out/", "-q"))
    # Merging again does nothing and says so.
    again = run(pack_bin, env, "merge", f"s3://{bucket}/out/", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["already_merged"], again.stdout
    assert objects(client, bucket, "out/") == local_files(local)
    return summary


def test_merging_parts_in_the_store_leaves_what_a_local_merge_leaves(pack_bin, s3_server, bucket, tmp_path):
    summary = merged_equals_local_merge(pack_bin, s3_server, bucket, tmp_path, IMAGEFOLDER, False)
    assert summary["parts"] == PARTS and summary["renumbered_parts"] == 0 and not summary["skipped"]


def test_parts_that_skipped_a_file_are_renumbered_in_the_store(pack_bin, s3_server, bucket, tmp_path):
    images = {rel: IMAGEFOLDER / rel for rel in tree_images()}
    tree = copy_into(tmp_path / "tree", {"cat/000_broken.jpg": BAD / "truncated_header.jpg", **images})
    summary = merged_equals_local_merge(pack_bin, s3_server, bucket, tmp_path, tree, True)
    assert summary["renumbered_parts"] == PARTS - 1, summary
    assert [s["path"] for s in summary["skipped"]] == [str(tree / "cat/000_broken.jpg")], summary
    # A merge stopped after the shards were rewritten, before the dataset files were stored, is
    # run again: the rewritten shards are recognised, and the result is the same.
    client = s3_server.client()
    merged = objects(client, bucket, "out/")
    for name in ["imgpack.json", "imgpack.index", "shardindex.json"]:
        client.delete_object(Bucket=bucket, Key=f"out/{name}")
    proc = run(pack_bin, s3_server.env(), "merge", f"s3://{bucket}/out/", "-q")
    assert proc.returncode == 3, proc.stderr
    assert objects(client, bucket, "out/") == merged


def test_a_merge_in_the_store_names_missing_parts_and_refuses_lmdb(pack_bin, s3_server, bucket, tmp_path):
    env = s3_server.env()
    client = s3_server.client()
    _, parts = plan_and_parts(pack_bin, env, IMAGEFOLDER, tmp_path, False)
    shutil.rmtree(parts / f"part-0001-of-{PARTS:04d}")
    upload_tree(client, bucket, "gap/", parts)
    proc = run(pack_bin, env, "merge", f"s3://{bucket}/gap/")
    assert proc.returncode != 0, proc.stdout
    assert f"part 1 of {PARTS} is missing" in proc.stderr and f"s3://{bucket}/gap/part-0001-of-{PARTS:04d}" in proc.stderr
    assert "imgpack.json" not in objects(client, bucket, "gap/")
    # An interrupted run's temporary directory, synced up with the rest, is named as such.
    client.put_object(Bucket=bucket, Key=f"gap/.part-0001-of-{PARTS:04d}.imgpack-tmp/x.tar", Body=b"x")
    proc = run(pack_bin, env, "merge", f"s3://{bucket}/gap/")
    assert proc.returncode != 0 and f"part 1 of {PARTS} is still being written" in proc.stderr, proc.stderr

    plan = tmp_path / "tree.plan"
    lmdb = tmp_path / "lmdb"
    for k in range(2):
        ok(run(pack_bin, env, plan, "--part", f"{k}/2", "--to", "lmdb", "-o", lmdb, "-q"))
    upload_tree(client, bucket, "lmdb/", lmdb)
    proc = run(pack_bin, env, "merge", f"s3://{bucket}/lmdb/")
    assert proc.returncode != 0
    assert "lmdb" in proc.stderr.lower() and "pack merge DIR" in proc.stderr, proc.stderr

    empty = run(pack_bin, env, "merge", f"s3://{bucket}/nothing/")
    assert empty.returncode != 0 and "holds no parts" in empty.stderr, empty.stderr


def test_stored_plan_locations_that_cannot_work_are_refused(pack_bin, s3_server, bucket, tmp_path):
    env = s3_server.env()
    client = s3_server.client()
    proc = run(pack_bin, env, "plan", IMAGEFOLDER, "-o", f"s3://{bucket}/plans/")
    assert proc.returncode == 2 and "names a prefix" in proc.stderr, proc.stderr
    client.put_object(Bucket=bucket, Key="notaplan", Body=b"hello")
    proc = run(pack_bin, env, f"s3://{bucket}/notaplan", "--to", "webdataset", "-o", tmp_path / "o")
    assert proc.returncode != 0 and "not a plan" in proc.stderr and f"s3://{bucket}/notaplan/" in proc.stderr, proc.stderr


def test_a_job_with_no_shared_volume_at_all(pack_bin, s3_server, bucket, tmp_path):
    # Tree, plan, parts and merge all in the store, one part skipping a corrupt file: object for
    # object what the same plan's parts packed and merged on a local disk leave.
    env, client = s3_server.env(), s3_server.client()
    tree = copy_into(tmp_path / "tree", {rel: rel for rel in tree_images()})
    copy_into(tree, {"cat/zz_truncated.jpg": BAD / "truncated.jpg"})
    upload_tree(client, bucket, "raw/", tree)
    plan_url = f"s3://{bucket}/plans/train.plan"
    ok(run(pack_bin, env, "plan", f"s3://{bucket}/raw/", "-o", plan_url, "-q"))
    out = f"s3://{bucket}/shards/"
    for k in range(PARTS):
        proc = run(pack_bin, env, plan_url, "--part", f"{k}/{PARTS}", "--to", "webdataset", "-o", out, *SHARD, "-q")
        assert proc.returncode in (0, 3), proc.stderr
    assert run(pack_bin, env, "merge", out, "-q").returncode == 3, "the merge reports the skipped file"
    # The same plan, its parts and the merge on disk.
    plan = tmp_path / "train.plan"
    plan.write_bytes(client.get_object(Bucket=bucket, Key="plans/train.plan")["Body"].read())
    local = tmp_path / "shards"
    for k in range(PARTS):
        proc = run(pack_bin, env, plan, "--part", f"{k}/{PARTS}", "--to", "webdataset", "-o", local, *SHARD, "-q")
        assert proc.returncode in (0, 3), proc.stderr
    assert run(pack_bin, env, "merge", local, "-q").returncode == 3
    stored = objects(client, bucket, "shards/")
    assert stored == local_files(local), sorted(set(stored) ^ set(local_files(local)))
    meta = json.loads(stored["imgpack.json"])
    assert meta["samples"] == len(tree_images()) and meta["source"]["root"] == f"s3://{bucket}/raw/"
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    ok(run(pack_bin, env, "verify", out, "-q"))
