"""`AtomicFile` and `file_mode`: the one way every stage writes an output file."""
import os

import pytest

from appliance.errors import InputError
from appliance.output_files import AtomicFile, check_writable_dir, file_mode


def test_file_mode_is_what_open_would_give(tmp_path):
    probe = tmp_path / "plain"
    probe.write_text("x")
    assert file_mode() == os.stat(probe).st_mode & 0o777


def test_commit_renames_over_the_target_with_the_plain_mode(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with AtomicFile(str(target)) as temp:
        assert os.path.dirname(temp) == str(tmp_path) and os.path.basename(temp).startswith(".out.txt.")
        with open(temp, "w") as f:
            f.write("new")
        assert target.read_text() == "old", "the target is untouched until the end"
    assert target.read_text() == "new"
    assert os.stat(target).st_mode & 0o777 == file_mode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_failure_leaves_neither_output_nor_temp_files(tmp_path):
    target = tmp_path / "mask.tif"
    with pytest.raises(RuntimeError):
        with AtomicFile(str(target), sidecars=(".aux.xml",)) as temp:
            open(temp + ".aux.xml", "w").close()  # what GDAL may leave beside it
            raise RuntimeError("disk on fire")
    assert list(tmp_path.iterdir()) == []


def test_commit_and_abort_by_hand(tmp_path):
    kept, dropped = AtomicFile(str(tmp_path / "a")), AtomicFile(str(tmp_path / "b"))
    open(kept.temp_path + ".aux.xml", "w").close()
    kept.sidecars = (".aux.xml",)
    kept.commit()
    dropped.abort()
    dropped.abort()  # twice is harmless
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_missing_directory_is_checked_without_being_made(tmp_path):
    check_writable_dir(str(tmp_path / "new" / "deeper"))
    assert list(tmp_path.iterdir()) == []  # neither the directory nor a probe file is left


def test_a_directory_below_a_file_is_refused_naming_the_field(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"^features: cannot write to directory .*/file/sub \(") as refused:
        check_writable_dir(str(tmp_path / "file" / "sub"), field="features")
    assert refused.value.param == "features"


def test_the_first_file_written_makes_its_directory(tmp_path):
    target = tmp_path / "new" / "deeper" / "out.txt"
    with AtomicFile(str(target)) as temp, open(temp, "w") as f:
        f.write("x")
    assert target.read_text() == "x" and os.listdir(target.parent) == ["out.txt"]
