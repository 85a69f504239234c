"""Building and loading a C kernel library: cached per source and CPU, clear errors."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from loraplex.loader import native_library
from loraplex.loader.native_library import NativeBuildError, library_path, load_library

SOURCE = "int add_one(int x) { return x + 1; }\n"
NEEDS_CC = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine"
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native_library, "_loaded", {})
    return tmp_path / "cache" / "loraplex" / "native"


@NEEDS_CC
def test_builds_once_then_loads_the_cached_library(tmp_path, cache):
    src = tmp_path / "add.c"
    src.write_text(SOURCE)
    lib = load_library(src)
    lib.add_one.argtypes, lib.add_one.restype = [ctypes.c_int], ctypes.c_int
    assert lib.add_one(41) == 42
    built = library_path(src)
    assert built.parent == cache and built.exists()
    mtime = built.stat().st_mtime_ns
    native_library._loaded.clear()
    load_library(src)
    assert built.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in cache.iterdir()] == [built.name]  # no temporary file left


@NEEDS_CC
def test_a_changed_source_or_flag_gets_its_own_build(tmp_path, cache):
    src = tmp_path / "add.c"
    src.write_text(SOURCE)
    first = library_path(src)
    assert library_path(src, ("-DX=1",)) != first
    src.write_text(SOURCE + "int two(void) { return 2; }\n")
    assert library_path(src) != first


@NEEDS_CC
def test_flags_from_the_environment_build_their_own_library(tmp_path, cache, monkeypatch):
    """LORAPLEX_NATIVE_CFLAGS reaches the compiler (a macro the source needs) and the key."""
    src = tmp_path / "answer.c"
    src.write_text("int answer(void) { return ANSWER; }\n")
    with pytest.raises(NativeBuildError, match="ANSWER"):
        load_library(src)  # undeclared without the flag
    monkeypatch.setenv("LORAPLEX_NATIVE_CFLAGS", "-DANSWER=42 -O1")
    lib = load_library(src)
    lib.answer.restype = ctypes.c_int
    assert lib.answer() == 42
    assert [p.name for p in cache.glob("*.so")] == [library_path(src, ("-DANSWER=42", "-O1")).name]


@NEEDS_CC
def test_a_compile_error_raises_with_the_compiler_output(tmp_path, cache):
    src = tmp_path / "broken.c"
    src.write_text("int broken( { return 0; }\n")
    with pytest.raises(NativeBuildError, match="compiling broken.c failed"):
        load_library(src)
    assert not any(cache.glob("*.so"))


def test_no_compiler_or_switched_off_raises(tmp_path, cache, monkeypatch):
    src = tmp_path / "add.c"
    src.write_text(SOURCE)
    monkeypatch.setenv("LORAPLEX_NATIVE_KERNELS", "0")
    with pytest.raises(NativeBuildError, match="off"):
        load_library(src)
    monkeypatch.delenv("LORAPLEX_NATIVE_KERNELS")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(NativeBuildError, match="no C compiler"):
        load_library(src)


@NEEDS_CC
def test_native_library_types_its_functions_and_keeps_why_it_is_unavailable(tmp_path, cache):
    from loraplex.loader.native_library import NativeLibrary

    src = tmp_path / "add.c"
    src.write_text('#include "native_common.h"\n' + SOURCE)  # the shared header is found
    lib = NativeLibrary(src, {"add_one": ([ctypes.c_int], ctypes.c_int)})
    assert lib.available and lib.error is None
    assert lib.get("add_one")(1) == 2
    broken = tmp_path / "broken.c"
    broken.write_text("int nope(\n")
    bad = NativeLibrary(broken, {"nope": ([], ctypes.c_int)})
    assert not bad.available and "compiling broken.c failed" in bad.error
    with pytest.raises(NativeBuildError, match="broken.c is unavailable"):
        bad.get("nope")
