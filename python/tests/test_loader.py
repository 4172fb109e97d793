"""imgpack.Loader: epochs, shuffling, ranks, prefetching."""

from __future__ import annotations

import numpy as np
import pytest

import imgpack


def epoch_labels_and_keys(loader):
    """Every batch of one epoch, as (images, labels) arrays concatenated."""
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels)


def sample_ids(ds, images):
    """Which sample each image is, recognised by its center-crop pixels (unique here)."""
    reference, _ = ds.get_batch(range(len(ds)), size=32, crop="center")
    flat = {reference[i].tobytes(): i for i in range(len(ds))}
    assert len(flat) == len(ds)
    return [flat[img.tobytes()] for img in images]


@pytest.fixture
def ds(packed):
    return imgpack.open(packed["webdataset_small"])


def test_an_epoch_covers_every_sample_once(ds):
    loader = imgpack.Loader(ds, batch_size=8, shuffle=True, seed=0, crop="center", size=32)
    assert len(loader) == 4
    images, labels = epoch_labels_and_keys(loader)
    ids = sample_ids(ds, images)
    assert sorted(ids) == list(range(len(ds)))
    assert ids != list(range(len(ds)))  # shuffled
    assert labels.tolist() == [ds[i].label for i in ids]


def test_epochs_are_fresh_and_reproducible(ds):
    loader = imgpack.Loader(ds, batch_size=8, seed=5, crop="center", size=32)
    first = sample_ids(ds, epoch_labels_and_keys(loader)[0])
    second = sample_ids(ds, epoch_labels_and_keys(loader)[0])  # the next epoch
    assert first != second and sorted(first) == sorted(second)
    loader.set_epoch(0)
    assert sample_ids(ds, epoch_labels_and_keys(loader)[0]) == first
    other = imgpack.Loader(ds, batch_size=8, seed=5, crop="center", size=32)
    other.set_epoch(1)
    assert sample_ids(ds, epoch_labels_and_keys(other)[0]) == second


def test_unshuffled_is_storage_order_and_drop_last(ds):
    loader = imgpack.Loader(ds, batch_size=8, shuffle=False, drop_last=True, crop="center", size=32)
    assert len(loader) == 3
    batches = list(loader)
    assert [len(y) for _, y in batches] == [8, 8, 8]
    ids = sample_ids(ds, np.concatenate([x for x, _ in batches]))
    assert ids == list(range(24))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_rank_shares_are_equal_disjoint_and_complete(ds, world_size):
    n = len(ds)  # 31: not divisible by 2, 3 or 4, so shares are padded as DistributedSampler pads
    shares = []
    for rank in range(world_size):
        loader = imgpack.Loader(ds, batch_size=4, seed=9, rank=rank, world_size=world_size, crop="center", size=32)
        loader.set_epoch(2)
        shares.append(sample_ids(ds, epoch_labels_and_keys(loader)[0]))
    per_rank = -(-n // world_size)
    assert all(len(s) == per_rank for s in shares)
    union = [i for s in shares for i in s]
    assert set(union) == set(range(n))  # complete
    assert len(union) - n == per_rank * world_size - n  # only the padding repeats


def test_rank_shares_without_padding(ds):
    shares = []
    for rank in range(2):
        loader = imgpack.Loader(ds, batch_size=5, rank=rank, world_size=2, drop_last=True, crop="center", size=32)
        shares.append(set(sample_ids(ds, epoch_labels_and_keys(loader)[0])))
    assert not shares[0] & shares[1]
    assert len(shares[0]) == len(shares[1]) == 15


def test_random_crops_per_epoch(ds):
    loader = imgpack.Loader(ds, batch_size=31, shuffle=False, size=48, seed=1)
    a, _ = next(iter(loader))
    b, _ = next(iter(loader))  # epoch 1: other crops
    assert a.shape == (31, 48, 48, 3)
    assert not np.array_equal(a, b)
    loader.set_epoch(0)
    c, _ = next(iter(loader))
    assert np.array_equal(a, c)
    expected, _ = ds.get_batch(range(31), size=48, seed=1, epoch=0)
    assert np.array_equal(a, expected)


def test_abandoning_an_epoch_midway(ds):
    loader = imgpack.Loader(ds, batch_size=2, crop="center", size=32)
    it = iter(loader)
    next(it)
    del it
    images, _ = epoch_labels_and_keys(loader)
    assert len(images) == len(ds)
