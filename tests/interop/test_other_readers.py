"""`pack imagefolder ... --to webdataset --shuffle` output read by the other readers users have,
through the README's recipes run exactly as written: Ray Data (`ray.data.read_webdataset`),
Megatron-Energon (the real `energon prepare` CLI, then `get_train_dataset`) and Hugging Face
`datasets` (`load_dataset("webdataset", ...)`). Every reader must give every sample exactly
once, with the label and the pixels (or bytes) of its source file. The shards mix image
formats (testdata has JPEG, PNG, WebP, BMP, TIFF, PPM and PGM), which is what each recipe's
caveat is about; the tests also check that the caveats are still true (Ray without
`file_extensions`, Ray's default decoder, energon's `"image": "jpg"` field map, `datasets`
inferring its columns), so the README changes when the readers do.

Run: ~/.cache/imgpack-venv/bin/python -m pytest tests/interop -q
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from interop_util import IMAGEFOLDER, check_webdataset_checksums, copy_into, doc_block, run_doc_snippet, sniff_ext

# Hugging Face: no network, and nothing written under ~ (the README recipe uses the default
# cache). Set before anything imports `datasets` or `huggingface_hub`, which read these once.
_HF_HOME = Path(tempfile.mkdtemp(prefix="imgpack-hf-home-"))
atexit.register(shutil.rmtree, _HF_HOME, True)
os.environ.update(HF_HOME=str(_HF_HOME), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

KEY_WIDTH = 8
SHARD_SAMPLES = 7  # testdata/imagefolder's 31 images -> 5 shards
SEED = 7
BIN = Path(sys.executable).parent  # the venv's scripts: `energon`
# What `energon prepare` adds to the dataset directory, besides a `.tar.idx` per shard.
ENERGON_FILES = {f".nv-meta/{f}" for f in (".info.json", "dataset.yaml", "index.sqlite", "index.uuid", "split.yaml")}


# --------------------------------------------------------------------------- the dataset under test


def run_pack(pack_bin: Path, *args) -> subprocess.CompletedProcess:
    cmd = [str(pack_bin), *(os.fspath(a) for a in args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=300)
    print(f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


@dataclass
class Expected:
    key: str
    rel: str  # source path relative to the root
    label: int
    data: bytes  # the source file's bytes (== the shard's image field)
    ext: str  # the image field's name: the format sniffed from the bytes
    root: Path

    @cached_property
    def pixels(self) -> np.ndarray:
        """The source decoded by Pillow, as RGB."""
        with Image.open(self.root / self.rel) as im:
            return np.asarray(im.convert("RGB"))


@dataclass
class Shards:
    root: Path  # the ImageFolder source
    out: Path  # the WebDataset output
    classes: list
    samples: dict  # key -> Expected, for every sample

    @property
    def n(self) -> int:
        return len(self.samples)

    def copy_to(self, dest_dir: Path) -> Path:
        """A private copy of the output as `dest_dir/shards` (the name the README uses)."""
        shutil.copytree(self.out, dest_dir / "shards")
        return dest_dir / "shards"


def pack_shards(pack_bin: Path, root: Path, out: Path, *options) -> Shards:
    """Pack `root` to WebDataset shards and map every key to its source file through the shards'
    own metadata (read with `tarfile`: each sample's json names its source path), checked
    against torchvision's ImageFolder: the same files once each, the same labels, the bytes of
    the source in the image field."""
    proc = run_pack(pack_bin, "imagefolder", root, "--to", "webdataset", "-o", out, *options)
    assert proc.returncode == 0, f"pack exited {proc.returncode}:\n{proc.stderr}"
    check_webdataset_checksums(out)
    tv = ImageFolder(str(root))
    tv_label = {Path(os.path.relpath(p, root)).as_posix(): c for p, c in tv.samples}
    meta = json.loads((out / "imgpack.json").read_text(encoding="utf-8"))
    assert meta["classes"] == tv.classes

    fields: dict[str, dict[str, bytes]] = {}
    for shard in meta["shards"]:
        with tarfile.open(out / shard["name"]) as tf:
            for m in tf.getmembers():
                k, _, ext = m.name.partition(".")
                fields.setdefault(k, {})[ext] = tf.extractfile(m).read()
    assert sorted(fields) == [str(i).zfill(KEY_WIDTH) for i in range(meta["samples"])]
    samples = {}
    for k, f in fields.items():
        info = json.loads(f.pop("json"))
        label = int(f.pop("cls"))
        (ext, data), = f.items()
        rel = info["path"]
        assert rel in tv_label, f"sample {k}: json path {rel!r} is not one of torchvision's samples"
        assert label == tv_label[rel] and info["class"] == tv.classes[label], f"sample {k} ({rel}): label {label}"
        assert data == (root / rel).read_bytes() and ext == sniff_ext(data), f"sample {k} ({rel}): {ext} differs"
        samples[k] = Expected(k, rel, label, data, ext, root)
    assert sorted(s.rel for s in samples.values()) == sorted(tv_label), "not torchvision's samples once each"
    return Shards(root, out, tv.classes, samples)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, pack_bin) -> Shards:
    out = tmp_path_factory.mktemp("other-readers") / "shards"
    s = pack_shards(pack_bin, IMAGEFOLDER, out, "--shuffle", "--seed", str(SEED), "--shard-samples", str(SHARD_SAMPLES))
    # What the tests rely on: several shards, shuffled, formats mixed within a shard.
    tars = sorted(out.glob("shard-*.tar"))
    assert len(tars) == 5, [t.name for t in tars]
    in_order = [Path(os.path.relpath(p, IMAGEFOLDER)).as_posix() for p, _ in ImageFolder(str(IMAGEFOLDER)).samples]
    assert [s.samples[k].rel for k in sorted(s.samples)] != in_order, "--shuffle left the samples in order"
    first_shard = [s.samples[str(i).zfill(KEY_WIDTH)].ext for i in range(SHARD_SAMPLES)]
    assert len(set(first_shard)) > 1, f"shard 0 holds only {set(first_shard)}"
    assert {x.ext for x in s.samples.values()} == {"jpg", "png", "webp", "bmp", "tiff", "ppm", "pgm"}
    return s


def check_every_sample(shards: Shards, got: list, who: str) -> None:
    """`got`: (key, label, RGB uint8 pixels) per sample read; each key exactly once, each label
    and image the source's."""
    keys = [k for k, _, _ in got]
    dupes = sorted(k for k, c in Counter(keys).items() if c > 1)
    assert not dupes, f"{who} read samples {dupes[:5]} more than once"
    assert sorted(keys) == sorted(shards.samples), (
        f"{who}: missing {sorted(set(shards.samples) - set(keys))[:5]}, extra {sorted(set(keys) - set(shards.samples))[:5]}"
    )
    for k, label, pixels in got:
        want = shards.samples[k]
        assert label == want.label, f"{who}: sample {k} ({want.rel}) has label {label!r}, its class is {want.label}"
        assert pixels.dtype == np.uint8 and pixels.shape == want.pixels.shape, (
            f"{who}: sample {k} ({want.rel}): {pixels.dtype} {pixels.shape}, source {want.pixels.shape}"
        )
        assert np.array_equal(pixels, want.pixels), f"{who}: sample {k} ({want.rel}): pixels differ from the source"


def rgb(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def doc_command(doc: str, name: str) -> list[str]:
    """The one shell command in the ```sh block after the line `<!-- interop-test: NAME -->` of
    `doc` (the marker `doc_snippet` uses for Python), split into words as sh would (backslash
    line continuations joined)."""
    body = doc_block(doc, name, ("sh", "bash", "console", "shell"))
    text = re.sub(r"\\\n", " ", "\n".join(body)).strip()
    assert text and "\n" not in text, f"the {doc} block {name!r} must hold exactly one command: {text!r}"
    return shlex.split(text)


def file_digests(d: Path) -> dict[str, str]:
    files = sorted(p for p in d.rglob("*") if p.is_file())
    return {p.relative_to(d).as_posix(): hashlib.md5(p.read_bytes()).hexdigest() for p in files}


# --------------------------------------------------------------------------- Ray Data


@pytest.fixture
def ray_here(tmp_path, monkeypatch):
    """A one-CPU local Ray instance started in `tmp_path` (Ray's workers start in the driver's
    directory and resolve relative paths there), shut down at the end of the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # no usage report over the network
    # Token authentication on, with a token of our own: else Ray writes one to ~/.ray/auth_token.
    # Set before the import: Ray reads its configuration then.
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    import ray

    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    try:
        ray.init(num_cpus=1, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_data_readme_recipe(shards, ray_here, tmp_path):
    """The README's Ray Data recipe reads every sample once, with its label and pixels; and the
    two things it works around still fail: without `file_extensions=["tar"]` Ray opens our
    index files as tars, and its default decoder cannot build blocks that mix formats."""
    ray = ray_here
    shards.copy_to(tmp_path)

    with pytest.raises(Exception) as excinfo:
        ray.data.read_webdataset(paths="shards").take_all()
    assert "bad checksum" in str(excinfo.value), f"expected tarfile's 'bad checksum', got {excinfo.value!r}"

    with pytest.raises(Exception) as excinfo:
        ray.data.read_webdataset(paths="shards", file_extensions=["tar"]).take_all()
    assert "TensorArray" in str(excinfo.value), f"Ray's default decoder read mixed formats: {excinfo.value!r}"

    names = run_doc_snippet("README.md", "ray-snippet")
    rows = names["ds"].take_all()
    assert all(set(r) == {"key", "image", "label"} for r in rows), sorted(rows[0])
    check_every_sample(shards, [(r["key"], r["label"], np.asarray(r["image"])) for r in rows], "Ray Data")


# --------------------------------------------------------------------------- Megatron-Energon


def energon_prepare(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert argv[:2] == ["energon", "prepare"], argv
    cmd = [str(BIN / "energon"), *argv[1:]]
    proc = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    print(f"$ {shlex.join(argv)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    assert proc.returncode == 0, f"energon prepare exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Done" in proc.stdout and "Found 5 tar files" in proc.stdout, proc.stdout
    return proc


def energon_samples(loader, n: int) -> list:
    it = iter(loader)
    try:
        return [next(it) for _ in range(n)]
    finally:
        del it  # stops the worker processes


def test_energon_readme_recipe(shards, pack_bin, tmp_path, monkeypatch):
    """`energon prepare` as the README gives it, then its `get_train_dataset` snippet: one epoch's
    worth of samples (energon loops forever) is every sample once, with label, class name and
    pixels. energon adds only .nv-meta/ and one `.tar.idx` per shard, changes none of our files,
    and `pack verify` still passes."""
    import torch

    out = shards.copy_to(tmp_path)
    before = file_digests(out)
    energon_prepare(doc_command("README.md", "energon-prepare"), tmp_path)

    after = file_digests(out)
    assert {k: v for k, v in after.items() if k in before} == before, "energon prepare changed our files"
    added = set(after) - set(before)
    tar_idx = {f"{t}.idx" for t in before if t.endswith(".tar")}
    assert added == ENERGON_FILES | tar_idx, f"energon prepare added {sorted(added)}"
    verify = run_pack(pack_bin, "verify", out)
    assert verify.returncode == 0, f"pack verify fails on a dataset energon prepared:\n{verify.stdout}\n{verify.stderr}"

    monkeypatch.chdir(tmp_path)
    names = run_doc_snippet("README.md", "energon-snippet")
    samples = energon_samples(names["loader"], shards.n)
    got = []
    for s in samples:
        assert type(s).__name__ == "ImageClassificationSample", type(s)
        assert s.label_name == shards.classes[shards.samples[s.__key__].label], (s.__key__, s.label_name)
        image = s.image  # float CHW in [0, 1]
        assert image.dtype.is_floating_point and image.ndim == 3 and image.shape[0] == 3, (image.dtype, image.shape)
        pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        got.append((s.__key__, s.label, pixels))
    check_every_sample(shards, got, "energon get_train_dataset")


def test_energon_jpg_only_field_map_skips_other_formats(shards, tmp_path):
    """The field map `{"image": "jpg", ...}` (the obvious one, and what the issue tried) reads the
    JPEG samples right but skips every other format with an error: why the README's lists all."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    out = shards.copy_to(tmp_path)
    energon_prepare(
        ["energon", "prepare", str(out), "--non-interactive", "--split-ratio", "1,0,0",
         "--sample-type", "ImageClassificationSample", "--field-map", '{"image":"jpg","label":"cls"}'],
        tmp_path,
    )
    ds = get_train_dataset(str(out), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
                           worker_config=WorkerConfig.default_worker_config(num_workers=0))
    jpgs = {k for k, s in shards.samples.items() if s.ext == "jpg"}
    assert 0 < len(jpgs) < shards.n
    samples = energon_samples(get_loader(ds), 2 * len(jpgs))
    assert Counter(s.__key__ for s in samples) == {k: 2 for k in jpgs}, "energon read non-JPEG samples with image=jpg"
    for s in samples:
        assert s.label == shards.samples[s.__key__].label


# --------------------------------------------------------------------------- Hugging Face datasets


def hf_check(shards: Shards, names: dict) -> None:
    """The `ds` and `stream` of the README's `datasets` snippet: every sample once, label, image
    bytes (through `Image(decode=False)`) and decoded pixels of its source."""
    from datasets import Image as HFImage

    formats, ds, stream = names["formats"], names["ds"], names["stream"]
    assert sorted(formats) == sorted({s.ext for s in shards.samples.values()})
    assert len(ds) == shards.n

    def image_of(row):
        present = [f for f in formats if row[f] is not None]
        assert len(present) == 1, f"sample {row['__key__']} has images {present}"
        return present[0], row[present[0]]

    got = []
    for row in ds:
        fmt, image = image_of(row)
        assert fmt == shards.samples[row["__key__"]].ext
        got.append((row["__key__"], row["cls"], rgb(image)))
    check_every_sample(shards, got, "datasets load_dataset")

    raw = ds.cast_column(formats[0], HFImage(decode=False))
    for f in formats[1:]:
        raw = raw.cast_column(f, HFImage(decode=False))
    for row in raw:
        _, image = image_of(row)
        assert image["bytes"] == shards.samples[row["__key__"]].data, f"sample {row['__key__']}: bytes differ"

    check_every_sample(shards, [(r["__key__"], r["cls"], rgb(image_of(r)[1])) for r in stream], "datasets streaming")


def test_hf_datasets_readme_recipe(shards, tmp_path, monkeypatch):
    """The README's `datasets` snippet (one image column per format, from imgpack.json), in place
    and streaming; a glob of everything in the directory fails (imgpack.index is no tar)."""
    import datasets

    assert Path(datasets.config.HF_DATASETS_CACHE).is_relative_to(_HF_HOME), (
        f"datasets was imported before this module set HF_HOME: its cache is {datasets.config.HF_DATASETS_CACHE}"
    )
    shards.copy_to(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = file_digests(tmp_path / "shards")
    hf_check(shards, run_doc_snippet("README.md", "hf-datasets-snippet"))
    assert file_digests(tmp_path / "shards") == before, "datasets wrote into the shard directory"

    with pytest.raises(tarfile.ReadError):
        datasets.load_dataset("webdataset", data_files={"train": "shards/*"}, split="train")


def test_hf_datasets_infers_columns_from_five_samples(pack_bin, tmp_path, monkeypatch):
    """Why the README declares the columns: left to infer them, `datasets` looks at the first
    five samples and silently drops the fields they lack, so a PNG sixth comes back with no
    image at all; the README's snippet reads it."""
    import datasets

    root = copy_into(tmp_path / "src", {
        **{f"a/{n}.jpg": f"cat/chelsea_0{n}.jpg" for n in (1, 2, 3, 5)},
        "b/astronaut.jpg": "space/astronaut_01.jpg",
        "b/zz.png": "space/alpha.png",  # sample 5: after five JPEGs
    })
    s = pack_shards(pack_bin, root, tmp_path / "shards")
    assert [s.samples[k].ext for k in sorted(s.samples)] == ["jpg"] * 5 + ["png"]

    monkeypatch.chdir(tmp_path)
    inferred = datasets.load_dataset("webdataset", data_files={"train": "shards/shard-*.tar"}, split="train")
    assert "png" not in inferred.features and "jpg" in inferred.features, inferred.features
    last = inferred[5]
    assert (last["__key__"], last["cls"], last["jpg"]) == ("00000005", 1, None), "the PNG sample kept an image"

    hf_check(s, run_doc_snippet("README.md", "hf-datasets-snippet"))
