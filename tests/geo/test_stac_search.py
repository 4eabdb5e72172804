"""Search as input against a real STAC API (stac-fastapi-pgstac over PostgreSQL, tests/stac_api.py) holding
27 synthetic HLS-like items (3 tiles x 9 dates) whose band COGs a range-request server serves."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from appliance.config.schema import SearchConfig
from appliance.errors import InputError
from appliance.stages.geo.search_plan import plan_scenes, tile_of, when
from appliance.stages.geo.stac_search import cloud_params, run_search
from tests.geo.conftest import make_cfg, run_geo
from tests.geo.hls import STAC_BANDS, masks_equal
from tests.geo.stac_catalog import CLOUD_COVER, COLLECTION, TILES, item_id
from tests.stac_api import free_port

REGION_FILES = ("collection.json", "mosaic.tif", "summary.json")  # the region stage's, over output=DIR/


def search(catalog, **keys):
    """`search.*` as composed: the schema's defaults, this catalog's API and collection, then `keys`."""
    return {**dataclasses.asdict(SearchConfig()), "url": catalog.api_url, "collections": [COLLECTION], **keys}


def ids(items):
    return sorted(item["id"] for item in items)


def tile_bbox(catalog, tile):
    """A lon/lat box inside one tile's footprint."""
    west, south, east, north = next(i for i in catalog.items if i["properties"]["grid:code"] == f"MGRS-{tile}")["bbox"]
    return [west + 0.001, south + 0.001, east - 0.001, north - 0.001]


def test_a_search_over_many_pages_finds_every_item(stac_catalog):
    found = run_search(search(stac_catalog, page_size=4))  # 27 items: 7 pages
    assert len(stac_catalog.items) == 27 and len({tile_of(i) for i in stac_catalog.items}) == 3
    assert ids(found) == ids(stac_catalog.items)
    assert all(any(link["rel"] == "self" for link in item["links"]) for item in found)
    assert len(run_search(search(stac_catalog, page_size=4, max_items=10))) == 10


def test_the_cloud_filter_leaves_out_the_cloudy_items(stac_catalog):
    found = run_search(search(stac_catalog, max_cloud_cover=50, page_size=5))
    expected = [i for i in stac_catalog.items if i["properties"]["eo:cloud_cover"] <= 50]
    assert len(expected) == 3 * sum(c <= 50 for c in CLOUD_COVER) == 18
    assert ids(found) == ids(expected)


def test_the_query_extension_form_of_the_cloud_filter_gives_the_same_items(stac_catalog):
    """The form used where an API lacks CQL2: this API offers both, so both forms are checked here."""
    from pystac_client import Client

    client = Client.open(stac_catalog.api_url)
    cql2 = [i.to_dict() for i in client.search(collections=[COLLECTION], **cloud_params(50, True, False)).items()]
    query = [i.to_dict() for i in client.search(collections=[COLLECTION], **cloud_params(50, False, True)).items()]
    assert len(query) == 18 and ids(query) == ids(cql2)
    assert all(i["properties"]["eo:cloud_cover"] <= 50 for i in query)


def test_bbox_and_datetime_narrow_the_search(stac_catalog):
    found = run_search(search(stac_catalog, bbox=tile_bbox(stac_catalog, TILES[1]), datetime="2024-04-05/2024-04-30"))
    assert {tile_of(i) for i in found} == {TILES[1]}
    assert sorted(when(i).strftime("%m-%d") for i in found) == ["04-11", "04-21"]


def test_the_crops_pipeline_groups_three_dates_per_tile(stac_catalog):
    found = run_search(search(stac_catalog, max_cloud_cover=50, page_size=5))
    scenes, skipped = plan_scenes(found, STAC_BANDS, 3)
    assert skipped == []  # 6 clear dates a tile: two scenes each
    assert sorted(tile_of(s[0]) for s in scenes) == sorted(TILES * 2)
    for scene in scenes:
        assert len({tile_of(i) for i in scene}) == 1
        assert [when(i) for i in scene] == sorted(when(i) for i in scene)
    assert all(len(scene) == 3 for scene in scenes)
    assert sorted(i["id"] for s in scenes for i in s) == ids(found)


def test_unreachable_api_and_empty_search_are_one_clear_error(stac_catalog):
    with pytest.raises(InputError, match="could not be searched") as e:
        run_search(search(stac_catalog, url=f"http://127.0.0.1:{free_port()}"))
    assert e.value.param == "search.url"
    cfg = OmegaConf.merge(make_cfg(), {"search": search(stac_catalog, datetime="1990-01-01/1990-02-01")})
    with pytest.raises(InputError, match="no items found") as e:
        run_geo(None, stac_catalog.root / "none", cfg=cfg)
    assert e.value.param == "search"


def test_a_search_run_writes_each_items_mask_as_a_run_of_that_item_alone(stac_catalog, tmp_path):
    cfg = OmegaConf.merge(make_cfg(tile_size=64, overlap=16), {"search": search(
        stac_catalog, bbox=tile_bbox(stac_catalog, TILES[0]), datetime="2024-04-01/2024-04-15")})
    records = run_geo(None, tmp_path / "out", cfg=cfg)
    names = [item_id(TILES[0], day) for day in (when(i).date() for i in stac_catalog.items[:2])]
    assert sorted(os.path.basename(r["output_path"]) for r in records) == sorted(f"{n}.mask.tif" for n in names)
    for name in names:
        run_geo(str(stac_catalog.root / f"{name}.json"), tmp_path / f"{name}.alone.tif",
                cfg=make_cfg(tile_size=64, overlap=16))
        assert masks_equal(tmp_path / "out" / f"{name}.mask.tif", tmp_path / f"{name}.alone.tif")
        stac = json.loads((tmp_path / "out" / f"{name}.mask.stac.json").read_text())
        assert [link["href"] for link in stac["links"] if link["rel"] == "derived_from"] == [
            f"{stac_catalog.api_url}/collections/{COLLECTION}/items/{name}"]


def appliance(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def search_args(catalog, tile, datetime, cloud=None):
    bbox = ",".join(f"{v:.6f}" for v in tile_bbox(catalog, tile))
    args = [f"search.url={catalog.api_url}", f"search.collections=[{COLLECTION}]", f"search.bbox=[{bbox}]",
            f"search.datetime={datetime}"]
    return args + ([f"search.max_cloud_cover={cloud}"] if cloud is not None else [])


def test_appliance_run_over_a_search_maps_each_scene_with_the_demo_model(stac_catalog, tmp_path):
    first_three = "2024-04-01/2024-04-25"  # dates 1-3 of the tile; date 3 is 85 % cloud
    run = appliance("run", "pipeline=prithvi_flood", *search_args(stac_catalog, TILES[2], first_three, 50),
                    f"output={tmp_path}/out/")
    assert run.returncode == 0, run.stderr
    names = sorted(os.listdir(tmp_path / "out"))
    items = [i for i in stac_catalog.items if tile_of(i) == TILES[2]][:2]
    assert names == sorted([f"{i['id']}{suffix}" for i in items for suffix in (".mask.tif", ".mask.stac.json")]
                           + list(REGION_FILES))
    assert run.stdout.count("wrote ") == 2
    table = run.stdout.split("region: summary ")[1].splitlines()[1:]  # the region's table ends the run
    assert table[0].split() == ["item", "land", "km²", "water", "km²", "valid", "nodata"]
    assert [line.split()[0] for line in table[1:-1]] == [f"{i['id']}.mask" for i in items]
    assert table[-1].startswith("region (mosaic.tif)")
    alone = appliance("run", "pipeline=prithvi_flood",
                      f"input=[{','.join(str(stac_catalog.root / (i['id'] + '.json')) for i in items)}]",
                      f"output={tmp_path}/alone/")
    assert alone.returncode == 0, alone.stderr
    for i in items:
        assert masks_equal(tmp_path / "out" / f"{i['id']}.mask.tif", tmp_path / "alone" / f"{i['id']}.mask.tif")


def test_appliance_run_over_a_search_maps_three_dates_a_scene_for_the_crops_model(stac_catalog, tmp_path):
    dates = "2024-04-01/2024-05-05"  # 04-01, 04-11, 04-21 (85 % cloud), 05-01: three clear dates, one scene
    run = appliance("run", "pipeline=prithvi_crops", *search_args(stac_catalog, TILES[1], dates, 50),
                    f"output={tmp_path}/out/")
    assert run.returncode == 0, run.stderr
    items = [i for i in stac_catalog.items if tile_of(i) == TILES[1] and i["properties"]["eo:cloud_cover"] <= 50][:3]
    first = items[0]["id"]
    assert sorted(os.listdir(tmp_path / "out")) == sorted([f"{first}.mask.stac.json", f"{first}.mask.tif",
                                                          *REGION_FILES])
    alone = appliance("run", "pipeline=prithvi_crops",
                      f"input=[{','.join(str(stac_catalog.root / (i['id'] + '.json')) for i in items)}]",
                      f"output={tmp_path}/alone.tif")
    assert alone.returncode == 0, alone.stderr
    assert masks_equal(tmp_path / "out" / f"{first}.mask.tif", tmp_path / "alone.tif")
    stac = json.loads((tmp_path / "out" / f"{first}.mask.stac.json").read_text())
    assert stac["properties"]["appliance:acquisition_dates"] == ["2024-04-01", "2024-04-11", "2024-05-01"]


def test_appliance_check_lists_what_would_run_and_what_is_skipped(stac_catalog):
    check = appliance("check", "pipeline=prithvi_crops", *search_args(stac_catalog, TILES[0], "2024-04-01/2024-06-30",
                                                                      50))
    assert check.returncode == 0, check.stderr
    lines = check.stdout.splitlines()
    tile = [i for i in stac_catalog.items if tile_of(i) == TILES[0]]
    run = [line for line in lines if line.startswith("run ")]
    skip = [line for line in lines if line.startswith("skip ")]
    assert len(run) == 6 and all(f"tile {TILES[0]}" in line and "4,096 px" in line for line in run)
    assert sorted(line.split()[1].rstrip(":") for line in skip) == sorted(
        i["id"] for i in tile if i["properties"]["eo:cloud_cover"] > 50)
    assert all("> 50% (search.max_cloud_cover)" in line for line in skip)
    assert lines[-2] == "search: 6 items found, 2 scenes over 1 tiles would run (8,192 pixels), 3 items skipped"
    assert lines[-1].startswith("ok: pipeline prithvi_crops")


@pytest.mark.parametrize("args, key", [
    (["search.bbox=[10,0,5,1]"], "search.bbox"),
    (["search.datetime=2024-06-30/2024-04-01"], "search.datetime"),
    (["search.url=http://127.0.0.1:9/"], "search.url"),
    (["input=scene.tif"], "input"),
])
def test_bad_search_keys_end_the_run_with_one_line_and_exit_2(stac_catalog, tmp_path, args, key):
    base = {"search.url": stac_catalog.api_url, "search.collections": f"[{COLLECTION}]"}
    base.update(arg.split("=", 1) for arg in args)
    run = appliance("run", "pipeline=prithvi_flood", *(f"{k}={v}" for k, v in base.items()), f"output={tmp_path}/o/")
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and f"error: {key}:" in run.stderr, run.stderr
