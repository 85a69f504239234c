"""Build a small C kernel library for this CPU once, and load it with ctypes.

The CPU kernels that torch ops cannot express without extra copies (paged attention reading
KV blocks in place, LoRA gathered per token) are plain C: no PyTorch headers, no Python
extension module, so a build takes about a second with the system C compiler and needs
nothing from PyPI. Each library is compiled with `-march=native` (this CPU's vector units),
so its cache key holds the source, the flags, the compiler and the CPU model; a build writes a
temporary file and renames it, so processes racing to build never load half a file.

`LORAPLEX_NATIVE_CFLAGS` adds flags after every library's own (and to the cache key), for a
build that must target less than this CPU: `-mno-avx512f` builds the AVX2 code an AVX2-only
machine would run, which is how `bench peer` figures for such CPUs are taken on this one.

Without a C compiler (or when `LORAPLEX_NATIVE_KERNELS=0`) `load_library` raises
`NativeBuildError` and callers keep their torch path; `NativeLibrary` keeps why, for reports.
Every kernel includes `native_common.h` (bf16 conversions), which is hashed into the key too.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# -fassociative-math (with the two flags it needs) lets fp32 sums vectorise: the kernels' sums
# are reordered, as every BLAS and oneDNN reorders them. -ffp-contract=fast fuses a * b + c
# into one FMA (-std=c11 turns that off by default): the LoRA kernel 10% faster.
# -fopenmp: the kernels split their work with OpenMP, and the library's libgomp.so.1 resolves to
# the one PyTorch has already loaded (same soname), so they run on torch's own thread pool.
CFLAGS = (
    "-O3", "-march=native", "-fPIC", "-std=c11", "-fno-math-errno",
    "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-ffp-contract=fast", "-fopenmp",
)  # fmt: skip
LINK_FLAGS = ("-shared", "-fopenmp")  # never a fast-math flag: see `_build`
COMMON_HEADER = Path(__file__).with_name("native_common.h")
DISABLE_ENV = "LORAPLEX_NATIVE_KERNELS"
EXTRA_CFLAGS_ENV = "LORAPLEX_NATIVE_CFLAGS"
BUILD_TIMEOUT_S = 120

_lock = threading.Lock()
_loaded: dict[Path, ctypes.CDLL] = {}


class NativeBuildError(RuntimeError):
    """The library cannot be built or loaded here (no compiler, a compile error, disabled)."""


def cache_dir() -> Path:
    """Where built libraries live: `$XDG_CACHE_HOME/loraplex/native` (or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loraplex" / "native"


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise NativeBuildError("no C compiler on PATH (cc or gcc; set CC)")
    return cc


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


def library_path(source: Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """The cached build of `source` for this compiler, flags and CPU."""
    cc = _compiler()
    key = hashlib.sha256()
    flags = " ".join((*CFLAGS, *extra_flags, "|", *LINK_FLAGS)).encode()
    parts = (
        source.read_bytes(),
        COMMON_HEADER.read_bytes(),
        flags,
        cc.encode(),
        _cpu_model().encode(),
    )
    for part in parts:
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"


def load_library(source: Path, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """`source` (a .c file) compiled for this CPU (with `extra_flags`, then those of
    `LORAPLEX_NATIVE_CFLAGS`, after `CFLAGS`) and loaded; built on first use, then cached."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        raise NativeBuildError(f"native kernels are off ({DISABLE_ENV}=0)")
    extra_flags = (*extra_flags, *shlex.split(os.environ.get(EXTRA_CFLAGS_ENV, "")))
    with _lock:
        target = library_path(source, extra_flags)
        lib = _loaded.get(target)
        if lib is not None:
            return lib
        if not target.exists():
            _build(source, target, extra_flags)
        try:
            lib = ctypes.CDLL(str(target))
        except OSError as exc:
            raise NativeBuildError(f"cannot load {target}: {exc}") from exc
        _loaded[target] = lib
        return lib


def _build(source: Path, target: Path, extra_flags: tuple[str, ...]) -> None:
    """Compile, then link in a second command: linking with -ffast-math would add
    crtfastmath.o, whose constructor flushes subnormals to zero in the whole process."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        obj, lib = Path(work) / "kernel.o", Path(work) / "kernel.so"
        cc = _compiler()
        include = f"-I{COMMON_HEADER.parent}"
        _run([cc, *CFLAGS, *extra_flags, include, "-c", "-o", str(obj), str(source)], source)
        _run([cc, *LINK_FLAGS, "-o", str(lib), str(obj), "-lm"], source)
        os.replace(lib, target)


def _run(cmd: list[str], source: Path) -> None:
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"compiling {source.name} failed: {exc}") from exc
    if done.returncode != 0:
        raise NativeBuildError(
            f"compiling {source.name} failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}"
        )


class NativeLibrary:
    """One kernel library, built on first use, its functions typed once; a library that cannot
    be built stays unavailable for the process, with the reason kept (`error`)."""

    def __init__(
        self,
        source: Path,
        signatures: dict[str, tuple[Sequence[Any], Any]],
        extra_flags: tuple[str, ...] = (),
    ) -> None:
        self.source = source
        self.signatures = signatures  # function name -> (argtypes, restype)
        self.extra_flags = extra_flags
        self.error: str | None = None
        self._functions: dict[str, Any] | None = None

    def functions(self) -> dict[str, Any] | None:
        """The typed functions by name, or None when the library cannot be built here."""
        if self._functions is None and self.error is None:
            try:
                lib = load_library(self.source, self.extra_flags)
            except NativeBuildError as exc:
                self.error = str(exc)
                return None
            found = {}
            for name, (argtypes, restype) in self.signatures.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = list(argtypes), restype
                found[name] = fn
            self._functions = found
        return self._functions

    @property
    def available(self) -> bool:
        """Whether the library is (or can now be) built and loaded."""
        return self.functions() is not None

    def get(self, name: str) -> Any:  # noqa: ANN401
        """Function `name`; raises `NativeBuildError` (with the reason) when unavailable."""
        functions = self.functions()
        if functions is None:
            raise NativeBuildError(f"{self.source.name} is unavailable: {self.error}")
        return functions[name]
