"""`pack plan` from Python: FORMAT.md's plan snippet, run as written, reads a plan whose classes
are torchvision's and whose sample lines are, in order, the samples `pack PLAN` then packs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from interop_util import TESTDATA, read_lmdb, run_doc_snippet


@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_snippet_reads_the_plan_that_pack_packs(shuffle, pack_bin, tmp_path):
    tree = TESTDATA / "imagefolder"
    order = ["--shuffle", "--seed", "7"] if shuffle else []
    subprocess.run([pack_bin, "plan", tree, "-o", tmp_path / "train.plan", "-q", *order], check=True)
    subprocess.run([pack_bin, tmp_path / "train.plan", "--to", "lmdb", "-o", tmp_path / "out", "-q"], check=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        names = run_doc_snippet("FORMAT.md", "plan-snippet")
    header, samples = names["header"], names["samples"]

    reference = ImageFolder(str(tree), allow_empty=True)
    assert header["format"] == "imgpack-plan" and header["version"] == 1, header
    assert header["classes"] == reference.classes
    assert header["samples"] == len(samples) == len(reference.samples)
    assert header["bytes"] == sum(s["size"] for s in samples)
    assert header["options"]["shuffle"] is shuffle
    planned = [(s["path"], s["class"]) for s in samples]
    expected = [(os.path.relpath(p, tree), c) for p, c in reference.samples]
    if shuffle:
        assert planned != expected and sorted(planned) == sorted(expected), "a permutation"
    else:
        assert planned == expected, "torchvision's order"
    for s in samples:
        assert s["size"] == (tree / s["path"]).stat().st_size, s
    # Sample i of the packed dataset is line i of the plan.
    packed = [(p.info["path"], p.label) for p in read_lmdb(tmp_path / "out").samples]
    assert packed == planned
