"""Run by the engine image's build: the image can compile what the engine compiles at run time.

Triton builds a small C launcher (it includes Python.h) the first time a kernel runs, and
our CPU kernels (`loader/native_library.py`) are C built with the system compiler. This
check compiles a Python C extension the way Triton's launcher is built, imports it, and
builds our three kernel libraries; any missing piece fails the image build with its name.

    python /opt/loraplex/engine_check.py
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

# Every module that holds one of our native kernel libraries (its `LIBRARY`).
NATIVE = (
    "loraplex.adapters.kernels.lora_cpu",
    "loraplex.platform.engine.layers.paged_attention_cpu",
    "loraplex.platform.engine.greedy_cpu",
)

_EXTENSION = """#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "launcher_check", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_launcher_check(void) { return PyModule_Create(&mod); }
"""


def fail(message: str) -> None:
    """Stop the build with `message`."""
    print(f"engine image check failed: {message}", file=sys.stderr)
    raise SystemExit(1)


def compiler() -> str:
    """The C compiler Triton and our kernels use (`CC`, else `cc`/`gcc` on PATH)."""
    found = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if found is None:
        fail("no C compiler on PATH (install gcc and libc6-dev)")
    return str(found)


def check_python_extension(cc: str) -> None:
    """Compile and import a C extension against this Python's headers, as Triton does."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        fail(f"no Python.h in {include} (install python3-dev)")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    with tempfile.TemporaryDirectory() as work:
        src, lib = Path(work) / "launcher_check.c", Path(work) / f"launcher_check{suffix}"
        src.write_text(_EXTENSION)
        cmd = [cc, "-shared", "-fPIC", "-O2", f"-I{include}", "-o", str(lib), str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            fail(f"compiling a Python C extension failed:\n{done.stderr[-2000:]}")
        sys.path.insert(0, work)
        importlib.import_module("launcher_check")
        sys.path.pop(0)


def check_native_kernels() -> int:
    """Build every native kernel library of the engine; the number built."""
    with tempfile.TemporaryDirectory() as cache:
        os.environ["XDG_CACHE_HOME"] = cache  # a throwaway: the serving CPU builds its own
        for name in NATIVE:
            library = importlib.import_module(name).LIBRARY
            if not library.available:
                fail(f"{name}: {library.error}")
    return len(NATIVE)


def main() -> int:
    """Run every check; 0 when the image can compile what the engine needs."""
    cc = compiler()
    check_python_extension(cc)
    print(f"python extension: compiled with {cc}")
    print(f"native kernels: {check_native_kernels()} built")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
