"""Build and load our C++ CPU kernels (kernels/csrc/) once per machine, at first use.

The build takes one to two minutes on 2 cores and is cached by torch (keyed by the sources and the
flags), so later starts load it in milliseconds. It compiles for this CPU (-march=native), with the
vector kernels of its ISA (docs/kernels.md: AVX-512 VNNI, AVX2 or NEON, the generic ones for the
rest); LOCALCHAT_CPU_ISA=generic|avx2|avx512|neon builds one ISA's kernels instead (generic: none).
Without a C++ compiler, or if the build fails, `cpu_kernels()` returns None (with a warning that
says why) and callers fall back to torch ops, unless LOCALCHAT_REQUIRE_CPU_KERNELS=1 (CI): then a
failed build raises, so it cannot pass unnoticed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path
from types import ModuleType

from localchat import envs

logger = logging.getLogger("localchat.kernels")

_SOURCE_SUFFIXES = (".cpp", ".h", ".def")  # module.cpp includes the rest
_TESTS = "tests"  # csrc/tests: standalone kernel tests, not part of the extension
_lock = threading.Lock()
_module: ModuleType | None = None
_failed: str | None = None
REQUIRE_ENV = envs.REQUIRE_CPU_KERNELS.name  # "1": a failed build raises instead of falling back
ISA_ENV = envs.CPU_ISA.name  # generic, avx2, avx512 or neon: build that ISA's kernels only
# each ISA's extra compiler flags, and what its build's simd_isa() says
ISAS = {
    "generic": (("-DLC_ISA_GENERIC",), ""),
    "avx2": (("-mno-avx512f",), "avx2"),
    "avx512": ((), "avx512-vnni"),
    "neon": ((), "neon"),
}


class CpuKernelsUnavailable(RuntimeError):
    """The kernels did not build where LOCALCHAT_REQUIRE_CPU_KERNELS=1 asks for them."""


def compiler() -> str | None:
    """The C++ compiler torch's extension builder runs (CXX, else c++), if it is installed."""
    return shutil.which(os.environ.get("CXX") or "c++")


def build_failure() -> str | None:
    """Why cpu_kernels() found no kernels (the build's error), once it has tried; else None."""
    return _failed


def _cpu_signature() -> str:
    """The CPU's feature flags, so a cache shared between machines never loads code built for
    another CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_kernels(progress=None) -> ModuleType | None:
    """The compiled extension, building it on first use; None when it cannot be built here."""
    global _module, _failed
    if _module is not None or envs.NO_CPU_KERNELS.get():
        return _module
    if _failed is None:
        with _lock:
            if _module is not None:
                return _module
            if _failed is None:
                # no compiler, no headers, an old CPU: run the torch fallback instead
                try:
                    if compiler() is None:
                        raise RuntimeError(
                            "no C++ compiler here (CXX or c++): install g++ or clang++ for the "
                            "C++ CPU kernels"
                        )
                    isa = envs.CPU_ISA.get()
                    _module = build_isa(isa, progress) if isa else build_kernels(progress=progress)
                except Exception as exc:
                    _failed = f"{type(exc).__name__}: {exc}"
                    logger.warning(
                        "CPU kernels unavailable, using slower torch ops (%s)",
                        _failed.splitlines()[0],
                    )
    if _module is None and envs.REQUIRE_CPU_KERNELS.get():
        raise CpuKernelsUnavailable(
            f"the C++ CPU kernels did not build and {REQUIRE_ENV}=1 requires them: {_failed}"
        )
    return _module


def build_isa(isa: str, progress=None) -> ModuleType:
    """The kernels built for one ISA (a key of ISAS): raises where this CPU cannot run it."""
    if isa not in ISAS:
        raise ValueError(f"{ISA_ENV}={isa!r}: expected one of {', '.join(ISAS)}")
    flags, expected = ISAS[isa]
    module = build_kernels(flags, progress=progress)
    if module.simd_isa() != expected:
        raise RuntimeError(
            f"{ISA_ENV}={isa}: this CPU's build has {module.simd_isa() or 'no'} vector kernels"
        )
    return module


def sources(directory: Path) -> list[Path]:
    """The extension's source files under `directory` (csrc), in a stable order: what the name of
    its build hashes."""
    return sorted(
        path
        for path in directory.rglob("*")
        if path.suffix in _SOURCE_SUFFIXES and _TESTS not in path.relative_to(directory).parts
    )


def build_kernels(extra_flags: tuple[str, ...] = (), progress=None) -> ModuleType:
    """Build the kernels for this CPU with `extra_flags` added to the compiler's (or load the build
    torch cached); raises where they cannot be built. cpu_kernels() takes the plain build (or
    build_isa's); the tests also build the AVX2 and the generic kernels on an AVX-512 machine."""
    from torch.utils import cpp_extension

    directory = Path(__file__).parent / "csrc"
    digest = hashlib.sha256((_cpu_signature() + "".join(f" {f}" for f in extra_flags)).encode())
    for source in sources(directory):
        digest.update(str(source.relative_to(directory)).encode())
        digest.update(source.read_bytes())
    name = f"localchat_cpu_{digest.hexdigest()[:12]}"
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    if progress is not None and not (build_dir / f"{name}.so").exists():
        progress("compiling the CPU kernels for this machine (first run only, one to two minutes)")
    return cpp_extension.load(
        name=name,
        sources=[str(directory / "module.cpp")],
        extra_cflags=["-O3", "-march=native", *extra_flags, "-fopenmp"],
        verbose=False,
    )
