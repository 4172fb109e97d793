"""Reading a WebDataset where it lives: `pack info` and `pack ls` on `s3://bucket/prefix/`
against a real S3 server (SeaweedFS, the `s3_server` fixture on 127.0.0.1) report what they
report for the same dataset on disk; a prefix that is not a complete dataset is refused naming
what is missing; and each store failure has its own message.

Run: PACK=$PWD/target/debug/pack ~/.cache/imgpack-venv/bin/python -m pytest tests/interop/test_s3_read.py -q
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from interop_util import IMAGEFOLDER, big_tree, local_files
from s3_server import closed_port
from test_s3 import objects, run, start_pack, stopped, wait_until_gone

OPTIONS = ["--shard-samples", "7", "--shuffle", "--seed", "11"]


@pytest.fixture
def stored(pack_bin, s3_server, bucket, tmp_path) -> tuple[Path, str]:
    """testdata packed twice with the same options: to a directory and to the store."""
    local = tmp_path / "local"
    assert run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "webdataset", "-o", local, *OPTIONS, "-q").returncode == 0
    url = f"s3://{bucket}/data/train/"
    proc = run(pack_bin, s3_server.env(), IMAGEFOLDER, "--to", "webdataset", "-o", url, *OPTIONS, "-q")
    assert proc.returncode == 0, proc.stderr
    return local, url


def info_json(pack_bin, env, path) -> dict:
    proc = run(pack_bin, env, "info", path, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_info_of_a_stored_dataset_is_the_local_ones(pack_bin, s3_server, bucket, stored):
    local, url = stored
    env = s3_server.env()
    here, there = info_json(pack_bin, env, local), info_json(pack_bin, env, url)
    assert there["path"] == url
    # What is stored is every object under the prefix.
    assert there["bytes_on_disk"] == sum(len(b) for b in objects(s3_server.client(), bucket, "data/train/").values())
    for record in (here, there):
        del record["path"], record["bytes_on_disk"]
    assert there == here
    assert there["samples"] > 0 and sum(there["class_counts"]) == there["samples"]
    # The human-readable form names the prefix.
    text = run(pack_bin, env, "info", url)
    assert text.returncode == 0 and url in text.stdout and " stored" in text.stdout, text.stderr


def test_ls_of_a_stored_dataset_is_the_local_ones(pack_bin, s3_server, stored):
    local, url = stored
    env = s3_server.env()
    here, there = run(pack_bin, env, "ls", local, "--json"), run(pack_bin, env, "ls", url, "--json")
    assert there.returncode == 0, there.stderr
    assert there.stdout == here.stdout
    lines = there.stdout.splitlines()
    assert len(lines) == info_json(pack_bin, env, local)["samples"]
    assert [json.loads(line)["index"] for line in lines] == list(range(len(lines)))
    # A limit stops early; the plain form lists the same samples.
    first = run(pack_bin, env, "ls", url, "-n", "3")
    assert first.returncode == 0 and first.stdout == run(pack_bin, env, "ls", local, "-n", "3").stdout
    assert len(first.stdout.splitlines()) == 3


def test_the_endpoint_flag_wins_over_the_environment(pack_bin, s3_server, stored):
    _, url = stored
    dead = f"http://127.0.0.1:{closed_port()}"
    env = s3_server.env(AWS_ENDPOINT_URL=dead)
    started = time.monotonic()
    proc = run(pack_bin, env, "ls", url, "-n", "1")
    assert proc.returncode == 1
    assert f"cannot connect to the store at {dead}" in proc.stderr, proc.stderr
    assert "--endpoint or AWS_ENDPOINT_URL" in proc.stderr
    assert time.monotonic() - started < 30, "an unreachable endpoint took too long to report"
    proc = run(pack_bin, env, "ls", url, "-n", "1", "--endpoint", s3_server.endpoint)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1, proc.stderr


def test_a_prefix_that_is_not_a_complete_dataset_is_refused_naming_what_is_missing(pack_bin, s3_server, bucket, stored):
    _, url = stored
    env, client = s3_server.env(), s3_server.client()
    names = objects(client, bucket, "data/train/")
    shards = sorted(n for n in names if n.endswith(".tar"))

    def refused(path: str) -> str:
        proc = run(pack_bin, env, "info", path)
        assert proc.returncode == 1, proc.stdout
        assert f"{path}: not a complete imgpack dataset" in proc.stderr, proc.stderr
        return proc.stderr

    # Nothing there at all.
    assert "nothing is stored under this prefix" in refused(f"s3://{bucket}/nowhere/")
    # A shard shorter than the metadata says (replaced by someone).
    client.put_object(Bucket=bucket, Key=f"data/train/{shards[1]}", Body=names[shards[1]][:-512])
    err = refused(url)
    assert f"shard {shards[1]} is {len(names[shards[1]]) - 512} bytes, the metadata says {len(names[shards[1]])}" in err
    # A shard gone.
    client.delete_object(Bucket=bucket, Key=f"data/train/{shards[1]}")
    assert f"shard {shards[1]} listed in imgpack.json is missing" in refused(url)
    # No imgpack.json: what an unfinished (or killed) run leaves.
    client.delete_object(Bucket=bucket, Key="data/train/imgpack.json")
    err = refused(url)
    assert "no imgpack.json" in err and "did not finish" in err, err


def test_read_failures_each_have_their_own_message(pack_bin, s3_server, bucket, stored):
    _, url = stored
    missing = run(pack_bin, s3_server.env(), "info", "s3://no-such-bucket-read/x/")
    assert missing.returncode == 1
    assert 'there is no bucket "no-such-bucket-read"' in missing.stderr, missing.stderr
    denied = run(pack_bin, s3_server.env(AWS_SECRET_ACCESS_KEY="wrong-secret"), "ls", url)
    assert denied.returncode == 1
    assert "denied access" in denied.stderr and "SignatureDoesNotMatch" in denied.stderr, denied.stderr
    assert "may list in that bucket" in denied.stderr
    bad = run(pack_bin, s3_server.env(), "info", "s3://Bad_Bucket/x/")
    assert bad.returncode == 2 and "lower-case" in bad.stderr, bad.stderr


def verify_json(pack_bin, env, path, *extra) -> tuple[int, dict]:
    proc = run(pack_bin, env, "verify", path, "--json", *extra)
    return proc.returncode, json.loads(proc.stdout)


def test_verify_of_a_stored_dataset_checks_what_it_checks_on_disk(pack_bin, s3_server, stored):
    local, url = stored
    env = s3_server.env()
    code, there = verify_json(pack_bin, env, url, "--decode")
    assert code == 0 and there["problems"] == [], there
    _, here = verify_json(pack_bin, env, local, "--decode")
    assert there["path"] == url
    for record in (here, there):
        del record["path"], record["seconds"]
    assert there == here and there["checked"] == there["expected"] > 0
    text = run(pack_bin, env, "verify", url)
    assert text.returncode == 0 and "ok: no problem found" in text.stdout, text.stderr


def test_verify_names_damage_in_the_store(pack_bin, s3_server, bucket, stored):
    _, url = stored
    env, client = s3_server.env(), s3_server.client()
    names = objects(client, bucket, "data/train/")
    shards = sorted(n for n in names if n.endswith(".tar"))
    # One byte flipped inside the second shard's first sample's image, its DALI index gone.
    body = bytearray(names[shards[1]])
    body[512 * 3 + 10] ^= 0xFF
    client.put_object(Bucket=bucket, Key=f"data/train/{shards[1]}", Body=bytes(body))
    idx = shards[2].replace(".tar", ".idx")
    client.delete_object(Bucket=bucket, Key=f"data/train/{idx}")
    code, report = verify_json(pack_bin, env, url)
    assert code == 1
    places = {p["place"]: p["reason"] for p in report["problems"]}
    assert "CRC-32" in places[shards[1]], places
    assert any(place.startswith("sample ") for place in places), places
    assert "not stored under" in places[idx], places
    # A prefix with no imgpack.json is no dataset: an error, not a report.
    client.delete_object(Bucket=bucket, Key="data/train/imgpack.json")
    proc = run(pack_bin, env, "verify", url)
    assert proc.returncode == 1 and "no imgpack.json" in proc.stderr, proc.stderr


def test_merge_and_plan_of_a_stored_dataset_say_what_it_is(pack_bin, s3_server, stored, tmp_path):
    _, url = stored
    env = s3_server.env()
    proc = run(pack_bin, env, "merge", url, "--json")
    assert proc.returncode == 0, proc.stderr
    merged = json.loads(proc.stdout)
    assert merged["already_merged"] and merged["parts"] == 0, merged
    assert "nothing to merge" in run(pack_bin, env, "merge", url).stdout
    proc = run(pack_bin, env, "plan", url, "-o", tmp_path / "x.plan")
    assert proc.returncode == 1 and "has no class folders" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.plan").exists()


@pytest.mark.parametrize("to", ["lmdb", "webdataset", "imagefolder"])
def test_a_stored_dataset_converts_as_the_local_one_does(pack_bin, s3_server, stored, tmp_path, to):
    local, url = stored
    env = s3_server.env()
    extra = ["--shard-samples", "5"] if to == "webdataset" else []
    here, there = tmp_path / f"here-{to}", tmp_path / f"there-{to}"
    assert run(pack_bin, env, local, "--to", to, "-o", here, *extra, "-q").returncode == 0
    proc = run(pack_bin, env, url, "--to", to, "-o", there, *extra, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["packed"] == summary["found"] > 0 and summary["skipped"] == [], summary
    a, b = local_files(here), local_files(there)
    if to == "lmdb":
        # The databases differ only in the recorded source root; every record is compared.
        import lmdb

        def records(path):
            with lmdb.open(str(path), readonly=True, lock=False) as env_:
                with env_.begin() as txn:
                    return {bytes(k): bytes(v) for k, v in txn.cursor()}

        ra, rb = records(here), records(there)
        meta_a, meta_b = json.loads(ra.pop(b"__meta__")), json.loads(rb.pop(b"__meta__"))
        # The checksum record's 24-byte header holds the metadata's CRC; the sample CRCs follow.
        sums_a, sums_b = ra.pop(b"__checksums__"), rb.pop(b"__checksums__")
        assert sums_a[24:] == sums_b[24:] and len(sums_a) > 24
        assert ra == rb
        assert meta_b["source"]["root"] == url and meta_a["source"]["root"] == str(local)
        meta_a["source"]["root"] = meta_b["source"]["root"]
        assert meta_a == meta_b
    elif to == "webdataset":
        assert sorted(a) == sorted(b)
        for name in a:
            if name not in ("imgpack.json", "imgpack.index"):  # they record the source root
                assert a[name] == b[name], name
        assert json.loads(b["imgpack.json"])["source"]["root"] == url
    else:
        assert a == b  # the tree, file for file


def test_a_stored_dataset_converts_into_the_store(pack_bin, s3_server, bucket, stored, tmp_path):
    local, url = stored
    env, client = s3_server.env(), s3_server.client()
    out = f"s3://{bucket}/converted/"
    proc = run(pack_bin, env, url, "--to", "webdataset", "-o", out, "--shard-samples", "4", "-q")
    assert proc.returncode == 0, proc.stderr
    here = tmp_path / "here"
    assert run(pack_bin, env, url, "--to", "webdataset", "-o", here, "--shard-samples", "4", "-q").returncode == 0
    assert objects(client, bucket, "converted/") == {
        p.relative_to(here).as_posix(): p.read_bytes() for p in here.rglob("*") if p.is_file()
    }
    # Into its own prefix, or under it: refused before anything is touched.
    for inside in (url, url + "sub/"):
        proc = run(pack_bin, env, url, "--to", "webdataset", "-o", inside, "--overwrite", "-q")
        assert proc.returncode == 2 and "is inside the source" in proc.stderr, proc.stderr
    assert "imgpack.json" in objects(client, bucket, "data/train/")


def upload_tree(client, bucket: str, prefix: str, root: Path) -> int:
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    for path in files:
        client.put_object(Bucket=bucket, Key=prefix + path.relative_to(root).as_posix(), Body=path.read_bytes())
    return len(files)


def test_an_imagefolder_tree_in_the_store_packs_as_the_local_tree(pack_bin, s3_server, bucket, tmp_path):
    import torchvision

    env, client = s3_server.env(), s3_server.client()
    assert upload_tree(client, bucket, "tree/", IMAGEFOLDER) > 0
    src = f"s3://{bucket}/tree/"
    here, there = tmp_path / "here", tmp_path / "there"
    assert run(pack_bin, env, IMAGEFOLDER, "--to", "webdataset", "-o", here, "--shard-samples", "6", "-q").returncode == 0
    proc = run(pack_bin, env, src, "--to", "webdataset", "-o", there, "--shard-samples", "6", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["packed"] == summary["found"] == 31 and summary["skipped"] == [], summary
    # The shards are the local tree's, byte for byte: same samples, same order, same labels.
    for shard in sorted(here.glob("*.tar")):
        assert (there / shard.name).read_bytes() == shard.read_bytes(), shard.name
    meta = json.loads((there / "imgpack.json").read_text())
    assert meta["source"]["root"] == src and meta["source"]["kind"] == "imagefolder"
    # torchvision's order and labels, for the tree the prefix holds.
    reference = torchvision.datasets.ImageFolder(str(IMAGEFOLDER)).samples
    lines = [json.loads(line) for line in run(pack_bin, env, "ls", there, "--json").stdout.splitlines()]
    assert [(str(IMAGEFOLDER / e["path"]), e["label"]) for e in lines] == reference
    assert meta["classes"] == torchvision.datasets.ImageFolder(str(IMAGEFOLDER)).classes
    # Straight into the store too; `pack imagefolder` names the kind explicitly.
    out = f"s3://{bucket}/shards/"
    proc = run(pack_bin, env, "imagefolder", src, "--to", "webdataset", "-o", out, "--shard-samples", "6", "-q")
    assert proc.returncode == 0, proc.stderr
    stored = objects(client, bucket, "shards/")
    assert all(stored[p.name] == p.read_bytes() for p in here.glob("*.tar"))


def test_a_bad_file_in_a_stored_tree_is_skipped_and_named(pack_bin, s3_server, bucket, tmp_path):
    env, client = s3_server.env(), s3_server.client()
    found = upload_tree(client, bucket, "tree/", IMAGEFOLDER)
    client.put_object(Bucket=bucket, Key="tree/cat/broken.jpg", Body=b"\xff\xd8 not a jpeg")
    proc = run(pack_bin, env, f"s3://{bucket}/tree/", "--to", "lmdb", "-o", tmp_path / "out.lmdb", "--json")
    assert proc.returncode != 0 or "broken.jpg" in proc.stdout
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["found"] == found + 1 and summary["packed"] == found
    assert [s["path"] for s in summary["skipped"]] == [f"s3://{bucket}/tree/cat/broken.jpg"], summary["skipped"]


def test_a_source_bucket_deleted_mid_run_stops_it_rather_than_skipping_every_file(
    pack_bin, s3_server, tmp_path
):
    # A permanent error of the store is not a bad file: the run stops at once with the store's
    # message, instead of skipping each remaining sample for the same reason.
    env, client = s3_server.env(), s3_server.client()
    client.create_bucket(Bucket="source-gone")
    tree = big_tree(tmp_path / "tree", copies=12)
    found = upload_tree(client, "source-gone", "tree/", tree)
    out = tmp_path / "out.lmdb"
    args = ["s3://source-gone/tree/", "--to", "lmdb", "-o", out, "--io-threads", "1", "--threads", "1", "--json"]
    proc = start_pack(pack_bin, env, *args)
    deadline = time.monotonic() + 120
    while not (tmp_path / ".out.lmdb.imgpack-tmp").exists():  # listed: reading has begun
        assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
        time.sleep(0.01)
    with stopped(proc):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket="source-gone"):
            for item in page.get("Contents", []):
                client.delete_object(Bucket="source-gone", Key=item["Key"])
        client.delete_bucket(Bucket="source-gone")
        wait_until_gone(client, "source-gone")
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 1, stderr
    assert 'there is no bucket "source-gone"' in stderr, stderr
    assert stdout.count("cannot read") < found // 2, "the run skipped file after file"
    assert not out.exists()


def test_bench_read_measures_ranged_gets_beside_the_local_copy(pack_bin, s3_server, stored, tmp_path):
    local, url = stored
    env = s3_server.env()
    svg = tmp_path / "reads.svg"
    proc = run(pack_bin, env, "bench-read", local, url, "--samples", "40", "--json", "--plot", svg, timeout=600)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    here = [r for r in records if r["path"] == str(local)]
    there = [r for r in records if r["path"] == url]
    # The default sweeps: local storage to 16 threads, the object store to 64.
    assert [r["threads"] for r in here] == [1, 2, 4, 8, 16]
    assert [r["threads"] for r in there] == [1, 4, 16, 32, 64]
    for r in there:
        assert r["access"] == "ranged GET" and r["format"] == "webdataset", r
        assert r["device"]["transport"] == "object store" and r["device"]["mount_point"] == s3_server.endpoint
        assert r["cache"] == "none (object store)"
        assert r["samples"] == 40 and r["latency_us"]["p50"] > 0
    # Whole samples are read: the same bytes as the local shards' preads of the same samples.
    assert {r["bytes"] for r in there} == {here[0]["bytes"]}
    assert svg.read_text().startswith("<svg")
    table = run(pack_bin, env, "bench-read", url, "--samples", "10", "--threads", "2")
    assert table.returncode == 0, table.stderr
    assert f"storage: object store (S3 API) at {s3_server.endpoint}" in table.stdout, table.stdout


def test_keys_with_spaces_percent_signs_and_accents_read_back_as_named(pack_bin, s3_server, bucket, tmp_path):
    import shutil

    import torchvision

    env, client = s3_server.env(), s3_server.client()
    tree = tmp_path / "tree"
    names = ["a b/x y.jpg", "a b/100%.jpg", "a b/c+d.jpg", "é/ü#1.jpg", "é/sub dir/q=1&r.jpg", "é/sub.x/~t.jpg"]
    image = next(p for p in sorted(IMAGEFOLDER.rglob("*.jpg")))
    for name in names:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image, tree / name)
    upload_tree(client, bucket, "odd/", tree)
    out = tmp_path / "out"
    proc = run(pack_bin, env, f"s3://{bucket}/odd/", "--to", "webdataset", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["packed"] == len(names), proc.stdout
    lines = [json.loads(line) for line in run(pack_bin, env, "ls", out, "--json").stdout.splitlines()]
    reference = torchvision.datasets.ImageFolder(str(tree)).samples
    assert [(str(tree / e["path"]), e["label"]) for e in lines] == reference
    # And a dataset stored under such a prefix opens and lists.
    stored = f"s3://{bucket}/odd name/é+1%/"
    assert run(pack_bin, env, out, "--to", "webdataset", "-o", stored, "-q").returncode == 0
    # Under the key the user wrote, not a percent-encoded one.
    assert "imgpack.json" in objects(client, bucket, "odd name/é+1%/")
    listed = run(pack_bin, env, "ls", stored, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["path"] for line in listed.stdout.splitlines()] == [e["path"] for e in lines]
