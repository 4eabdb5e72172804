"""The one rule for server files a client names (appliance/fetch/local_files.py), as every route applies it."""
import os

import pytest

from appliance.errors import InputError
from appliance.fetch.local_files import allowed_path


@pytest.fixture
def root(tmp_path):
    (tmp_path / "media" / "sub").mkdir(parents=True)
    (tmp_path / "media" / "a.tif").write_bytes(b"x")
    (tmp_path / "secret.tif").write_bytes(b"s")
    os.symlink(tmp_path / "secret.tif", tmp_path / "media" / "link.tif")
    return tmp_path / "media"


@pytest.mark.parametrize("name", ["a.tif", "sub/../a.tif", "./a.tif"])
def test_names_inside_the_directory_resolve_there(root, name):
    assert allowed_path(name, str(root), "data.data") == os.path.realpath(root / "a.tif")


def test_an_absolute_name_inside_the_directory_is_fine(root):
    assert allowed_path(str(root / "a.tif"), str(root), "input") == os.path.realpath(root / "a.tif")


@pytest.mark.parametrize("name, fragment", [
    ("../secret.tif", "outside the allowed directory"),
    ("link.tif", "outside the allowed directory"),          # a symlink out of it
    ("/etc/passwd", "outside the allowed directory"),
    ("a.tif\0.png", "NUL"),
    ("", "expected a file name"),
    (7, "expected a file name"),
])
def test_names_that_leave_the_directory_are_refused(root, name, fragment):
    with pytest.raises(InputError) as info:
        allowed_path(name, str(root), "data.data")
    assert fragment in str(info.value) and str(info.value).startswith("data.data: ")
    assert info.value.param == "data.data"


def test_without_an_allowed_directory_every_name_is_refused(root):
    with pytest.raises(InputError, match="server.allowed_local_media_dir=DIR"):
        allowed_path("a.tif", None, "image")
