"""``imgpack.torch.ImageFolder``: ``torchvision.datasets.ImageFolder`` over a packed dataset.

Change one line of a training script::

    # train = torchvision.datasets.ImageFolder("train/", transform=tf)
    train = imgpack.torch.ImageFolder("train.lmdb", transform=tf)

It returns ``(PIL RGB image, class index)`` with the pixels torchvision's default loader gives,
and has the same ``classes``, ``class_to_idx``, ``samples`` (source paths), ``targets`` and
``imgs``. Needs torch and Pillow (``pip install imgpack[torch]``).
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch.utils.data
from PIL import Image

from ._dataset import Dataset


class ImageFolder(torch.utils.data.Dataset):
    """A dataset packed from an ImageFolder tree, read as ``torchvision.datasets.ImageFolder``
    reads the tree.

    Sample ``i`` is the dataset's sample ``i``: with a dataset packed without ``--shuffle``
    that is ``torchvision.datasets.ImageFolder(root).samples[i]``.

    ``root`` is the source root as ``pack`` recorded it (``meta["source"]["root"]``), so
    ``samples`` holds the paths ``ImageFolder(root).samples`` holds; pass ``root=`` to name
    the tree differently (for example where it is mounted now).

    ``path`` may be the ``s3://bucket/prefix/`` of a WebDataset ``pack`` stored there, at
    ``endpoint`` (see ``imgpack.open``): each sample is then one ranged GET.
    """

    def __init__(
        self,
        path: "os.PathLike[str] | str",
        transform: Optional[Callable[..., Any]] = None,
        target_transform: Optional[Callable[..., Any]] = None,
        verify_checksums: bool = False,
        root: Optional[str] = None,
        endpoint: Optional[str] = None,
    ):
        self.dataset = Dataset(path, verify_checksums=verify_checksums, endpoint=endpoint)
        self.transform = transform
        self.target_transform = target_transform
        self.root = root if root is not None else self.dataset.meta["source"]["root"]
        self.classes: List[str] = list(self.dataset.classes)
        self.class_to_idx: Dict[str, int] = {name: i for i, name in enumerate(self.classes)}
        labels, paths = self.dataset.labels_and_paths()
        self.samples: List[Tuple[str, int]] = [
            (os.path.join(self.root, *rel.split("/")), int(label)) for rel, label in zip(paths, labels.tolist())
        ]
        self.targets: List[int] = [label for _, label in self.samples]
        self.imgs = self.samples

    def __len__(self) -> int:
        return len(self.samples)

    def loader(self, index: int) -> Image.Image:
        """Sample ``index`` as a PIL RGB image, as torchvision's ``pil_loader`` opens a file."""
        sample = self.dataset[index]
        image = sample.image
        if image is not None:
            with Image.open(io.BytesIO(image)) as img:
                return img.convert("RGB")
        return Image.fromarray(self.dataset.decode(index), "RGB")

    def __getitem__(self, index: int) -> Tuple[Any, Any]:
        img = self.loader(index)
        target = self.samples[index][1]
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __repr__(self) -> str:
        return f"imgpack.torch.ImageFolder({self.dataset.path!r}, {len(self)} samples, {len(self.classes)} classes)"


__all__ = ["ImageFolder"]
