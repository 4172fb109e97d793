"""Shared fixtures for the interop tests: they run the real `pack` binary and check its LMDB
output against torchvision and the Python `lmdb` package.

The binary is `$PACK` if set, else `<repo>/target/debug/pack` (build it with `cargo build`
first). A missing binary is a test failure, never a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Mapping, Union

import pytest

from interop_util import REPO, Packed, Source, copy_into, read_lmdb, testdata_images


# --------------------------------------------------------------------------- the binary


@pytest.fixture(scope="session")
def pack_bin() -> Path:
    path = Path(os.environ.get("PACK") or REPO / "target" / "debug" / "pack")
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"pack binary not found or not executable at {path}. Build it with `cargo build` "
            f"(or point $PACK at a built binary) before running the interop tests.",
            pytrace=False,
        )
    return path


@pytest.fixture
def run_pack(pack_bin: Path) -> Callable[..., subprocess.CompletedProcess]:
    """`run_pack(*args)` runs `pack *args` and returns the CompletedProcess (stdout and stderr
    captured as text). It never raises on a non-zero exit code; tests check `returncode`."""

    def run(*args: Union[str, os.PathLike], timeout: float = 300) -> subprocess.CompletedProcess:
        cmd = [str(pack_bin), *(os.fspath(a) for a in args)]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=timeout
        )
        # Shown by pytest only when the test fails.
        print(f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return proc

    return run


# --------------------------------------------------------------------------- trees and datasets


@pytest.fixture
def build_tree() -> Callable[[Path, Mapping[str, Source]], Path]:
    """`build_tree(root, {relpath: source})` creates a tree by copying testdata files: a `str`
    source is relative to testdata/imagefolder, a `Path` any file, `bytes` literal content."""
    return copy_into


@pytest.fixture
def testdata_files() -> list[str]:
    """Every image in testdata/imagefolder (relative paths, sorted)."""
    return testdata_images()


@pytest.fixture
def read_packed() -> Callable[[Path], Packed]:
    """`read_packed(out_dir)` reads a whole LMDB dataset and checks its layout and checksums."""
    return read_lmdb


# --------------------------------------------------------------------------- object storage


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS server on 127.0.0.1 for the whole session (tests/interop/s3_server.py):
    started once, stopped (SIGTERM, then SIGKILL) when the session ends, whatever happened."""
    import s3_server as server_module

    try:
        server = server_module.start(tmp_path_factory.mktemp("seaweedfs"))
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server, request) -> str:
    """A fresh, empty bucket named after the test (valid S3 name: lower case, digits, '-')."""
    import re
    import zlib

    short = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:36].strip("-")
    name = f"t-{short}-{zlib.crc32(request.node.nodeid.encode()):08x}"
    s3_server.client().create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def slowfs() -> Path:
    """The benches/slowfs binary, built (once) as benches/slow_source.py builds it."""
    target = REPO / "target" / "slowfs"
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", str(REPO / "benches/slowfs/Cargo.toml"),
         "--target-dir", str(target)],
        check=True,
    )
    return target / "release" / "slowfs"
