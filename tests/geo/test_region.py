"""A region's outputs (collection, mosaic, summary) over a search run's masks, and resuming that run,
against the real STAC API of tests/geo/conftest.py's `stac_catalog` (27 items: 3 tiles x 9 dates)."""
import json
import logging
import os
import re

import numpy as np
import pytest
import rasterio
from affine import Affine
from omegaconf import OmegaConf
from pystac.validation import validate_dict
from rasterio.windows import from_bounds

from appliance.stages.geo.region_items import RegionItem, incomplete
from appliance.stages.geo.region_mosaic import MosaicRule, combine, write_mosaic
from appliance.stages.geo.stitch import NODATA_CLASS
from tests.geo.conftest import make_cfg, run_geo, stages
from tests.geo.stac_catalog import TILES
from tests.geo.test_stac_search import appliance, search, search_args, tile_bbox

N = NODATA_CLASS


@pytest.mark.parametrize("rule, below, above, expected", [
    (MosaicRule.latest, [0, 1, N, N], [1, 0, 1, N], [1, 0, 1, N]),
    (MosaicRule.latest, [0, 1], [N, N], [0, 1]),  # nodata never covers a class
    (MosaicRule.max_class, [0, 1, N, 1], [1, 0, 0, N], [1, 1, 0, 1]),
])
def test_the_mosaic_rule_decides_overlaps(rule, below, above, expected):
    got = combine(np.array(below, np.uint8), np.array(above, np.uint8), rule)
    assert got.tolist() == expected


def region_run(catalog, out, overwrite=False, rule="latest", **keys):
    nodes = {**stages(tile_size=64, overlap=16), "region": {"mosaic_rule": rule}}
    cfg = OmegaConf.merge(make_cfg(nodes), {"search": search(catalog, **keys), "output": str(out)})
    return run_geo(None, out, overwrite=overwrite, cfg=cfg)


def read(path, window=None):
    with rasterio.open(path) as ds:
        return ds.read(1, window=window)


def test_a_search_run_writes_a_collection_a_mosaic_and_a_summary(stac_catalog, tmp_path):
    out = tmp_path / "region"
    records = region_run(stac_catalog, out, datetime="2024-04-01")  # one date: three tiles side by side
    masks = sorted(out.glob("*.mask.tif"))
    assert len(masks) == 3
    shown = [record["display"].split()[:2] for record in records if record["display"].startswith("region: ")]
    assert shown == [["region:", "collection"], ["region:", "mosaic"], ["region:", "summary"]]  # each as written

    collection = json.loads((out / "collection.json").read_text())
    validate_dict(collection, extensions=[])  # core schema, shipped with pystac (extension schemas are online)
    items = [json.loads((out / link["href"]).read_text()) for link in collection["links"] if link["rel"] == "item"]
    assert sorted(i["assets"]["mask"]["href"] for i in items) == sorted(m.name for m in masks)
    for item in items:
        validate_dict(item, extensions=[])
        assert item["collection"] == collection["id"] == "region"
        assert {"rel": "collection", "href": "collection.json", "type": "application/json"} in item["links"]
    west, south, east, north = collection["extent"]["spatial"]["bbox"][0]
    assert west == min(i["bbox"][0] for i in items) and east == max(i["bbox"][2] for i in items)
    assert south == min(i["bbox"][1] for i in items) and north == max(i["bbox"][3] for i in items)
    assert collection["extent"]["temporal"]["interval"][0][0].startswith("2024-04-01T16:58:49")
    classes = collection["summaries"]["classification:classes"]
    assert [c["description"] for c in classes[:2]] == ["land", "water"] and classes[2]["nodata"] is True

    with rasterio.open(out / "mosaic.tif") as mosaic:
        assert mosaic.tags(ns="IMAGE_STRUCTURE")["LAYOUT"] == "COG"
        for mask in masks:
            with rasterio.open(mask) as m:
                window = from_bounds(*m.bounds, transform=mosaic.transform)
                assert np.array_equal(mosaic.read(1, window=window.round_offsets().round_lengths()), m.read(1))

    summary = json.loads((out / "summary.json").read_text())
    assert sorted(s["mask"] for s in summary["items"]) == sorted(m.name for m in masks)
    for entry in summary["items"]:
        mask = read(out / entry["mask"])
        for index, cls in enumerate(entry["classes"]):
            assert cls["pixels"] == int((mask == index).sum())
            assert cls["area_km2"] == pytest.approx(cls["pixels"] * 30 * 30 / 1e6)
        assert entry["nodata_share"] == pytest.approx((mask == N).mean())
        assert entry["valid_share"] + entry["nodata_share"] == pytest.approx(1.0)
    total = summary["total"]
    assert total["source"] == "mosaic.tif"  # three footprints apart: the region is the sum of the items
    for index, cls in enumerate(total["classes"]):
        assert cls["pixels"] == sum(s["classes"][index]["pixels"] for s in summary["items"])
    table = records[-1]["display"].splitlines()
    assert table[-1].startswith("region (mosaic.tif)") and len(table) == 1 + 1 + 3 + 1  # its line, header, rows, total


@pytest.mark.parametrize("rule", ["latest", "max_class"])
def test_overlapping_masks_are_mosaicked_by_the_declared_rule(stac_catalog, tmp_path, rule):
    out = tmp_path / rule
    region_run(stac_catalog, out, rule=rule, bbox=tile_bbox(stac_catalog, TILES[0]), datetime="2024-04-01/2024-04-15")
    older, newer = (read(p) for p in sorted(out.glob("*.mask.tif")))  # the ids sort by date
    assert not np.array_equal(older, newer)
    if rule == "latest":
        expected = np.where(newer != N, newer, older)
    else:
        expected = np.where((older != N) & (newer != N), np.maximum(older, newer), np.minimum(older, newer))
    assert np.array_equal(read(out / "mosaic.tif"), expected)


def mtimes(directory):
    return {p.name: p.stat().st_mtime_ns for p in directory.glob("*.mask.tif")}


def test_a_rerun_skips_complete_scenes_and_redoes_only_what_is_missing(stac_catalog, tmp_path, caplog):
    out = tmp_path / "resume"
    keys = dict(bbox=tile_bbox(stac_catalog, TILES[1]), datetime="2024-04-01/2024-04-25")
    assert len([r for r in region_run(stac_catalog, out, **keys) if "output_path" in r]) == 3
    first = mtimes(out)

    with caplog.at_level(logging.WARNING):
        records = region_run(stac_catalog, out, **keys)
    assert [r for r in records if "output_path" in r] == []
    assert "skipped 3 complete of 3 scenes" in caplog.text
    assert mtimes(out) == first
    assert any(r["display"].startswith("region: collection") for r in records)  # rebuilt from what exists

    gone = sorted(first)[1]
    os.remove(out / gone)
    redone = [os.path.basename(r["output_path"]) for r in region_run(stac_catalog, out, **keys) if "output_path" in r]
    assert redone == [gone]
    again = mtimes(out)
    assert {k: v for k, v in again.items() if k != gone} == {k: v for k, v in first.items() if k != gone}

    half_done = sorted(first)[2]  # a run stopped after the mask was renamed in, before its item was written
    os.remove(out / half_done.replace(".tif", ".stac.json"))
    redone = [os.path.basename(r["output_path"]) for r in region_run(stac_catalog, out, **keys) if "output_path" in r]
    assert redone == [half_done] and (out / half_done.replace(".tif", ".stac.json")).exists()
    again = mtimes(out)

    redone = [r for r in region_run(stac_catalog, out, overwrite=True, **keys) if "output_path" in r]
    assert len(redone) == 3 and all(mtimes(out)[k] != again[k] for k in again)


def test_outputs_are_complete_only_when_checked_so(stac_catalog, tmp_path):
    out = tmp_path / "checked"
    region_run(stac_catalog, out, bbox=tile_bbox(stac_catalog, TILES[2]), datetime="2024-04-01")
    mask = next(out.glob("*.mask.tif"))
    item_path = out / mask.name.replace(".tif", ".stac.json")
    assert incomplete(str(mask)) is None
    item = json.loads(item_path.read_text())

    item_path.write_text(json.dumps({**item, "properties": {**item["properties"], "proj:shape": [32, 64]}}))
    assert "its STAC item says 64x32" in incomplete(str(mask))
    item_path.write_text(json.dumps({**item, "assets": {"mask": {"href": "other.tif"}}}))
    assert "names other.tif" in incomplete(str(mask))
    item_path.unlink()
    assert "no readable STAC item" in incomplete(str(mask))
    item_path.write_text(json.dumps(item))
    with rasterio.open(mask) as ds:
        profile, data = ds.profile, ds.read()
    with rasterio.open(mask, "w", **{**profile, "driver": "GTiff"}) as ds:  # same pixels, not a COG
        ds.write(data)
    assert incomplete(str(mask)) == "the mask is not a COG"


def write_mask(path, value, crs, left, top):
    with rasterio.open(path, "w", driver="GTiff", width=64, height=64, count=1, dtype="uint8", crs=crs,
                       transform=Affine(30.0, 0.0, left, 0.0, -30.0, top), nodata=N) as ds:
        ds.write(np.full((1, 64, 64), value, np.uint8))
        ds.write_colormap(1, {0: (0, 0, 0, 255), 1: (0, 0, 255, 255)})
        ds.update_tags(class_names="land,water")
    return str(path)


def test_masks_in_another_crs_are_warped_into_the_mosaics(tmp_path):
    """Two UTM zones, about 80 km apart: the mosaic takes the oldest mask's CRS and warps the other in."""
    older = RegionItem(write_mask(tmp_path / "a.tif", 0, "EPSG:32615", 700000.0, 3300000.0), "",
                       {"id": "a", "properties": {"datetime": "2024-04-01T00:00:00Z"}})
    newer = RegionItem(write_mask(tmp_path / "b.tif", 1, "EPSG:32616", 200000.0, 3300000.0), "",
                       {"id": "b", "properties": {"datetime": "2024-04-02T00:00:00Z"}})
    path = write_mosaic(str(tmp_path), [older, newer], MosaicRule.latest)
    with rasterio.open(path) as mosaic, rasterio.open(older.mask_path) as a:
        assert mosaic.crs == a.crs and mosaic.res == a.res
        assert np.array_equal(mosaic.read(1, window=from_bounds(*a.bounds, transform=mosaic.transform)), a.read(1))
        data, width = mosaic.read(1), mosaic.width
    assert width > 2000  # ~80 km of 30 m pixels
    assert (data == 0).sum() == 64 * 64
    assert abs(int((data == 1).sum()) - 64 * 64) < 0.05 * 64 * 64  # the same area, on a grid turned ~2.5°
    assert set(np.unique(data)) == {0, 1, N}  # the gap between them stays nodata


def test_appliance_run_twice_over_a_search_maps_once_and_rebuilds_the_region(stac_catalog, tmp_path):
    args = ["run", "pipeline=prithvi_flood", *search_args(stac_catalog, TILES[0], "2024-04-01/2024-04-15"),
            f"output={tmp_path}/out/"]
    first = appliance(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("wrote ") == 2 and "region: summary" in first.stdout
    masks = mtimes(tmp_path / "out")
    again = appliance(*args)
    assert again.returncode == 0, again.stderr
    assert "search: skipped 2 complete of 2 scenes" in again.stderr
    assert "wrote " not in again.stdout and mtimes(tmp_path / "out") == masks
    assert again.stdout.split("region: summary")[1] == first.stdout.split("region: summary")[1]  # the same table


def test_a_run_of_several_scenes_reports_scenes_done_with_an_eta(stac_catalog, tmp_path, capsys):
    out = tmp_path / "progress"
    nodes = {**stages(tile_size=64, overlap=16), "region": {"progress_interval": 1e-6}}  # a line per scene
    keys = dict(bbox=tile_bbox(stac_catalog, TILES[0]), datetime="2024-04-01/2024-04-25")
    cfg = OmegaConf.merge(make_cfg(nodes), {"search": search(stac_catalog, **keys), "output": str(out)})
    run_geo(None, out, cfg=cfg)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"{out}: ")]
    assert [line.split(",")[0] for line in lines] == [f"{out}: {n}/3 scenes ({100 * n // 3}%)" for n in (1, 2, 3)]
    assert all(re.search(r", [0-9.]+ scenes/s, eta \d", line) for line in lines[:2]), lines
    assert re.search(r", [0-9.]+ scenes/s, in \d+s$", lines[2]), lines

    capsys.readouterr()
    run_geo(None, out, cfg=cfg)  # every scene complete: none to count
    assert f"{out}: " not in capsys.readouterr().err
