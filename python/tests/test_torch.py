"""imgpack.torch.ImageFolder is a drop-in for torchvision.datasets.ImageFolder, in and out of
a DataLoader."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torchvision
from torchvision import transforms

import imgpack
import imgpack.torch
from conftest import ROOT


@pytest.fixture(scope="module")
def reference():
    return torchvision.datasets.ImageFolder(ROOT)


def test_same_listing_as_torchvision(dataset_path, reference):
    ours = imgpack.torch.ImageFolder(dataset_path)
    assert ours.classes == reference.classes
    assert ours.class_to_idx == reference.class_to_idx
    assert ours.samples == reference.samples
    assert ours.imgs == reference.imgs
    assert ours.targets == reference.targets
    assert len(ours) == len(reference)
    assert ours.root == reference.root


def test_same_pixels_and_targets_as_torchvision(dataset_path, reference):
    ours = imgpack.torch.ImageFolder(dataset_path)
    for i in range(len(reference)):
        (a, ta), (b, tb) = ours[i], reference[i]
        assert a.mode == b.mode == "RGB"
        assert ta == tb
        assert a.size == b.size
        assert np.array_equal(np.asarray(a), np.asarray(b)), reference.samples[i][0]


def test_transforms_apply_as_in_torchvision(packed, reference):
    tf = transforms.Compose([transforms.Resize((32, 32)), transforms.PILToTensor()])
    ours = imgpack.torch.ImageFolder(packed["lmdb"], transform=tf, target_transform=lambda t: t * 10)
    theirs = torchvision.datasets.ImageFolder(ROOT, transform=tf, target_transform=lambda t: t * 10)
    for i in (0, 9, 30):
        assert torch.equal(ours[i][0], theirs[i][0])
        assert ours[i][1] == theirs[i][1]


def test_root_can_be_renamed(packed):
    ours = imgpack.torch.ImageFolder(packed["lmdb"], root="/data/train")
    assert ours.samples[0][0].startswith("/data/train/")


def test_pickles_small_and_reads_the_same(packed):
    ours = imgpack.torch.ImageFolder(packed["webdataset"])
    again = pickle.loads(pickle.dumps(ours))
    assert again.samples == ours.samples
    assert np.array_equal(np.asarray(again[4][0]), np.asarray(ours[4][0]))


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("fmt", ["lmdb", "webdataset"])
def test_dataloader_with_two_workers(packed, reference, context, fmt):
    tf = transforms.Compose([transforms.Resize((24, 24)), transforms.PILToTensor()])
    ours = imgpack.torch.ImageFolder(packed[fmt], transform=tf)
    theirs = torchvision.datasets.ImageFolder(ROOT, transform=tf)
    # The parent reads first, so forked workers inherit an open handle.
    assert ours[0][1] == theirs[0][1]
    loader = torch.utils.data.DataLoader(
        ours, batch_size=4, num_workers=2, multiprocessing_context=context, shuffle=False
    )
    images, targets = [], []
    for x, y in loader:
        images.append(x)
        targets.extend(y.tolist())
    assert targets == theirs.targets
    expected = torch.stack([theirs[i][0] for i in range(len(theirs))])
    assert torch.equal(torch.cat(images), expected)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_plain_dataset_in_a_dataloader(packed, context):
    ds = imgpack.open(packed["lmdb"])
    expected = [bytes(s.image) for s in ds]
    loader = torch.utils.data.DataLoader(
        _Bytes(ds), batch_size=None, num_workers=2, multiprocessing_context=context
    )
    assert list(loader) == expected


class _Bytes(torch.utils.data.Dataset):
    """Sample i's image bytes; module level so `spawn` can import it."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return bytes(self.ds[i].image)
