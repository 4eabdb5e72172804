"""Output files appear whole or not at all: write a temporary file beside the target, rename it over the
target once complete (`os.replace`, atomic within a directory), remove it on any failure.

    with AtomicFile(path) as temp:          # commit on success, abort on an exception
        save(temp)

or, for a file written over a longer life (a GeoTIFF written strip by strip): `AtomicFile(path)`, then
`commit()` or `abort()`. The committed file gets the permissions a plain `open(path, "w")` would give
(`file_mode`), not mkstemp's 0600. A missing directory is made when its first file is written, never by
the checks before a run (`check_writable_dir`), so `appliance check` leaves the disk as it found it.
"""
import os
import tempfile
from typing import Sequence

from appliance.errors import InputError

DEFAULT_UMASK = 0o022


def check_writable_dir(directory: str, field: str = "output") -> None:
    """InputError naming `field` unless files can be made in `directory`: it is a directory we can write
    in, or, where it does not exist yet, the nearest directory above it is (the writer makes the rest).
    The proof is a probe file made and removed at once; no directory is made."""
    directory = os.path.abspath(directory or ".")
    existing = directory
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(20, "not a directory", existing)
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".appliance-probe-"):
            pass
    except OSError as e:
        raise InputError(f"{field}: cannot write to directory {directory} ({e.strerror or e})", param=field) from None


def sibling_path(output_path: str, suffix: str) -> str:
    """A file written beside an output, its extension replaced: `m.tif` -> `m<suffix>`."""
    base = output_path[: -len(".tif")] if output_path.lower().endswith(".tif") else os.path.splitext(output_path)[0]
    return base + suffix


def file_mode() -> int:
    """0o666 less the process umask, read from /proc (Linux) so as never to set the process-wide umask to
    read it (a race with other threads); elsewhere the common umask 022."""
    try:
        with open("/proc/self/status") as status:
            mask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = DEFAULT_UMASK
    return 0o666 & ~mask


class AtomicFile:
    """A temporary file in `path`'s directory (`.<name>.<random>.tmp`), renamed over `path` by `commit`.
    `sidecars`: suffixes of files a writer leaves beside the temporary file (GDAL's `.aux.xml`), removed
    with it."""

    def __init__(self, path: str, sidecars: Sequence[str] = ()):
        self.path = str(path)
        self.sidecars = tuple(sidecars)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        fd, self.temp_path = tempfile.mkstemp(prefix=f".{os.path.basename(self.path)}.", suffix=".tmp",
                                              dir=directory)
        os.close(fd)

    def commit(self) -> None:
        self._remove_sidecars()
        os.chmod(self.temp_path, file_mode())
        os.replace(self.temp_path, self.path)

    def abort(self) -> None:
        self._remove_sidecars()
        _remove(self.temp_path)

    def _remove_sidecars(self) -> None:
        for suffix in self.sidecars:
            _remove(self.temp_path + suffix)

    def __enter__(self) -> str:
        return self.temp_path

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
