"""`pack plan`, `pack PLAN --part K/N` and `pack merge` checked against the real readers: a
tree with corrupt files early in the plan (so every later part is renumbered when merged) is
packed in parts with small shards, merged, and read back with `webdataset`, `wids` (through
the merged shardindex.json), DALI (through the `.idx` files left in the part directories),
Python's `tarfile`, GNU tar and the `lmdb` package. The merged dataset must be what one
`pack PLAN` run writes, and sample i must be torchvision's sample i minus the skipped files.

Run: ~/.cache/imgpack-venv/bin/python -m pytest tests/interop -q
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

import interop_util
from interop_util import BAD, check_webdataset_checksums, copy_into, read_lmdb, run_doc_snippet, sniff_ext
from test_webdataset import check_dali_index, dali_read_all, walk_tar

SHARD_SIZE = "60kB"
WDS_PARTS = 4
LMDB_PARTS = 3
# Corrupt files: three sort first in the plan (class "ants", names "000_..."), one mid-plan.
BAD_FILES = {
    "ants/000_zero_bytes.jpg": BAD / "zero_bytes.jpg",
    "ants/001_html.jpg": BAD / "html.jpg",
    "ants/002_truncated_header.jpg": BAD / "truncated_header.jpg",
    "bees/m_garbage.jpg": BAD / "garbage.jpg",
}


def key(i: int) -> str:
    return f"{i:08d}"


def pack(pack_bin: Path, *args, expect=(0,), env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [str(pack_bin), *(os.fspath(a) for a in args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", env=env, timeout=300)
    print(f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    assert proc.returncode in expect, f"pack {' '.join(map(str, args))} exited {proc.returncode}, expected {expect}"
    return proc


@dataclass
class Run:
    root: Path
    single: dict  # format -> the output of one `pack PLAN` run
    merged: dict  # format -> OUT, packed in parts and merged
    summary: dict  # format -> the `pack merge --json` summary
    classes: list  # torchvision's
    planned: list  # torchvision's samples (relative path, label), the corrupt files included
    samples: list  # the same without the corrupt files: what the dataset must hold

    @property
    def n(self) -> int:
        return len(self.samples)

    def check(self, i: int, fields: dict[str, bytes], where: str):
        """`fields` (ext -> bytes) are exactly sample i's: the source file's bytes under its
        sniffed format, its torchvision label, its path and class name."""
        rel, label = self.samples[i]
        data = (self.root / rel).read_bytes()
        assert sorted(fields) == sorted([sniff_ext(data), "cls", "json"]), f"{where}: fields {sorted(fields)}"
        assert fields[sniff_ext(data)] == data, f"{where}: image bytes differ from {rel}"
        assert fields["cls"] == str(label).encode(), f"{where}: cls {fields['cls']!r}, torchvision {label} ({rel})"
        assert json.loads(fields["json"]) == {"path": rel, "class": self.classes[label]}, f"{where}: {fields['json']!r}"


@pytest.fixture(scope="module")
def run(tmp_path_factory, pack_bin) -> Run:
    base = tmp_path_factory.mktemp("parts")
    testdata = interop_util.testdata_images()
    classes = ["ants", "bees", "wasps"]
    files = {f"{classes[n % 3]}/img_{n:03d}{Path(src).suffix}": src for n, src in enumerate(testdata * 2)}
    root = copy_into(base / "src", {**files, **BAD_FILES})
    plan = base / "train.plan"
    pack(pack_bin, "plan", root, "-o", plan, "-q")

    # `--part auto` must see only the Slurm variables this test sets.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "JOB_COMPLETION_INDEX"}
    single, merged, summary = {}, {}, {}
    for fmt, parts, order in (("webdataset", WDS_PARTS, [2, 0, 3, 1]), ("lmdb", LMDB_PARTS, [1, 2, 0])):
        # --md5: the merge recomputes the MD5s of the shards it renumbers, checked by wids below.
        opts = ("--to", fmt, "-q", *(("--shard-size", SHARD_SIZE, "--md5") if fmt == "webdataset" else ()))
        single[fmt] = base / f"single-{fmt}"
        pack(pack_bin, plan, "-o", single[fmt], *opts, expect=(3,))
        merged[fmt] = out = base / ("train.lmdb" if fmt == "lmdb" else "shards")
        for k in order:  # parts finish in any order; part 0 holds the first corrupt files
            exits = (3,) if k == 0 else (0, 3)
            if fmt == "webdataset":
                pack(pack_bin, plan, "--part", f"{k}/{parts}", "-o", out, *opts, expect=exits)
            else:  # `--part auto` in a Slurm job array numbered from 5
                slurm = {"SLURM_ARRAY_TASK_ID": str(k + 5), "SLURM_ARRAY_TASK_MIN": "5"}
                slurm["SLURM_ARRAY_TASK_COUNT"] = str(parts)
                pack(pack_bin, plan, "--part", "auto", "-o", out, *opts, env={**env, **slurm}, expect=exits)
            assert (out / f"part-{k:04d}-of-{parts:04d}").is_dir(), sorted(p.name for p in out.iterdir())
        summary[fmt] = json.loads(pack(pack_bin, "merge", out, "--json", expect=(3,)).stdout)

    ds = ImageFolder(str(root))
    planned = [(Path(os.path.relpath(p, root)).as_posix(), c) for p, c in ds.samples]
    samples = [s for s in planned if s[0] not in BAD_FILES]
    r = Run(root, single, merged, summary, ds.classes, planned, samples)
    assert r.classes == classes and r.n == 2 * len(testdata) and len(planned) == r.n + len(BAD_FILES)
    return r


# --------------------------------------------------------------------------- WebDataset


def shard_urls(run: Run) -> list[str]:
    """The merged shardindex.json's URLs, checked to name every part shard, in order, with
    several shards in each part."""
    out = run.merged["webdataset"]
    urls = [e["url"] for e in json.loads((out / "shardindex.json").read_text(encoding="utf-8"))["shardlist"]]
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.glob("part-*/*.tar"))
    assert urls == on_disk, f"shardindex.json lists {urls}, the part directories hold {on_disk}"
    parts = [re.fullmatch(r"part-(\d{4})-of-%04d/shard-p\1-\d{6}\.tar" % WDS_PARTS, u) for u in urls]
    assert all(parts), f"not a part shard URL relative to OUT: {urls}"
    per_part = [sum(1 for m in parts if int(m.group(1)) == k) for k in range(WDS_PARTS)]
    assert min(per_part) >= 2, f"shards per part {per_part}; the fixture wants several in each"
    return urls


def tar_samples(out: Path, urls: list[str]) -> list[tuple[str, dict[str, bytes]]]:
    """(key, {ext: bytes}) of every sample in the shards, in order, read with `tarfile`."""
    samples: list[tuple[str, dict[str, bytes]]] = []
    for url in urls:
        with tarfile.open(out / url, mode="r:") as tf:
            for m in tf:
                k, ext = m.name.split(".", 1)
                if not samples or samples[-1][0] != k:
                    samples.append((k, {}))
                samples[-1][1][ext] = tf.extractfile(m).read()
    return samples


def test_webdataset_reads_the_merged_parts(run):
    import webdataset as wds

    out, single = run.merged["webdataset"], run.single["webdataset"]
    urls = shard_urls(run)
    meta = json.loads((out / "imgpack.json").read_text(encoding="utf-8"))
    single_meta = json.loads((single / "imgpack.json").read_text(encoding="utf-8"))
    # The metadata is one run's but for the shard list, which names the part shards in order.
    assert {k: v for k, v in meta.items() if k != "shards"} == {k: v for k, v in single_meta.items() if k != "shards"}
    assert [s["name"] for s in meta["shards"]] == urls
    firsts = [s["first"] for s in meta["shards"]]
    assert firsts == [sum(s["samples"] for s in meta["shards"][:j]) for j in range(len(urls))]
    check_webdataset_checksums(out)  # imgpack.index: every sample's range and CRC in the part shards

    merged = list(wds.WebDataset([str(out / u) for u in urls], shardshuffle=False, empty_check=True))
    one_run = list(wds.WebDataset(sorted(map(str, single.glob("*.tar"))), shardshuffle=False, empty_check=True))
    assert [s["__key__"] for s in merged] == [s["__key__"] for s in one_run] == [key(i) for i in range(run.n)]
    for i, (s, r) in enumerate(zip(merged, one_run)):
        fields = {k: v for k, v in s.items() if not k.startswith("__")}
        assert fields == {k: v for k, v in r.items() if not k.startswith("__")}, f"sample {key(i)} != one run's"
        run.check(i, fields, f"webdataset sample {key(i)}")
        shard = max(j for j, f in enumerate(firsts) if f <= i)
        assert s["__url__"] == str(out / urls[shard]), f"sample {key(i)} read from {s['__url__']}"


def test_wids_resolves_part_urls_against_the_index(run, tmp_path, monkeypatch):
    import wids
    from wids.wids import IndexedTarSamples

    out = run.merged["webdataset"]
    urls = shard_urls(run)
    shardlist = json.loads((out / "shardindex.json").read_text(encoding="utf-8"))["shardlist"]
    firsts = [sum(e["nsamples"] for e in shardlist[:j]) for j in range(len(shardlist))]
    # The working directory must not help: wids has to join each URL to the directory of
    # shardindex.json. With `cache_dir=`, wids 0.1.11 names its copy of a shard by the URL's
    # file name alone, so shard file names must differ across parts, not only their
    # directories (part 1's shard-000000.tar once came back as part 0's).
    monkeypatch.chdir(tmp_path)
    ds = wids.ShardListDataset(str(out / "shardindex.json"), cache_dir=str(tmp_path / "wids-cache"), transformations=[])
    assert len(ds) == run.n
    rng = random.Random(7)
    for i in sorted({run.n - 1, *firsts, *rng.sample(range(run.n), 20)}):
        s = ds[i]
        assert s["__key__"] == key(i), f"wids index {i} gave key {s['__key__']}"
        shard = max(j for j, f in enumerate(firsts) if f <= i)
        assert s["__shard__"] == str(out / urls[shard]), f"wids index {i} read {s['__shard__']}"
        run.check(i, {k[1:]: v.getvalue() for k, v in s.items() if not k.startswith("__")}, f"wids index {i}")
    with pytest.raises(IndexError):
        ds[run.n]
    ds.close()
    # The md5sum and nsamples declared for each shard (rewritten by the merge) are right.
    for e in shardlist:
        IndexedTarSamples(path=str(out / e["url"]), md5sum=e["md5sum"], expected_size=e["nsamples"]).close()


def test_dali_indexes_in_the_part_directories(run):
    out = run.merged["webdataset"]
    tars = [out / u for u in shard_urls(run)]
    idxs = [t.with_suffix(".idx") for t in tars]
    assert sorted(out.glob("part-*/*.idx")) == sorted(idxs), "one .idx per shard, next to it"
    samples = [s for idx, tar in zip(idxs, tars) for s in check_dali_index(idx, tar)]  # names, offsets, sizes
    assert len(samples) == run.n
    for i, components in enumerate(samples):
        assert all(c[3].startswith(key(i) + ".") for c in components), f"idx sample {i}: {components}"
        data = (run.root / run.samples[i][0]).read_bytes()
        assert [c[2] for c in components if c[0] == sniff_ext(data)] == [len(data)], f"idx sample {i}: {components}"
    # Renumbered: each later part's first key is below its line in the plan.
    for k in range(1, WDS_PARTS):
        idx = out / f"part-{k:04d}-of-{WDS_PARTS:04d}" / f"shard-p{k:04d}-000000.idx"
        i = int(idx.read_text().splitlines()[1].split()[3].split(".")[0])
        assert run.planned.index(run.samples[i]) > i, f"part {k} starts at key {i}, its plan position"

    # And DALI itself reads every sample in order through those indexes.
    epoch, _ = dali_read_all(tars, idxs, run.n)
    for i, (image, cls, info) in enumerate(epoch):
        rel, label = run.samples[i]
        assert image == (run.root / rel).read_bytes(), f"DALI sample {i} ({rel}): image bytes differ"
        assert cls == str(label).encode(), f"DALI sample {i} ({rel}): cls {cls!r}, expected {label}"
        assert info.endswith(f":{key(i)}.{sniff_ext(image)}"), info


def test_tarfile_and_gnu_tar_list_every_part_shard(run):
    out = run.merged["webdataset"]
    urls = shard_urls(run)
    env = {**os.environ, "LC_ALL": "C"}
    for url in urls:
        with tarfile.open(out / url, mode="r:") as tf:
            names = tf.getnames()
        assert names == [h.name for h in walk_tar(out / url)], f"{url}: tarfile and a strict ustar walk disagree"
        gnu = subprocess.run(["tar", "-tf", str(out / url)], capture_output=True, text=True, env=env)
        assert gnu.returncode == 0 and gnu.stderr == "", f"tar -tf {url}: {gnu.stderr}"
        assert gnu.stdout.splitlines() == names, f"tar -tf {url} lists other names than tarfile"
    samples = tar_samples(out, urls)
    assert [k for k, _ in samples] == [key(i) for i in range(run.n)], "member names are not the keys 0..n-1"
    for i, (k, fields) in enumerate(samples):
        run.check(i, fields, f"tar member {k}")


# --------------------------------------------------------------------------- LMDB


def test_lmdb_merged_is_one_run(run, monkeypatch):
    out = run.merged["lmdb"]
    assert sorted(p.name for p in out.iterdir()) == ["data.mdb", "lock.mdb"], "part databases left behind"
    merged, single = read_lmdb(out), read_lmdb(run.single["lmdb"])  # layout and checksums checked
    assert merged.meta == single.meta, "__meta__ differs from one run's"
    assert merged.records == single.records, (
        f"records differ: {sorted(k for k in single.records if merged.records.get(k) != single.records[k])[:5]}"
    )
    for s in merged.samples:
        run.check(s.index, s.fields, f"lmdb sample {s.key}")
    # FORMAT.md's snippet, run as written in the directory holding train.lmdb (sample 42).
    monkeypatch.chdir(out.parent)
    names = run_doc_snippet("FORMAT.md", "lmdb-snippet")
    assert bytes(names["image"]) == (run.root / run.samples[42][0]).read_bytes()
    assert names["label"] == run.samples[42][1]


# --------------------------------------------------------------------------- torchvision


@pytest.mark.parametrize("fmt", ["webdataset", "lmdb"])
def test_sample_i_is_torchvision_sample_i_minus_skipped(run, fmt):
    summary = run.summary[fmt]
    assert summary["type"] == "merge" and summary["format"] == fmt, summary
    assert summary["parts"] == (WDS_PARTS if fmt == "webdataset" else LMDB_PARTS), summary
    assert (summary["found"], summary["packed"]) == (len(run.planned), run.n), summary
    skipped = [Path(e["path"]).relative_to(run.root).as_posix() for e in summary["skipped"]]
    assert sorted(skipped) == sorted(BAD_FILES), f"skipped {skipped}"
    if fmt == "lmdb":
        got = [(s.info["path"], s.label) for s in read_lmdb(run.merged[fmt]).samples]
    else:
        samples = tar_samples(run.merged[fmt], shard_urls(run))
        got = [(json.loads(f["json"])["path"], int(f["cls"])) for _, f in samples]
    assert got == run.samples, "the merged samples are not torchvision's, in order, minus the skipped files"
