"""imgpack: read datasets packed by ``pack`` (LMDB or WebDataset) fast, from Python.

``imgpack.open(path)`` opens any dataset ``pack`` wrote and gives random access to its
samples; ``Dataset.get_batch`` and ``imgpack.Loader`` decode batches of crops on Rust threads;
``imgpack.torch.ImageFolder`` is a drop-in for ``torchvision.datasets.ImageFolder``. The
``pack`` command comes with the package (``pack --help``).

Nothing here imports torch or Pillow: ``imgpack.torch`` does, when it is imported.
"""

from ._imgpack import ChecksumError, __version__
from ._dataset import Dataset, Sample, open
from ._loader import Loader

__all__ = ["ChecksumError", "Dataset", "Loader", "Sample", "open", "__version__"]
