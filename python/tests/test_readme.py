"""The README's Python snippets run as written, against a dataset packed from testdata/."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import REPO, ROOT, run_pack

sys.path.insert(0, str(REPO / "tests" / "interop"))
from interop_util import run_doc_snippet  # noqa: E402  (the interop tests' snippet runner)


@pytest.fixture
def in_dir_with_train_lmdb(tmp_path, monkeypatch):
    run_pack("imagefolder", ROOT, "--to", "lmdb", "-o", tmp_path / "train.lmdb", "-q")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_open_snippet(in_dir_with_train_lmdb, capsys):
    names = run_doc_snippet("README.md", "python-open")
    assert len(names["ds"]) == 31
    assert names["sample"].index == 30
    assert "texture" in capsys.readouterr().out


def test_dataloader_snippet(in_dir_with_train_lmdb):
    names = run_doc_snippet("README.md", "python-dataloader")
    assert tuple(names["images"].shape) == (8, 3, 224, 224)
    assert len(names["labels"]) == 8


def test_loader_snippet(in_dir_with_train_lmdb):
    names = run_doc_snippet("README.md", "python-loader")
    # The last batch of the last epoch: 31 = 3 * 8 + 7.
    assert tuple(names["x"].shape) == (7, 3, 224, 224)
    assert names["y"].dtype.is_floating_point is False
    assert names["loader"].epoch == 1
    assert isinstance(names["images"], np.ndarray)
