"""Errors as Python users expect them, with the messages the CLI gives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import imgpack
from conftest import ROOT, run_pack


def cli_error(path) -> str:
    """What `pack verify PATH` says about a path that is no dataset, without `error: `."""
    result = run_pack("verify", path, check=False)
    assert result.returncode != 0
    return result.stderr.strip().removeprefix("error: ").splitlines()[0]


def test_missing_path_is_file_not_found(tmp_path):
    missing = tmp_path / "nothere.lmdb"
    with pytest.raises(FileNotFoundError) as info:
        imgpack.open(missing)
    assert info.value.filename == str(missing)
    assert str(missing) in str(info.value)


def test_foreign_directory_is_value_error_with_the_cli_message(tmp_path):
    with pytest.raises(ValueError) as info:
        imgpack.open(ROOT)
    assert str(info.value) == cli_error(ROOT)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError) as info:
        imgpack.open(empty)
    assert "data.mdb" in str(info.value) and str(empty) in str(info.value)


def test_unfinished_run_is_refused(tmp_path, packed):
    temp = tmp_path / ".train.lmdb.imgpack-tmp"
    os.symlink(packed["lmdb"], temp)
    with pytest.raises(ValueError, match="finished"):
        imgpack.open(temp)


def test_damaged_metadata_is_value_error(copy_of, packed):
    path = copy_of(packed["webdataset"])
    (Path(path) / "imgpack.json").write_text("{not json")
    with pytest.raises(ValueError) as info:
        imgpack.open(path)
    assert "imgpack.json" in str(info.value) or path in str(info.value)


def flip_image_byte(path: str, sample) -> None:
    """Flips one byte of `sample`'s image inside the dataset's files."""
    image = bytes(sample.image)
    for name in ("data.mdb",) + tuple(p.name for p in Path(path).glob("*.tar")):
        file = Path(path) / name
        if not file.exists():
            continue
        data = bytearray(file.read_bytes())
        at = data.find(image)
        if at >= 0:
            data[at + len(image) // 2] ^= 0xFF
            file.write_bytes(bytes(data))
            return
    raise AssertionError("image bytes not found in the dataset files")


@pytest.mark.parametrize("fmt", ["lmdb", "webdataset"])
def test_checksum_damage_raises_checksum_error_naming_the_sample(copy_of, packed, fmt):
    path = copy_of(packed[fmt])
    sample = imgpack.open(path)[12]
    key = sample.key
    del sample
    flip_image_byte(path, imgpack.open(path)[12])
    ds = imgpack.open(path, verify_checksums=True)
    with pytest.raises(imgpack.ChecksumError) as info:
        ds[12]
    assert key in str(info.value) and path in str(info.value)
    assert isinstance(info.value, ValueError)
    # Its neighbours still read, and unverified reads return the damaged bytes.
    assert ds[11].key != key and ds[13].label >= 0
    assert imgpack.open(path)[12].key == key


def test_out_of_range_and_bad_arguments(packed):
    ds = imgpack.open(packed["lmdb"])
    with pytest.raises(IndexError, match="31 samples"):
        ds[31]
    with pytest.raises(IndexError):
        ds.get_batch([0, 99])
    with pytest.raises(ValueError, match="crop"):
        ds.get_batch([0], crop="middle")
    with pytest.raises(ValueError, match="scale"):
        ds.get_batch([0], scale=(0.5, 2.0))
    with pytest.raises(ValueError, match="threads"):
        ds.get_batch([0], threads=0)
    with pytest.raises(ValueError, match="batch_size"):
        imgpack.Loader(ds, batch_size=0)
    with pytest.raises(ValueError, match="rank"):
        imgpack.Loader(ds, batch_size=4, rank=2, world_size=2)
    with pytest.raises(TypeError):
        imgpack.Loader(packed["lmdb"], batch_size=4)


def test_a_part_alone_names_pack_merge(tmp_path):
    plan = tmp_path / "p.plan"
    run_pack("plan", ROOT, "-o", plan)
    out = tmp_path / "parts"
    run_pack(plan, "--part", "0/2", "--to", "webdataset", "-o", out, "-q")
    with pytest.raises(ValueError, match="pack merge"):
        imgpack.open(out)


def test_meta_is_the_recorded_json(packed):
    ds = imgpack.open(packed["webdataset"])
    on_disk = json.loads((Path(packed["webdataset"]) / "imgpack.json").read_text())
    assert ds.meta == on_disk
