"""Where our CPU kernels' library comes from: the package (built at install), else a private cache,
never a directory others can write to."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.engine import build_kernels

needs_build = pytest.mark.skipif(not build_kernels.cpu_supports_avx2_fma(), reason="no AVX2/FMA here")


@pytest.fixture
def fake_compile(monkeypatch):
    """compile_library that writes a placeholder file and records where it built."""
    built = []

    def compile_library(target, cc, cxx):
        target.write_bytes(b"not really a library")
        os.chmod(target, 0o755)
        built.append(target)

    monkeypatch.setattr(build_kernels, "compile_library", compile_library)
    monkeypatch.setattr(build_kernels, "cpu_supports_avx2_fma", lambda: True)
    return built


def mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o777


def test_first_use_builds_once_into_a_private_cache(tmp_path, fake_compile):
    cache = tmp_path / "xdg" / "appliance" / "kernels"
    first = build_kernels.find_or_build(tmp_path / "no-prebuilt", cache)
    assert first.parent == cache and fake_compile == [first]
    assert mode(cache) == 0o700 and mode(cache.parent) == 0o700
    assert build_kernels.find_or_build(tmp_path / "no-prebuilt", cache) == first  # loaded, not rebuilt
    assert len(fake_compile) == 1


def test_the_prebuilt_library_comes_first(tmp_path, fake_compile):
    prebuilt = tmp_path / "package"
    prebuilt.mkdir()
    name = build_kernels.library_name(*build_kernels.compilers())
    (prebuilt / name).write_bytes(b"built at install")
    assert build_kernels.find_or_build(prebuilt, tmp_path / "cache" / "kernels") == prebuilt / name
    assert fake_compile == [] and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("spoil", ["world_writable", "group_writable_parent", "symlink", "foreign_file"])
def test_a_cache_others_can_write_to_is_never_used(tmp_path, fake_compile, spoil):
    """The cache directory (and its parent) must be ours and closed to others, and a cached library
    ours; otherwise the build goes to a fresh private temp directory (not reused, not predictable)."""
    cache = tmp_path / "xdg" / "appliance" / "kernels"
    name = build_kernels.library_name(*build_kernels.compilers())
    if spoil == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        cache.parent.mkdir(parents=True, mode=0o700)
        cache.symlink_to(elsewhere)
    else:
        cache.mkdir(parents=True, mode=0o700)
    if spoil == "world_writable":
        os.chmod(cache, 0o777)
    elif spoil == "group_writable_parent":
        os.chmod(cache.parent, 0o770)
    elif spoil == "foreign_file":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a file to another user")
        (cache / name).write_bytes(b"planted")
        os.chown(cache / name, 65534, 65534)
    built = build_kernels.find_or_build(tmp_path / "no-prebuilt", cache)
    try:
        assert fake_compile == [built]
        assert not str(built).startswith(str(tmp_path)) and built.parent.name.startswith("appliance-kernels-")
        assert mode(built.parent) == 0o700 and os.lstat(built.parent).st_uid == os.geteuid()
    finally:  # the fresh temp directory is the system's, not pytest's: leave nothing there
        shutil.rmtree(built.parent, ignore_errors=True)


def test_no_avx2_or_no_compiler_is_unsupported_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(build_kernels, "cpu_supports_avx2_fma", lambda: False)
    with pytest.raises(build_kernels.KernelsUnsupported, match="AVX2/FMA"):
        build_kernels.find_or_build(tmp_path, tmp_path / "cache")
    monkeypatch.setattr(build_kernels, "cpu_supports_avx2_fma", lambda: True)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(build_kernels.KernelsUnsupported, match="no-such-cc"):
        build_kernels.find_or_build(tmp_path / "none", tmp_path / "cache" / "kernels")


@needs_build
def test_build_command_fills_the_package_and_the_runtime_loads_it(tmp_path, monkeypatch, capsys):
    """`python -m appliance.engine.build_kernels` (here its main, into a stand-in package directory)
    builds the library; a fresh process then loads it from there and builds nothing in its cache."""
    package = tmp_path / "package_kernels"
    monkeypatch.setattr(build_kernels, "PREBUILT_DIR", package)
    (package).mkdir()
    (package / "cpu_kernels-0000000000000000.so").write_bytes(b"stale")
    assert build_kernels.main([]) == 0
    [built] = package.glob("cpu_kernels-*.so")  # the stale build is gone
    assert "CPU kernels built" in capsys.readouterr().out
    code = ("from pathlib import Path; from appliance.engine import build_kernels as b, cpu_kernels as k; "
            f"b.PREBUILT_DIR = Path({str(package)!r}); print(k.available(), k.library().path)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", str(built)]
    assert not (tmp_path / "cache").exists()


def test_build_command_on_an_unsupported_machine_exits_0(monkeypatch, capsys):
    monkeypatch.setattr(build_kernels, "is_x86_64", lambda: False)
    assert build_kernels.main([]) == 0
    assert "torch's kernels" in capsys.readouterr().err


def test_every_source_file_is_built_and_keys_the_library():
    """Each family's file compiles into the one library, and every file of csrc/ is in the key: editing any
    of them never loads a stale build."""
    csrc = sorted(p.name for p in build_kernels.CSRC.iterdir())
    assert sorted(p.name for p in build_kernels.SOURCES) == csrc
    assert sorted(p.name for p in build_kernels.KERNEL_SOURCES) == [name for name in csrc if name.endswith(".c")]
