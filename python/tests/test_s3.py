"""imgpack.open("s3://bucket/prefix/"): a WebDataset read where `pack` stored it, from a real S3
server (SeaweedFS on 127.0.0.1, started and stopped here by tests/interop/s3_server.py), gives
every sample the local dataset gives, byte for byte, through indexing, iteration, batches, the
torch dataset and DataLoader workers; and each store failure is its own Python exception."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

import imgpack
from conftest import REPO, ROOT, run_pack

sys.path.insert(0, str(REPO / "tests" / "interop"))
import s3_server as server_module  # noqa: E402  (the interop tests' server, on the path above)

OPTIONS = ["--shard-size", "200kB", "--shuffle", "--seed", "7"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = server_module.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stored(server, tmp_path_factory, monkeypatch_module):
    """testdata packed with the same options to a directory and to s3://py-read/train/, with
    the store's credentials and endpoint in this process's environment (as a user sets them)."""
    for name, value in server.env().items():
        if name.startswith("AWS_"):
            monkeypatch_module.setenv(name, value)
    server.client().create_bucket(Bucket="py-read")
    local = tmp_path_factory.mktemp("local") / "train"
    run_pack(ROOT, "--to", "webdataset", "-o", local, *OPTIONS, "-q")
    run_pack(ROOT, "--to", "webdataset", "-o", "s3://py-read/train/", *OPTIONS, "-q")
    return str(local), "s3://py-read/train/"


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def same(a, b) -> None:
    assert (a.index, a.key, a.label, a.path) == (b.index, b.key, b.label, b.path)
    assert {k: bytes(v) for k, v in a.fields.items()} == {k: bytes(v) for k, v in b.fields.items()}


def test_every_sample_is_the_local_datasets(stored):
    local, url = imgpack.open(stored[0]), imgpack.open(stored[1])
    assert len(url.meta["shards"]) >= 3, "the dataset should span several shards"
    assert (len(url), url.classes, url.meta, url.format) == (len(local), local.classes, local.meta, "webdataset")
    assert url.path == stored[1]
    for i in range(len(local)):
        same(url[i], local[i])
    same(url[-1], local[-1])
    with pytest.raises(IndexError):
        url[len(url)]
    # Iteration streams shards; it gives the same samples in the same order.
    streamed = list(url)
    assert len(streamed) == len(local)
    for a, b in zip(streamed, local):
        same(a, b)
    labels, paths = url.labels_and_paths()
    assert (labels.tolist(), paths) == (local.labels_and_paths()[0].tolist(), local.labels_and_paths()[1])


def test_batches_and_decoding_are_the_local_datasets(stored):
    local, url = imgpack.open(stored[0]), imgpack.open(stored[1])
    indices = list(range(len(local)))[::-1]
    a, la = url.get_batch(indices, size=48, crop="center")
    b, lb = local.get_batch(indices, size=48, crop="center")
    assert (a == b).all() and (la == lb).all()
    assert (url.decode(3) == local.decode(3)).all()


def test_checksums_are_verified_on_ranged_reads(server, stored):
    url = imgpack.open(stored[1], verify_checksums=True)
    assert sum(len(s.image) for s in url) > 0
    # Flip one image byte in a copy of the dataset: the sample holding it is named.
    client = server.client()
    for item in client.list_objects_v2(Bucket="py-read", Prefix="train/")["Contents"]:
        client.copy_object(Bucket="py-read", Key="damaged/" + item["Key"][len("train/"):], CopySource=f"py-read/{item['Key']}")
    victim = url[4]
    shard = url.meta["shards"][0]["name"]
    body = bytearray(client.get_object(Bucket="py-read", Key=f"damaged/{shard}")["Body"].read())
    at = bytes(body).find(bytes(victim.image)[100:200])
    assert at > 0, "sample 4 is expected in the first shard"
    body[at] ^= 0xFF
    client.put_object(Bucket="py-read", Key=f"damaged/{shard}", Body=bytes(body))
    damaged = imgpack.open("s3://py-read/damaged/", verify_checksums=True)
    with pytest.raises(imgpack.ChecksumError, match=victim.key):
        damaged[4]
    assert bytes(damaged[5].image) == bytes(url[5].image)


def test_the_torch_dataset_lists_what_the_local_one_lists(stored):
    from imgpack.torch import ImageFolder

    local, url = ImageFolder(stored[0]), ImageFolder(stored[1])
    assert url.samples == local.samples and url.classes == local.classes
    ds = imgpack.open(stored[1])
    again = pickle.loads(pickle.dumps(ds))
    assert again.path == stored[1] and len(again) == len(ds)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_it(stored, context):
    import torch
    from torchvision import transforms

    from imgpack.torch import ImageFolder

    tf = transforms.Compose([transforms.Resize((24, 24)), transforms.PILToTensor()])
    ours, theirs = ImageFolder(stored[1], transform=tf), ImageFolder(stored[0], transform=tf)
    # The parent reads first, so forked workers inherit an open store client and runtime,
    # which they must not use: they reopen the dataset.
    assert ours[0][1] == theirs[0][1]
    loader = torch.utils.data.DataLoader(ours, batch_size=4, num_workers=2, multiprocessing_context=context)
    images, targets = [], []
    for x, y in loader:
        images.append(x)
        targets.extend(y.tolist())
    assert targets == theirs.targets
    assert torch.equal(torch.cat(images), torch.stack([theirs[i][0] for i in range(len(theirs))]))


def test_an_explicit_endpoint_wins_over_the_environment(server, stored, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server_module.closed_port()}")
    with pytest.raises(ConnectionError, match="cannot connect to the store"):
        imgpack.open(stored[1])
    ds = imgpack.open(stored[1], endpoint=server.endpoint)
    assert len(ds) == 31
    # The endpoint travels with the pickle, to DataLoader workers.
    assert len(pickle.loads(pickle.dumps(ds))) == 31


def test_each_store_failure_is_its_own_exception(server, stored, monkeypatch):
    with pytest.raises(FileNotFoundError, match='there is no bucket "no-such-bucket-py"'):
        imgpack.open("s3://no-such-bucket-py/train/")
    with pytest.raises(ValueError, match="nothing is stored under this prefix"):
        imgpack.open("s3://py-read/nowhere/")
    server.client().put_object(Bucket="py-read", Key="unfinished/shard-000000.tar", Body=b"x" * 1024)
    with pytest.raises(ValueError, match="no imgpack.json"):
        imgpack.open("s3://py-read/unfinished/")
    with pytest.raises(ValueError, match="lower-case"):
        imgpack.open("s3://Bad_Bucket/train/")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(PermissionError, match="SignatureDoesNotMatch"):
        imgpack.open(stored[1])


def test_the_local_dataset_is_the_source_tree(stored):
    # The round trip's other end: the store's dataset equals the local one (above), and the
    # local one is the tree.
    local = imgpack.open(stored[0])
    for sample in local:
        assert bytes(sample.image) == (Path(ROOT) / sample.path).read_bytes()
