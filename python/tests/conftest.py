"""Fixtures for the Python package's tests. They run against the *installed* package (CI
installs the wheel into a fresh venv), with the `pack` command that package put on PATH.

Every dataset is packed here, by that `pack`, from the repository's testdata/ tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / "testdata" / "imagefolder"
# The tree as `pack` records it and torchvision is given it: the same string.
ROOT = str(TREE)


def pack_command() -> str:
    """The `pack` entry point installed beside this interpreter (never a cargo build)."""
    candidate = Path(sys.executable).parent / "pack"
    assert candidate.is_file(), f"{candidate}: the imgpack package's `pack` entry point is not installed"
    return str(candidate)


def run_pack(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([pack_command(), *map(str, args)], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"pack {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def packed(tmp_path_factory) -> dict:
    """testdata/imagefolder packed both ways, plus a WebDataset in several shards."""
    out = tmp_path_factory.mktemp("packed")
    paths = {
        "lmdb": out / "train.lmdb",
        "webdataset": out / "shards",
        "webdataset_small": out / "small-shards",
    }
    run_pack("imagefolder", ROOT, "--to", "lmdb", "-o", paths["lmdb"], "-q")
    run_pack("imagefolder", ROOT, "--to", "webdataset", "-o", paths["webdataset"], "-q")
    run_pack("imagefolder", ROOT, "--to", "webdataset", "--shard-size", "200kB", "-o", paths["webdataset_small"], "-q")
    return {name: str(path) for name, path in paths.items()}


@pytest.fixture(params=["lmdb", "webdataset", "webdataset_small"])
def dataset_path(request, packed) -> str:
    return packed[request.param]


@pytest.fixture
def copy_of(tmp_path):
    """Copies a dataset directory, for tests that damage it."""

    def copy(path: str) -> str:
        target = tmp_path / (Path(path).name + "-copy")
        shutil.copytree(path, target)
        return str(target)

    return copy


def source_files() -> list:
    """torchvision's samples for the tree: [(path, class index)]."""
    import torchvision

    return torchvision.datasets.ImageFolder(ROOT).samples


@pytest.fixture(scope="session")
def torchvision_samples() -> list:
    return source_files()


os.environ.setdefault("NO_COLOR", "1")
