"""The inductor cache folder follows lpdl's sources (lpdl_core.compile_cache)."""
from __future__ import annotations

from lpdl_core import compile_cache


def _tree(root, body: str):
    (root / "pkg").mkdir(exist_ok=True)
    (root / "pkg" / "ops.py").write_text(body)
    compile_cache.source_key.cache_clear()
    return root


def test_a_changed_source_gets_another_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    first = compile_cache.use_versioned_cache(_tree(tmp_path, "def op(a, b): ..."))
    monkeypatch.delenv(compile_cache.ENV)
    again = compile_cache.use_versioned_cache(_tree(tmp_path, "def op(a, b): ..."))
    monkeypatch.delenv(compile_cache.ENV)
    changed = compile_cache.use_versioned_cache(_tree(tmp_path, "def op(a, b, nodes): ..."))
    assert first == again != changed
    assert first.rsplit("/", 1)[1].startswith("lpdl-") and first.rsplit("/", 1)[0] == changed.rsplit("/", 1)[0]
    compile_cache.source_key.cache_clear()


def test_the_users_cache_folder_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "mine"))
    assert compile_cache.use_versioned_cache() == str(tmp_path / "mine")


def test_the_package_key_is_stable_within_a_process():
    assert compile_cache.source_key() == compile_cache.source_key() and len(compile_cache.source_key()) == 12
