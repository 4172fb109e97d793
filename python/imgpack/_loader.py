"""``imgpack.Loader``: batches decoded ahead on Rust threads, no worker processes."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np

from . import _imgpack
from ._dataset import Dataset


class Loader:
    """Yields ``(images, labels)`` batches of ``dataset``: ``[B, size, size, 3]`` uint8 RGB
    and ``[B]`` int64 NumPy arrays (``torch.from_numpy`` shares their memory).

    Decoding runs on ``threads`` Rust threads (default: one per core), one or two batches
    ahead of the training step, with the GIL released: no worker processes, no pickling.

    Each epoch is a fresh permutation drawn from ``(seed, epoch)``; iterating again starts the
    next epoch, and ``set_epoch(e)`` picks one (as with ``DistributedSampler``). With ``rank``
    and ``world_size``, each rank gets an equal share of every epoch as ``DistributedSampler``
    gives it: disjoint, and together complete; when the dataset does not divide evenly, the
    shares are padded with the first samples of the permutation (``drop_last=True`` drops the
    remainder instead, and the last short batch).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        crop: str = "random-resized",
        size: int = 224,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3 / 4, 4 / 3),
        threads: Optional[int] = None,
        rank: int = 0,
        world_size: int = 1,
    ):
        if not isinstance(dataset, Dataset):
            raise TypeError(f"Loader takes an imgpack.Dataset (from imgpack.open), not {type(dataset).__name__}")
        self.dataset = dataset
        self.batch_size = batch_size
        self._raw = _imgpack.RawLoader(
            dataset._raw_handle(),
            int(batch_size),
            bool(shuffle),
            int(seed),
            bool(drop_last),
            crop,
            int(size),
            tuple(scale),
            tuple(ratio),
            threads,
            int(rank),
            int(world_size),
        )
        self._epoch = 0
        self._started = False

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch ``epoch``."""
        self._epoch = int(epoch)
        self._started = False

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration covers."""
        return self._epoch

    def __len__(self) -> int:
        return len(self._raw)

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        if self._started:
            self._epoch += 1
        self._started = True
        self._raw.set_epoch(self._epoch)
        while True:
            batch = self._raw.next_batch()
            if batch is None:
                return
            yield batch
