"""Numba's cache directory is keyed by the source of all three packages."""
import os
import subprocess
import sys
import time
from pathlib import Path

from histogram import _jit_cache

REPO = Path(__file__).resolve().parents[2]


def _tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_source_key_changes_with_any_package_file(tmp_path):
    files = {"native/a.py": "x = 1\n", "histogram/k.py": "def f(): pass\n",
             "forest/sub/g.py": "y = 2\n", "forest/notes.txt": "not source\n"}
    _tree(tmp_path, files)
    key = _jit_cache.source_key(tmp_path)
    assert key == _jit_cache.source_key(tmp_path) and len(key) == 16
    (tmp_path / "forest/notes.txt").write_text("edited, but not a .py file\n")
    assert _jit_cache.source_key(tmp_path) == key
    for rel in ("native/a.py", "histogram/k.py", "forest/sub/g.py"):
        _tree(tmp_path, files)
        (tmp_path / rel).write_text(files[rel] + "# edited\n")
        assert _jit_cache.source_key(tmp_path) != key, rel
    _tree(tmp_path, files)
    (tmp_path / "forest/sub/g.py").rename(tmp_path / "forest/sub/h.py")   # same bytes, new name
    assert _jit_cache.source_key(tmp_path) != key


def _cache_dir_in_fresh_process(env):
    code = "import forest, numba; print(numba.config.CACHE_DIR)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, cwd=REPO).stdout.strip()


def test_fresh_process_uses_the_keyed_directory_unless_the_user_set_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    want = tmp_path / "histforest" / f"numba-{_jit_cache.source_key(REPO)}"
    assert _cache_dir_in_fresh_process(env) == str(want)
    assert want.is_dir()
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    assert _cache_dir_in_fresh_process(env) == str(tmp_path / "mine")


def test_no_home_leaves_numba_default(tmp_path, monkeypatch):
    """Without XDG_CACHE_HOME and with no home to expand, nothing is created in the working
    directory (a relative '~/.cache') and Numba keeps its own default."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)
    monkeypatch.chdir(tmp_path)
    assert _jit_cache._keyed_directory() is None
    assert list(tmp_path.iterdir()) == []


def test_old_directories_of_other_versions_are_pruned(tmp_path):
    base = tmp_path / "histforest"
    keep, recent, old, other = (base / "numba-keep", base / "numba-recent", base / "numba-old",
                                base / "unrelated")
    for path in (keep, recent, old, other):
        path.mkdir(parents=True)
    stale = time.time() - (_jit_cache.PRUNE_AFTER_DAYS + 1) * 86400
    for path in (keep, old, other):
        os.utime(path, (stale, stale))
    _jit_cache._prune(base, keep)
    assert keep.is_dir() and recent.is_dir() and other.is_dir()
    assert not old.exists()
