"""`pack imagefolder ... --to lmdb` checked against torchvision's ImageFolder and the Python
`lmdb` package.

Run: ~/.cache/imgpack-venv/bin/python -m pytest tests/interop -q
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from interop_util import BAD, doc_snippet, sniff_ext


def torchvision_samples(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    ds = ImageFolder(str(root), allow_empty=True)
    return ds.classes, ds.samples


def rel(root: Path, path: str) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def assert_matches_torchvision(packed, root: Path, exclude: set[str] = frozenset()):
    """Every sample i of `packed` is torchvision's sample i (minus `exclude`d relative paths):
    same bytes, same class index, same relative path; the image stored under its sniffed
    format."""
    classes, samples = torchvision_samples(root)
    samples = [(p, c) for p, c in samples if rel(root, p) not in exclude]
    assert packed.meta["classes"] == classes
    assert packed.meta["samples"] == len(samples) == len(packed.samples)
    for s, (path, class_index) in zip(packed.samples, samples):
        want_rel = rel(root, path)
        got_rel = s.info.get("path")
        assert got_rel == want_rel, f"sample {s.key}: json path {got_rel!r}, torchvision has {want_rel!r}"
        data = Path(path).read_bytes()
        assert s.image == data, f"sample {s.key} ({want_rel}): image bytes differ from the source file"
        assert s.image_ext == sniff_ext(data), f"sample {s.key} ({want_rel}): stored as {s.image_ext}"
        assert s.label == class_index, f"sample {s.key} ({want_rel}): cls {s.label}, torchvision {class_index}"
        assert s.info.get("class") == classes[class_index]


# --------------------------------------------------------------------------- a) ordering / discovery


def test_matches_torchvision_imagefolder(tmp_path, run_pack, build_tree, read_packed):
    root = tmp_path / "root"
    build_tree(
        root,
        {
            # Files directly in the root are not samples.
            "root_file.jpg": "cat/chelsea_01.jpg",
            "README.txt": b"not a sample\n",
            # Upper-case class name: sorts before every lower-case one (code point order).
            "Zoo/only.jpg": "space/rocket_01.jpg",
            # Class "cat": files around a sub-folder name, nested folders whose full paths sort
            # differently from a depth-first walk ("sub" < "sub-a" < "sub.x" < "sub/deep"),
            # upper/mixed-case extensions, a hidden file, a hidden directory, non-images.
            "cat/a.jpg": "cat/chelsea_01.jpg",
            "cat/B.jpg": "cat/chelsea_02.jpg",
            "cat/a.b.c.jpg": "cat/chelsea_03.jpg",
            "cat/UPPER.JPG": "cat/chelsea_05.jpg",
            "cat/Mixed.Jpeg": "space/astronaut_02.jpg",
            "cat/shout.PNG": "cat/chelsea_04.png",
            "cat/sub.jpg": "space/hubble_01.jpg",
            "cat/zz.jpg": "space/hubble_02.jpg",
            "cat/.hidden.jpg": "still_life/gray.jpg",
            "cat/notes.txt": b"some notes\n",
            "cat/x.jpg.txt": b"not an image either\n",
            "cat/.DS_Store": b"\x00\x00\x00\x01Bud1" + bytes(64),
            "cat/sub/z.jpg": "space/rocket_02.jpg",
            "cat/sub/a.png": "space/alpha.png",
            "cat/sub/deep/d.jpg": "still_life/cmyk.jpg",
            "cat/sub/deep/deeper/e.webp": "space/hubble_small.webp",
            "cat/sub-a/m.bmp": "texture/brick_small.bmp",
            "cat/sub.x/s.jpg": "space/progressive.jpg",
            "cat/.cache/h.jpg": "still_life/camera_01.jpg",
            # Unicode and spaces in class and file names.
            "chat noir/été 1.jpg": "still_life/coffee_01.jpg",
            "chat noir/日本.png": "still_life/coffee_03.png",
            "chat noir/Ünïcode file.Jpg": "still_life/coffee_02.jpg",
            "chat noir/z y/grass.TIF": "texture/grass_small.tiff",
            # Dots in class names; formats named by another extension.
            "n01.dog/png_named.JPEG": "cat/png_named.JPEG",
            "n01.dog/pix.ppm": "cat/chelsea_small.ppm",
            "n01.dog/grey.PGM": "texture/gravel_small.pgm",
            "n01.dog/tiff.tiff": "texture/grass_small.tiff",
            "n01.dog/retina.jpeg": "texture/retina_01.jpg",
        },
    )
    # An empty class that sorts between others: later class indices must not shift.
    (root / "m_empty").mkdir()
    # A symlinked file pointing at a real image outside the tree.
    elsewhere = build_tree(tmp_path / "elsewhere", {"real.jpg": "texture/gravel_01.jpg"})
    (root / "n01.dog" / "link.jpg").symlink_to(elsewhere / "real.jpg")

    classes, samples = torchvision_samples(root)
    assert classes == ["Zoo", "cat", "chat noir", "m_empty", "n01.dog"]  # sanity of the fixture
    assert len(samples) == 27

    out = tmp_path / "out.lmdb"
    proc = run_pack("imagefolder", root, "--to", "lmdb", "-o", out)
    assert proc.returncode == 0, f"pack exited {proc.returncode}\nstderr:\n{proc.stderr}"
    assert "m_empty" in proc.stderr, f"no warning naming the empty class 'm_empty' on stderr:\n{proc.stderr}"

    packed = read_packed(out)
    assert packed.meta["key_width"] == 8
    assert_matches_torchvision(packed, root)
    by_path = {s.info["path"]: s for s in packed.samples}
    assert by_path["n01.dog/png_named.JPEG"].image_ext == "png"
    assert "n01.dog/link.jpg" in by_path and "cat/.cache/h.jpg" in by_path and "cat/.hidden.jpg" in by_path


# --------------------------------------------------------------------------- b) the documented snippet

@pytest.mark.parametrize("doc", ["FORMAT.md", "README.md"])
def test_doc_snippet(doc, tmp_path, monkeypatch, run_pack, build_tree, read_packed, testdata_files):
    """The Python snippet that FORMAT.md and the README show, run exactly as written."""
    snippet = doc_snippet(doc, "lmdb-snippet")

    classes = ["ants", "bees", "wasps"]
    files = {}
    for n in range(60):
        src = testdata_files[n % len(testdata_files)]
        files[f"{classes[n % 3]}/img_{n:03d}{Path(src).suffix}"] = src
    root = build_tree(tmp_path / "src", files)

    proc = run_pack("imagefolder", root, "--to", "lmdb", "-o", tmp_path / "train.lmdb")
    assert proc.returncode == 0, f"pack exited {proc.returncode}\nstderr:\n{proc.stderr}"

    tv_classes, samples = torchvision_samples(root)
    assert len(samples) == 60
    want_path, want_label = samples[42]
    # Check the layout first (py-lmdb refuses to open an environment twice in one process,
    # and the snippet may leave its environment open).
    assert read_packed(tmp_path / "train.lmdb").samples[42].image == Path(want_path).read_bytes()

    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "doc_snippet"}
    exec(compile(snippet, f"{doc}:lmdb-snippet", "exec"), namespace)

    assert "image" in namespace and "label" in namespace, "the snippet must leave `image` and `label` defined"
    image, label = namespace["image"], namespace["label"]
    assert isinstance(image, (bytes, bytearray, memoryview)), f"`image` is {type(image).__name__}, not bytes"
    assert bytes(image) == Path(want_path).read_bytes(), f"`image` is not the bytes of {rel(root, want_path)}"
    assert isinstance(label, int) and not isinstance(label, bool), f"`label` is {type(label).__name__}, not int"
    assert label == want_label


# --------------------------------------------------------------------------- c) skipped files


def test_skipped_files_are_reported(tmp_path, run_pack, build_tree, read_packed):
    bad = {
        "alpha/a_zero_bytes.jpg": BAD / "zero_bytes.jpg",
        "alpha/m_html.jpg": BAD / "html.jpg",
        "beta/b_truncated_header.jpg": BAD / "truncated_header.jpg",
        "beta/sub/garbage.jpg": BAD / "garbage.jpg",
    }
    good = {
        "alpha/a_good.jpg": "cat/chelsea_01.jpg",
        "alpha/n_good.png": "cat/chelsea_04.png",
        "alpha/z_good.jpg": "space/rocket_01.jpg",
        "beta/a_good.jpg": "still_life/coffee_01.jpg",
        "beta/c_good.webp": "space/hubble_small.webp",
        "beta/sub/z_good.jpg": "texture/retina_01.jpg",
        "gamma/only.jpg": "texture/brick_01.jpg",
    }
    root = build_tree(tmp_path / "src", {**good, **bad})
    out = tmp_path / "out.lmdb"

    proc = run_pack("imagefolder", root, "--to", "lmdb", "-o", out, "--json", "--on-error", "skip")
    assert proc.returncode == 3, f"expected exit 3 (some files skipped), got {proc.returncode}\nstderr:\n{proc.stderr}"
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"--json stdout is not one JSON object ({e}):\n{proc.stdout!r}")
    assert isinstance(report, dict)
    found, packed_n, skipped = report["found"], report["packed"], report["skipped"]
    assert found == len(good) + len(bad)
    assert packed_n == len(good)
    assert found == packed_n + len(skipped)

    def as_rel(p: str) -> str:
        path = Path(p)
        if path.is_absolute():
            return path.relative_to(root).as_posix()
        return path.as_posix()

    skipped_by_path = {}
    for entry in skipped:
        assert isinstance(entry, dict) and {"path", "reason"} <= set(entry), entry
        skipped_by_path[as_rel(entry["path"])] = entry["reason"]
    assert sorted(skipped_by_path) == sorted(bad), f"skipped {sorted(skipped_by_path)}, expected {sorted(bad)}"
    for path, reason in skipped_by_path.items():
        assert isinstance(reason, str) and reason.strip(), f"empty reason for {path}"

    packed = read_packed(out)
    assert packed.meta["samples"] == packed_n
    assert_matches_torchvision(packed, root, exclude=set(bad))


# --------------------------------------------------------------------------- d) shuffle


def test_shuffle_is_a_permutation(tmp_path, run_pack, build_tree, read_packed, testdata_files):
    root = build_tree(tmp_path / "src", {f: f for f in testdata_files})
    n = len(testdata_files)

    def pack(name: str, *extra: str):
        out = tmp_path / name
        proc = run_pack("imagefolder", root, "--to", "lmdb", "-o", out, *extra)
        assert proc.returncode == 0, f"pack {' '.join(extra)} exited {proc.returncode}\nstderr:\n{proc.stderr}"
        return read_packed(out)

    plain = pack("plain.lmdb")
    # Same seed, different thread counts: the output must not depend on scheduling.
    shuffled = pack("shuffled.lmdb", "--shuffle", "--seed", "7", "--threads", "2")
    again = pack("again.lmdb", "--shuffle", "--seed", "7", "--threads", "1")

    assert plain.meta["samples"] == shuffled.meta["samples"] == n
    assert plain.meta["classes"] == shuffled.meta["classes"]
    assert_matches_torchvision(plain, root)

    def triples(p):
        return Counter((s.info["path"], s.image, s.label) for s in p.samples)

    assert triples(shuffled) == triples(plain)
    for s in shuffled.samples:  # each shuffled sample is still consistent with its source file
        assert s.image == (root / s.info["path"]).read_bytes()
    order_plain = [s.info["path"] for s in plain.samples]
    order_shuffled = [s.info["path"] for s in shuffled.samples]
    assert order_shuffled != order_plain, "--shuffle --seed 7 left the samples in their original order"

    assert sorted(again.records) == sorted(shuffled.records)
    differing = [k for k in shuffled.records if shuffled.records[k] != again.records[k]]
    assert not differing, f"two runs with --seed 7 differ at keys {differing[:10]}"
