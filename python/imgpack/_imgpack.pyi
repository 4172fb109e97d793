"""Type stubs for the extension module (the Rust side of imgpack)."""

from typing import List, Optional, Sequence, Tuple

import numpy as np

__version__: str
IMAGE_FIELDS: Tuple[str, ...]

class ChecksumError(ValueError): ...

def pack_main(argv: List[str]) -> int: ...
def open(path: str, verify_checksums: bool = False) -> RawDataset: ...

class RawDataset:
    classes: List[str]
    meta_json: str
    format: str
    def __len__(self) -> int: ...
    def get(self, index: int) -> Tuple[str, int, str, List[Tuple[str, memoryview]]]: ...
    def scan(self) -> Tuple[np.ndarray, List[str]]: ...
    def decode(self, index: int) -> np.ndarray: ...
    def get_batch(
        self,
        indices: Sequence[int],
        size: int,
        crop: str,
        scale: Tuple[float, float],
        ratio: Tuple[float, float],
        seed: int,
        epoch: int,
        threads: Optional[int],
    ) -> Tuple[np.ndarray, np.ndarray]: ...

class RawLoader:
    def __init__(
        self,
        dataset: RawDataset,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        crop: str,
        size: int,
        scale: Tuple[float, float],
        ratio: Tuple[float, float],
        threads: Optional[int],
        rank: int,
        world_size: int,
    ) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...
    def next_batch(self) -> Optional[Tuple[np.ndarray, np.ndarray]]: ...
