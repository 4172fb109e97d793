"""imgpack.open: every sample of testdata/ reads back as py-lmdb and tarfile read it, and as
the source tree holds it, with torchvision's labels."""

from __future__ import annotations

import gc
import json
import pickle
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lmdb
import pytest

import imgpack
from conftest import ROOT, run_pack


def py_lmdb_records(path: str) -> dict:
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        records = {bytes(k).decode(): bytes(v) for k, v in txn.cursor()}
    env.close()
    return records


def tar_members(path: str) -> dict:
    members = {}
    for shard in sorted(Path(path).glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                members[member.name] = tar.extractfile(member).read()
    return members


def test_every_sample_matches_the_source_tree_and_torchvision(dataset_path, torchvision_samples):
    ds = imgpack.open(dataset_path)
    import torchvision

    reference = torchvision.datasets.ImageFolder(ROOT)
    assert len(ds) == len(torchvision_samples) == 31
    assert ds.classes == reference.classes
    for i, (path, label) in enumerate(torchvision_samples):
        sample = ds[i]
        assert sample.index == i
        assert sample.label == label
        assert str(Path(ROOT) / sample.path) == path
        assert bytes(sample.image) == Path(path).read_bytes()
        assert set(sample.fields) >= {"cls", "json"}
    # testdata holds one image of every format pack stores, and `image` finds each: the list
    # comes from the format itself, not a copy of it that could miss one.
    from imgpack._dataset import IMAGE_FIELDS

    assert {s.image_format for s in ds} == set(IMAGE_FIELDS) == {"jpg", "png", "webp", "bmp", "tiff", "ppm", "pgm"}


def test_lmdb_fields_equal_py_lmdb_records(packed):
    ds = imgpack.open(packed["lmdb"])
    records = py_lmdb_records(packed["lmdb"])
    seen = 0
    for sample in ds:
        for ext, data in sample.fields.items():
            assert bytes(data) == records[f"{sample.key}.{ext}"], (sample.key, ext)
            seen += 1
    assert seen == sum(1 for k in records if not k.startswith("__"))


@pytest.mark.parametrize("name", ["webdataset", "webdataset_small"])
def test_webdataset_fields_equal_tarfile_members(packed, name):
    ds = imgpack.open(packed[name])
    members = tar_members(packed[name])
    assert len(ds.meta["shards"]) == len(list(Path(packed[name]).glob("*.tar")))
    seen = 0
    for sample in ds:
        for ext, data in sample.fields.items():
            assert bytes(data) == members[f"{sample.key}.{ext}"], (sample.key, ext)
            seen += 1
    assert seen == len(members)


def test_small_shards_really_are_several(packed):
    assert len(list(Path(packed["webdataset_small"]).glob("*.tar"))) >= 3


def test_len_meta_indexing_and_iteration(dataset_path):
    ds = imgpack.open(dataset_path)
    meta = ds.meta
    assert meta["samples"] == len(ds)
    assert meta["classes"] == ds.classes
    assert meta["source"]["root"] == ROOT
    assert ds.format in ("lmdb", "webdataset")
    assert ds[-1].index == len(ds) - 1
    assert bytes(ds[-len(ds)].image) == bytes(ds[0].image)
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds[-len(ds) - 1]
    with pytest.raises(TypeError):
        ds["0"]
    keys = [s.key for s in ds]
    assert keys == sorted(keys) and len(set(keys)) == len(ds)
    assert ds[3].key == keys[3]


def test_fields_are_read_only_zero_copy_views_that_outlive_the_dataset(dataset_path):
    ds = imgpack.open(dataset_path)
    expected = bytes(ds[5].image)
    view = ds[5].image
    assert isinstance(view, memoryview) and view.readonly
    with pytest.raises(TypeError):
        view[0] = 0
    del ds
    gc.collect()
    assert bytes(view) == expected  # the map is still mapped


def test_reads_from_many_threads(dataset_path):
    ds = imgpack.open(dataset_path)
    expected = [bytes(s.image) for s in ds]

    def read(i):
        return bytes(ds[i % len(ds)].image)

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(read, range(len(ds) * 8)))
    assert got == expected * 8


def test_opening_one_path_twice_in_a_process(packed):
    a = imgpack.open(packed["lmdb"])
    b = imgpack.open(packed["lmdb"])
    assert bytes(a[0].image) == bytes(b[0].image)
    del a
    gc.collect()
    assert len(b) == 31
    c = imgpack.open(packed["lmdb"])
    assert bytes(c[30].image) == bytes(b[30].image)


def test_pickles_as_path_and_options(dataset_path):
    ds = imgpack.open(dataset_path, verify_checksums=True)
    blob = pickle.dumps(ds)
    assert len(blob) < 500  # the path and options, not the data
    again = pickle.loads(blob)
    assert again.path == ds.path and again._verify
    assert [bytes(s.image) for s in again] == [bytes(s.image) for s in ds]


def test_merged_parts_read_like_a_single_run(tmp_path, packed):
    plan = tmp_path / "train.plan"
    run_pack("plan", ROOT, "-o", plan)
    for fmt, single in (("lmdb", packed["lmdb"]), ("webdataset", packed["webdataset"])):
        out = tmp_path / f"parts-{fmt}"
        for k in range(2):
            run_pack(plan, "--part", f"{k}/2", "--to", fmt, "-o", out, "-q")
        part_dir = next(p for p in out.iterdir() if p.name.startswith("part-"))
        with pytest.raises(ValueError, match="merge"):
            imgpack.open(out)
        with pytest.raises(ValueError, match="merge"):
            imgpack.open(part_dir)
        run_pack("merge", out, "-q")
        merged, reference = imgpack.open(out), imgpack.open(single)
        assert len(merged) == len(reference)
        for a, b in zip(merged, reference):
            assert (a.key, a.label, a.path, bytes(a.image)) == (b.key, b.label, b.path, bytes(b.image))


def test_verified_reads_of_an_intact_dataset(dataset_path):
    ds = imgpack.open(dataset_path, verify_checksums=True)
    assert sum(len(s.image) for s in ds) > 0


def test_labels_and_paths_in_one_pass(dataset_path, torchvision_samples):
    labels, paths = imgpack.open(dataset_path).labels_and_paths()
    assert labels.dtype.name == "int64"
    assert [(str(Path(ROOT) / p), int(l)) for p, l in zip(paths, labels)] == torchvision_samples


def test_sample_json_field_agrees(dataset_path):
    sample = imgpack.open(dataset_path)[7]
    record = json.loads(bytes(sample.fields["json"]))
    assert record["path"] == sample.path
    assert int(bytes(sample.fields["cls"])) == sample.label
