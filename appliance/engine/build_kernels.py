"""Build our CPU kernels (csrc/: the C kernels, a file a family, and their torch operators) into one shared
library.

    python -m appliance.engine.build_kernels     # once, after `pip install` (make install, image builds)

compiles them into the installed package (`appliance/engine/_kernels/`), where the runtime looks first.
A library is named by a key over the sources, the compilers, the flags and the torch version it was
built against, so a stale one is never loaded. Only if no prebuilt library matches does the first use
build one (a compile of every source) as a fallback, into a private cache directory: `$XDG_CACHE_HOME/appliance/kernels`
(else `~/.cache/...`), created 0700 and used only if it and its parent are ours and writable by no one
else, else a fresh directory from `mkdtemp` (private, unpredictable, not reused). A shared object is never
loaded from a predictable path in a world-writable directory: on a read-only root file system point
$XDG_CACHE_HOME at a writable volume (the Helm chart's emptyDir).

Where the kernels cannot be built (not x86-64, no AVX2/FMA, no C/C++ compiler) `KernelBuildError` says
why and the engine runs on torch's kernels.
"""
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

CSRC = Path(__file__).parent / "csrc"
# The C kernels by family (csrc/cpu_kernels.h declares them), each compiled on its own and linked into one
# library with the torch operators (cpu_ops.cpp).
KERNEL_SOURCES = [CSRC / name for name in ("gemm_f32.c", "gemm_bf16.c", "gemm_bf16_fma.c", "gemm_int8.c",
                                           "gemm_int4.c", "gemm_int8_avx2.c", "decode_attention.c", "small_ops.c",
                                           "int4_tiles.c", "gemv_int4.c", "gemv_int4_avx2.c",
                                           "gemm_int4_avx2.c")]
HEADERS = [CSRC / name for name in ("cpu_kernels.h", "kernel_common.h", "few_rows.h", "group_panels.h", "panel16.h",
                                     "panel_layout.h", "vnni_tile.h", "int4_packing.h", "int4_groups.h",
                                     "int4_avx2.h", "int4_slabs.h", "quantize_avx2.h")]
SOURCES = [*KERNEL_SOURCES, *HEADERS, CSRC / "cpu_ops.cpp"]
PREBUILT_DIR = Path(__file__).parent / "_kernels"  # what `python -m appliance.engine.build_kernels` fills
C_FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC"]
# A kernel file's own flags past C_FLAGS: the int4 tiles round as torch's ops do, a product and a sum,
# so no multiply-add may be fused (the compilers fuse by default).
SOURCE_FLAGS = {"int4_tiles.c": ["-ffp-contract=off"]}
CXX_FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-std=c++20", "-shared"]
BUILD_TIMEOUT_S = 300


class KernelBuildError(Exception):
    """The kernels cannot be built or loaded here; the message says why."""


class KernelsUnsupported(KernelBuildError):
    """This machine cannot build (not x86-64, no compiler) or run (no AVX2/FMA) them: not a failure."""


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cpu_supports_avx2_fma() -> bool:
    if not is_x86_64():
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return False
    return "avx2" in flags and "fma" in flags


def compilers() -> List[str]:
    """[C compiler, C++ compiler]: $CC / $CXX, else cc / c++ (gcc / g++) on PATH."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cc or not cxx:
        raise KernelsUnsupported(f"no C/C++ compiler (cc and c++, or $CC and $CXX) on PATH (cc={cc}, c++={cxx})")
    return [cc, cxx]


def library_name(cc: str, cxx: str) -> str:
    """The library's file name: a key over everything that decides its contents."""
    import torch

    h = hashlib.sha256()
    for source in SOURCES:
        h.update(source.read_bytes())
    h.update(" ".join([cc, cxx, *C_FLAGS, *CXX_FLAGS, repr(sorted(SOURCE_FLAGS.items())), torch.__version__,
                       str(torch._C._GLIBCXX_USE_CXX11_ABI), sys.platform]).encode())
    return f"cpu_kernels-{h.hexdigest()[:16]}.so"


def compile_library(target: Path, cc: str, cxx: str) -> None:
    """Compile into `target` atomically (a temp file in the same directory, then a rename), so that
    concurrent builders (tensor-parallel ranks) never load a half-written file."""
    import torch

    torch_dir = Path(torch.__file__).parent
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        objs, lib = [Path(work) / f"{source.stem}.o" for source in KERNEL_SOURCES], Path(work) / target.name
        steps = [(source.name, [cc, *C_FLAGS, *SOURCE_FLAGS.get(source.name, []), "-c", str(source), "-o",
                                str(obj)])
                 for source, obj in zip(KERNEL_SOURCES, objs)]
        steps.append(("cpu_ops.cpp", [cxx, *CXX_FLAGS, abi, f"-I{torch_dir / 'include'}", str(CSRC / "cpu_ops.cpp"),
                                      *map(str, objs), "-o", str(lib), f"-L{torch_dir / 'lib'}", "-lc10",
                                      "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}"]))
        for source, command in steps:
            try:
                subprocess.run(command, check=True, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except FileNotFoundError as e:
                raise KernelsUnsupported(f"compiler not found: {e.filename}") from None
            except subprocess.CalledProcessError as e:
                raise KernelBuildError(f"{Path(command[0]).name} failed on {source}: "
                                       f"{(e.stderr or '').strip()[-800:]}") from None
            except subprocess.TimeoutExpired:
                raise KernelBuildError(f"{Path(command[0]).name} took over {BUILD_TIMEOUT_S} s on {source}") from None
        os.chmod(lib, 0o755)
        os.replace(lib, target)


def private_dir(path: Path) -> bool:
    """`path` is a real directory (not a link) owned by this user and writable by no one else; created
    0700 if missing (its parents too)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def trusted_file(path: Path) -> bool:
    """A regular file owned by this user and writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "appliance" / "kernels"


def find_or_build(prebuilt_dir: Optional[Path] = None, cache: Optional[Path] = None) -> Path:
    """The library to load: the prebuilt one if its key matches, else one in the private cache (built
    there on first use), else one built in a fresh private temp directory. KernelBuildError if none."""
    if not cpu_supports_avx2_fma():
        raise KernelsUnsupported("this CPU lacks AVX2/FMA (or is not x86-64)")
    cc, cxx = compilers()
    name = library_name(cc, cxx)
    prebuilt = (prebuilt_dir or PREBUILT_DIR) / name
    if prebuilt.is_file():
        return prebuilt
    cache = cache or cache_dir()
    if private_dir(cache.parent) and private_dir(cache):
        target = cache / name
        if target.exists() and trusted_file(target):
            return target
        if not target.exists():
            compile_library(target, cc, cxx)
            return target
    # The cache is missing, not ours, open to others, or holds a file we did not write: build where
    # nobody else can reach, for this process only.
    target = Path(tempfile.mkdtemp(prefix="appliance-kernels-")) / name
    compile_library(target, cc, cxx)
    return target


def build_into_package(prebuilt_dir: Optional[Path] = None) -> Path:
    """Compile into the installed package (install / image build time); removes stale builds there.
    The build host needs x86-64 and the compilers, not AVX2 itself: the runtime checks the CPU it runs on."""
    if not is_x86_64():
        raise KernelsUnsupported(f"the kernels are x86-64 code; this machine is {platform.machine()}")
    directory = prebuilt_dir or PREBUILT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    cc, cxx = compilers()
    target = directory / library_name(cc, cxx)
    compile_library(target, cc, cxx)
    for old in directory.glob("cpu_kernels-*.so"):
        if old != target:
            old.unlink()
    return target


def main(argv: Optional[List[str]] = None) -> int:
    """Exit 0 when built, or when this machine cannot build them (the engine then runs on torch's kernels
    and says why at start); 1 when a compiler fails on our sources."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m appliance.engine.build_kernels",
                                 description="Compile our CPU kernels into the installed package.")
    ap.parse_args(argv)
    try:
        target = build_into_package()
    except KernelsUnsupported as e:
        print(f"appliance: CPU kernels not built ({e}); the engine will use torch's kernels", file=sys.stderr)
        return 0
    except KernelBuildError as e:
        print(f"appliance: building the CPU kernels failed: {e}", file=sys.stderr)
        return 1
    print(f"appliance: CPU kernels built: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
