"""The package as installed: importable without torch, the `pack` command on PATH."""

import json
import subprocess
import sys

import imgpack
from conftest import ROOT, run_pack


def test_import_needs_neither_torch_nor_pillow():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "sys.modules['PIL'] = None\n"
        "import imgpack\n"
        "print(imgpack.__version__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == imgpack.__version__


def test_the_package_is_the_installed_one_not_the_source_tree():
    # The tests must exercise the wheel in site-packages, not python/imgpack in the checkout.
    assert "site-packages" in imgpack.__file__, imgpack.__file__


def test_pack_entry_point_runs_the_cli(tmp_path):
    version = run_pack("--version")
    assert version.stdout.strip() == f"pack {imgpack.__version__}"
    out = tmp_path / "t.lmdb"
    result = run_pack("imagefolder", ROOT, "--to", "lmdb", "-o", out, "--json")
    summary = json.loads(result.stdout)
    assert summary["type"] == "summary" and summary["packed"] == 31, summary
    ds = imgpack.open(out)
    assert len(ds) == 31


def test_pack_entry_point_keeps_exit_codes_and_messages(tmp_path):
    missing = tmp_path / "nothere"
    result = run_pack(missing, "--to", "lmdb", "-o", tmp_path / "x.lmdb", check=False)
    assert result.returncode == 1, result
    assert str(missing) in result.stderr
    usage = run_pack("imagefolder", ROOT, "--to", "nosuchformat", "-o", tmp_path / "y", check=False)
    assert usage.returncode == 2
    assert "nosuchformat" in usage.stderr
