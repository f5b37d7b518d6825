"""`make demo` sets up the package alone; `make test` keeps the test extra (its CUDA checks)."""
import shutil
import subprocess

import pytest

from cli_helpers import ROOT


def _dry_run(target):
    """The commands ``make TARGET`` would run on a fresh checkout (every rule out of date)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    proc = subprocess.run(["make", "--dry-run", "--always-make", "--no-print-directory", target], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.splitlines()


def _installs(lines):
    return [ln for ln in lines if " pip install " in ln and " -e " in ln]


def test_demo_installs_only_the_package():
    installs = _installs(_dry_run("demo"))
    assert installs and all("[test]" not in ln and "[cuda]" not in ln for ln in installs), installs
    assert any(ln.rstrip().endswith("-e .") for ln in installs), installs


def test_test_setup_keeps_the_test_extra():
    installs = _installs(_dry_run("setup"))
    assert any("'.[test]'" in ln for ln in installs), installs
