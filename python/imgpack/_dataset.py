"""``imgpack.Dataset``: random access to a dataset ``pack`` wrote."""

from __future__ import annotations

import json
import operator
import os
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import _imgpack

#: Field extensions that hold an encoded image, as ``pack`` names them (``"jpg"``, ``"png"``,
#: ...): the format's own list, from the extension module.
IMAGE_FIELDS: Tuple[str, ...] = _imgpack.IMAGE_FIELDS


class Sample:
    """One sample: its ``index``, ``key``, ``label`` (class index), ``path`` (the source path
    relative to the source root, ``/``-separated) and ``fields`` (extension -> bytes-like).

    Field values are read-only ``memoryview``s straight into the dataset's memory map (no
    copy); each keeps the map alive while it exists. ``bytes(view)`` copies one out.
    """

    __slots__ = ("index", "key", "label", "path", "fields")

    def __init__(self, index: int, key: str, label: int, path: str, fields: Dict[str, memoryview]):
        self.index = index
        self.key = key
        self.label = label
        self.path = path
        self.fields = fields

    @property
    def image(self) -> Optional[memoryview]:
        """The encoded image's bytes (the ``jpg``, ``png``, ... field), or ``None`` for a
        pre-decoded sample (``--mode decode``: see ``pixels``)."""
        for ext in IMAGE_FIELDS:
            if ext in self.fields:
                return self.fields[ext]
        return None

    @property
    def image_format(self) -> Optional[str]:
        """The extension of the image field (``"jpg"``, ``"png"``, ...), if any."""
        return next((ext for ext in IMAGE_FIELDS if ext in self.fields), None)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{ext}: {len(data)} B" for ext, data in self.fields.items())
        return f"Sample(index={self.index}, key={self.key!r}, label={self.label}, path={self.path!r}, fields={{{sizes}}})"


def open(
    path: "os.PathLike[str] | str", verify_checksums: bool = False, endpoint: Optional[str] = None
) -> "Dataset":
    """Opens the LMDB or WebDataset dataset that ``pack`` wrote at ``path`` (a single run's
    output or merged parts).

    ``path`` may be an object store prefix, ``"s3://bucket/prefix/"``, holding a WebDataset
    ``pack`` stored there: ``ds[i]`` is then one ranged GET of the sample's bytes, iteration one
    streamed GET per shard. ``endpoint`` names an S3-compatible store (``"http://127.0.0.1:8333"``);
    without it ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` does, else AWS itself.
    Credentials come from the usual AWS environment variables.

    With ``verify_checksums=True`` every read checks the sample's CRC-32 and raises
    ``imgpack.ChecksumError`` naming the sample on a mismatch (one more pass over its bytes).

    Raises ``FileNotFoundError`` if ``path`` (or the bucket) does not exist and ``ValueError``
    (with the message ``pack`` gives) if it holds no complete dataset; in a store,
    ``PermissionError`` for refused credentials and ``ConnectionError`` for an endpoint that
    does not answer.
    """
    return Dataset(path, verify_checksums=verify_checksums, endpoint=endpoint)


class Dataset:
    """A dataset written by ``pack``: ``len(ds)``, ``ds.classes``, ``ds.meta``, ``ds[i]``
    (negative indices count from the end), iteration in storage order, ``get_batch``.

    Safe to share between threads: reads release the GIL. It pickles as its path and options
    and reopens lazily where it is unpickled, and a process forked from one that had it open
    (a DataLoader worker) reopens it on first use, so it works in a ``DataLoader`` with
    ``num_workers`` under ``fork`` and ``spawn``.
    """

    def __init__(
        self, path: "os.PathLike[str] | str", verify_checksums: bool = False, endpoint: Optional[str] = None
    ):
        self._path = os.fspath(path)
        self._verify = bool(verify_checksums)
        self._endpoint = endpoint
        self._lock = threading.Lock()
        self._raw: Optional[Any] = None
        self._pid: Optional[int] = None
        self._meta: Optional[Dict[str, Any]] = None
        self._raw_handle()  # errors at open, not at first read

    # -- the Rust handle ------------------------------------------------------------------

    def _raw_handle(self) -> Any:
        raw = self._raw
        if raw is not None and self._pid == os.getpid():
            return raw
        with self._lock:
            if self._raw is None or self._pid != os.getpid():
                self._raw = _imgpack.open(self._path, verify_checksums=self._verify, endpoint=self._endpoint)
                self._pid = os.getpid()
            return self._raw

    def __getstate__(self) -> Dict[str, Any]:
        return {"path": self._path, "verify_checksums": self._verify, "endpoint": self._endpoint}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._path = state["path"]
        self._verify = state["verify_checksums"]
        self._endpoint = state.get("endpoint")
        self._lock = threading.Lock()
        self._raw = None
        self._pid = None
        self._meta = None

    # -- what it holds --------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The dataset path, as given to ``open``."""
        return self._path

    @property
    def format(self) -> str:
        """``"lmdb"`` or ``"webdataset"``."""
        return self._raw_handle().format

    @property
    def classes(self) -> List[str]:
        """Class names in class-index order (label ``i`` is ``classes[i]``)."""
        return self._raw_handle().classes

    @property
    def meta(self) -> Dict[str, Any]:
        """The dataset metadata (``FORMAT.md``): samples, classes, fields, source, options,
        tool, shards..."""
        if self._meta is None:
            self._meta = json.loads(self._raw_handle().meta_json)
        return self._meta

    def __len__(self) -> int:
        return len(self._raw_handle())

    def _index(self, index: int) -> int:
        n = len(self)
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}") from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self._path}: sample index {index} is out of range: the dataset holds {n} samples")
        return i

    def __getitem__(self, index: int) -> Sample:
        i = self._index(index)
        key, label, path, fields = self._raw_handle().get(i)
        return Sample(i, key, label, path, dict(fields))

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self)):
            yield self[i]

    def labels_and_paths(self) -> Tuple[np.ndarray, List[str]]:
        """Every sample's label (int64 array) and source path relative to the source root, in
        index order, read in one pass that copies no image bytes."""
        return self._raw_handle().scan()

    def decode(self, index: int) -> np.ndarray:
        """Sample ``index``'s image decoded at full size: ``[H, W, 3]`` uint8 RGB, the pixels
        ``PIL.Image.open(...).convert("RGB")`` gives (libjpeg-turbo with Pillow's settings)."""
        return self._raw_handle().decode(self._index(index))

    def get_batch(
        self,
        indices: Sequence[int],
        size: int = 224,
        crop: str = "random-resized",
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3 / 4, 4 / 3),
        seed: int = 0,
        epoch: int = 0,
        threads: Optional[int] = None,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Decodes samples ``indices`` into ``(images, labels)``: a ``[N, size, size, 3]``
        uint8 RGB array and an int64 array (``torch.from_numpy`` shares their memory).

        ``crop="random-resized"`` draws torchvision's ``RandomResizedCrop(size, scale,
        ratio)`` region per sample from ``(seed, epoch, index)``, so the same call gives the
        same pixels; ``crop="center"`` keeps the centred square ``Resize(size/0.875)`` +
        ``CenterCrop(size)`` would. JPEGs are decoded by libjpeg-turbo at the smallest DCT
        scale that keeps the crop at least ``size`` pixels, and only the rows and columns the
        crop needs; then resized by a SIMD resizer, on ``threads`` Rust threads (default: one
        per core) with the GIL released. Samples packed with ``--mode decode`` are used as
        stored (no decoding).
        """
        idx = [self._index(i) for i in indices]
        return self._raw_handle().get_batch(idx, int(size), crop, tuple(scale), tuple(ratio), int(seed), int(epoch), threads)

    def __repr__(self) -> str:
        return f"imgpack.Dataset({self._path!r}, {self.format}, {len(self)} samples, {len(self.classes)} classes)"
