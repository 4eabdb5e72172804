"""A search split over shares (search.shares, JOB_COMPLETION_INDEX) and `appliance assemble`, against the real
STAC API of tests/geo/conftest.py's `stac_catalog` (27 items: 3 tiles x 9 dates)."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import rasterio

from appliance.errors import InputError
from appliance.stages.geo.search_shares import SHARE_ENV, Share, share_positions, this_share
from tests.geo.stac_catalog import COLLECTION
from tests.geo.test_stac_search import appliance

SHARES = 3


@pytest.mark.parametrize("keys, count", [
    ([f"item-{i:02d}" for i in range(27)], 3),
    ([f"item-{i:02d}" for i in range(26, -1, -1)], 3),  # the API's order does not matter
    (["c", "a", "b", "e", "d"], 2),
    (["only"], 3),  # more shares than scenes: some shares map nothing
    ([], 2),
])
def test_every_scene_is_in_exactly_one_share_and_shares_are_balanced(keys, count):
    shares = [share_positions(keys, Share(index, count)) for index in range(count)]
    assert sorted(p for share in shares for p in share) == list(range(len(keys)))
    assert {len(share) for share in shares} <= {len(keys) // count, len(keys) // count + 1}
    assert all(share == sorted(share) for share in shares)  # each share keeps the search's order
    ranked = sorted(keys)
    assert [keys[p] for p in shares[0]] == sorted(ranked[0::count], key=keys.index)


def test_the_share_comes_from_the_field_else_from_the_indexed_job(monkeypatch):
    monkeypatch.delenv(SHARE_ENV, raising=False)
    assert this_share({"shares": 1}) is None
    assert this_share({"shares": 3, "share": 2}) == Share(2, 3)
    with pytest.raises(InputError, match=r"search.share: search.shares=3 splits .* search.share=N \(0 to 2\)"):
        this_share({"shares": 3, "share": None})
    monkeypatch.setenv(SHARE_ENV, "1")
    assert this_share({"shares": 3, "share": None}) == Share(1, 3)
    assert this_share({"shares": 3, "share": 0}) == Share(0, 3)  # the field wins: runs by hand
    monkeypatch.setenv(SHARE_ENV, "3")
    with pytest.raises(InputError, match=r"JOB_COMPLETION_INDEX: 3; allowed: 0 to 2 .*must be the same"):
        this_share({"shares": 3, "share": None})
    monkeypatch.setenv(SHARE_ENV, "x")
    with pytest.raises(InputError, match=r"JOB_COMPLETION_INDEX: 'x' is not a share number"):
        this_share({"shares": 3, "share": None})


@pytest.mark.parametrize("keys, error", [
    (["search.shares=0"], "search.shares: 0; allowed: 1 or more"),
    (["search.url=http://127.0.0.1:9/", "search.shares=3", "search.share=3"],
     "search.share: 3; allowed: 0 to 2 (search.shares is 3)"),
    (["search.shares=2"], "search.shares: 2 splits a search's scenes; give the search (search.url)"),
])
def test_bad_share_settings_are_refused_before_the_run(keys, error, tmp_path):
    done = appliance("check", "pipeline=prithvi_flood", *keys, f"output={tmp_path}/out/")
    assert done.returncode == 2 and error in done.stderr, done.stderr


def region_args(catalog, out):
    """All 27 items, over three pages."""
    return ["pipeline=prithvi_flood", f"search.url={catalog.api_url}", f"search.collections=[{COLLECTION}]",
            "search.page_size=10", f"output={out}/"]


def share_run(args, index):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), SHARE_ENV: str(index)}
    return subprocess.Popen([sys.executable, "-m", "appliance.cli", "run", *args, f"search.shares={SHARES}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finished(process):
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return out, err


def written(stdout):
    """The ids of the scenes a run mapped: its `wrote DIR/<id>.mask.tif` lines."""
    return re.findall(r"^wrote \S*/([^/\s]+)\.mask\.tif", stdout, re.MULTILINE)


def untimed(item):
    """An item without `created`, the time its mask was made."""
    return {**item, "properties": {k: v for k, v in item["properties"].items() if k != "created"}}


def region_files(directory):
    collection = json.loads((directory / "collection.json").read_text())
    items = {p.name: untimed(json.loads(p.read_text())) for p in sorted(directory.glob("*.stac.json"))}
    summary = json.loads((directory / "summary.json").read_text())
    with rasterio.open(directory / "mosaic.tif") as ds:
        mosaic = (ds.crs, ds.transform, ds.read())
    return collection, items, summary, mosaic


def test_shares_map_every_item_once_and_assemble_gives_the_single_runs_region(stac_catalog, tmp_path):
    every = sorted(item["id"] for item in stac_catalog.items)
    out = tmp_path / "shares" / "region"
    args = region_args(stac_catalog, out)
    first_two = [share_run(args, index) for index in range(2)]  # two pods at once, into one directory
    mapped = [written(finished(process)[0]) for process in first_two]
    assert not any((out / name).exists() for name in ("collection.json", "mosaic.tif", "summary.json"))

    early = appliance("assemble", *args, f"search.shares={SHARES}")
    assert early.returncode == 2
    expected_missing = sorted(every)[2::SHARES]  # share 2's: the third of every three ids
    assert f"output: {len(expected_missing)} of the search's 27 scenes are not complete" in early.stderr
    assert sorted(re.findall(r"(HLS\.\S+) \(no mask\)", early.stderr)) == expected_missing

    out_2, err_2 = finished(share_run(args, 2))
    mapped.append(written(out_2))
    assert "share 2 of 3 (0 to 2) done" in out_2 and "search: share 2 of 3 (0 to 2): 9 of the 27 scenes" in err_2
    assert f"{out}: 9/9 scenes (100%)" in err_2, err_2  # progress over the share's scenes, in its log
    assert [sorted(ids) for ids in mapped] == [sorted(every)[i::SHARES] for i in range(SHARES)]
    assert sorted(i for ids in mapped for i in ids) == every  # each item once: none twice, none missing

    assembled = appliance("assemble", *args, f"search.shares={SHARES}")
    assert assembled.returncode == 0, assembled.stderr
    assert "region: 27 scenes of the search complete" in assembled.stdout

    single_out = tmp_path / "single" / "region"  # the same directory name: the same collection id
    single = appliance("run", *region_args(stac_catalog, single_out))
    assert single.returncode == 0, single.stderr
    assert sorted(written(single.stdout)) == every
    shared, alone = region_files(out), region_files(single_out)
    assert shared[0] == alone[0]  # collection
    assert shared[1] == alone[1] and len(shared[1]) == 27  # items, linked to it
    assert shared[2] == alone[2]  # summary
    assert shared[3][:2] == alone[3][:2] and np.array_equal(shared[3][2], alone[3][2])  # mosaic, pixel for pixel
    table = [run.stdout.split("region: summary")[1].split("\n", 1)[1] for run in (assembled, single)]
    assert table[0] == table[1]  # the terminal's table too

    again = appliance("run", *region_args(stac_catalog, single_out))  # a rerun maps none of the 27 again
    assert again.returncode == 0, again.stderr
    assert "search: skipped 27 complete of 27 scenes" in again.stderr and written(again.stdout) == []
    assert region_files(single_out)[2:3] == alone[2:3]
