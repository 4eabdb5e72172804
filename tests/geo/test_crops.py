"""`appliance run pipeline=prithvi_crops`: three dates of one place as a list of files or as one stacked
file give the same class map (13 classes, the config's names and colours); dates that do not share CRS,
grid or bands are refused in one line naming the date (exit 2) unless raster_read.resample says how to
warp them; each date's acquisition date reaches a TL model as its own frame of temporal_coords; the
progress line names every date.

The demo model (scripts/train_prithvi_flood.py --target crops) trained on seeds 10000 and up; the bundled
sample is seed 0, which training never saw.
"""
import json
import re
import shutil

import numpy as np
import pytest
import rasterio
from affine import Affine

from tests.conftest import REPO, assert_user_error, run_cli

SAMPLES = REPO / "appliance" / "assets" / "samples"
DATES = [SAMPLES / f"crops_sample_date{i}.tif" for i in (1, 2, 3)]
STACKED = SAMPLES / "crops_sample_stacked.tif"
LABELS = SAMPLES / "crops_sample_labels.tif"
WHEN = ["2023-04-15", "2023-07-01", "2023-09-15"]  # the samples' ACQUISITION_DATE tags
ENV = {"OMP_NUM_THREADS": "1"}
MIN_ACCURACY = 0.85  # the demo model on the sample (held-out scores: docs/geo.md, metrics.json)


def crops(*args):
    return run_cli("run", "pipeline=prithvi_crops", "pipeline.stages.stitch.progress=false", *args,
                   timeout=300, env=ENV)


def as_list(paths):
    return "input=[" + ",".join(str(p) for p in paths) + "]"


@pytest.fixture(scope="module")
def masks(tmp_path_factory):
    out = tmp_path_factory.mktemp("crops")
    listed, stacked = out / "listed.tif", out / "stacked.tif"
    for output, source in ((listed, as_list(DATES)), (stacked, f"input={STACKED}")):
        result = crops(source, f"output={output}")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"wrote {output}: 256x192, 1 tile, "), result.stdout
    return listed, stacked


def test_a_list_of_dates_and_the_stacked_file_give_the_same_map(masks):
    listed, stacked = masks
    with rasterio.open(listed) as a, rasterio.open(stacked) as b, rasterio.open(DATES[0]) as src:
        assert np.array_equal(a.read(), b.read())
        assert (a.crs, a.transform, a.shape) == (src.crs, src.transform, src.shape)
        assert a.dtypes == ("uint8",) and a.nodata == 255
        tags = a.tags()
    names = "natural_vegetation,forest,corn,soybeans,wetlands,developed_barren,open_water,winter_wheat," \
            "alfalfa,fallow_idle_cropland,cotton,sorghum,other"
    assert tags["class_names"] == names
    assert tags["acquisition_dates"] == ",".join(WHEN)  # each date's own ACQUISITION_DATE tag
    item = json.loads(listed.with_name("listed.stac.json").read_text())
    assert item["properties"]["appliance:acquisition_dates"] == WHEN
    assert item["properties"]["start_datetime"].startswith(WHEN[0])
    assert item["properties"]["end_datetime"].startswith(WHEN[-1])
    assert [link["href"] for link in item["links"] if link["rel"] == "derived_from"][-1].endswith("date3.tif")
    classes = item["assets"]["mask"]["classification:classes"]
    assert [c["name"] for c in classes][:13] == names.split(",") and classes[2]["color_hint"] == "FFD300"


def test_the_progress_line_names_every_date(tmp_path):
    """Progress names the scene by all its dates; the outputs keep date 1's name."""
    result = run_cli("run", "pipeline=prithvi_crops", as_list(DATES), f"output={tmp_path / 'crops.tif'}",
                     timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    names = " + ".join(path.name for path in DATES)
    assert re.fullmatch(rf"{re.escape(names)}: 1/1 tile \(100%\), \d+\.\d tiles/s, in \d+\S*",
                        result.stderr.splitlines()[-1]), result.stderr


def test_the_demo_model_classifies_the_sample(masks):
    with rasterio.open(masks[0]) as ds, rasterio.open(LABELS) as lab:
        mask, labels = ds.read(1), lab.read(1)
    with rasterio.open(STACKED) as src:
        nodata = (src.read() == src.nodata).any(axis=0)
    assert np.array_equal(mask == 255, nodata)  # nodata where a date lacks a band
    keep = labels != 255  # labels also leave out clouds
    accuracy = float((mask[keep] == labels[keep]).mean())
    assert accuracy >= MIN_ACCURACY, accuracy
    # corn and soybeans look the same on dates 1 and 2: only date 3 parts them
    for cls in (2, 3):
        assert (mask[labels == cls] == cls).mean() > 0.7


def rewrite(src, dst, *, crs=None, shift=0.0, extra_band=False):
    """A copy of `src` with another CRS, its grid moved by `shift` metres, or a seventh band."""
    with rasterio.open(src) as ds:
        profile, data = ds.profile, ds.read()
        descriptions, tags = ds.descriptions, ds.tags()
    profile.update(crs=crs or profile["crs"], transform=profile["transform"] @ Affine.translation(shift / 30, 0))
    if extra_band:
        data = np.concatenate([data, data[:1]])
        descriptions = (*descriptions, "EXTRA")
    profile["count"] = len(data)
    with rasterio.open(dst, "w", **profile) as out:
        out.write(data)
        out.descriptions = descriptions
        out.update_tags(**tags)
    return dst


@pytest.mark.parametrize("change, fragment", [
    (dict(crs="EPSG:32616"), "date 2 is on another CRS than date 1"),
    (dict(shift=45.0), "date 2 is on another grid than date 1"),
    (dict(extra_band=True), "date 2 has 7 bands but date 1"),
])
def test_dates_that_differ_are_refused_naming_the_date(tmp_path, change, fragment):
    odd = rewrite(DATES[1], tmp_path / "odd.tif", **change)
    result = crops(as_list([DATES[0], odd, DATES[2]]), f"output={tmp_path / 'm.tif'}")
    assert_user_error(result, f"{odd}: {fragment}")
    assert not (tmp_path / "m.tif").exists()


def test_the_wrong_number_of_dates_is_refused(tmp_path):
    result = crops(as_list(DATES[:2]), f"output={tmp_path / 'm.tif'}")
    assert_user_error(result, "input: 2 dates given", "the model takes 3")
    one_date = SAMPLES / "flood_sample.tif"  # six bands: not 3 x 6
    result = crops(f"input={one_date}", f"output={tmp_path / 'm.tif'}")
    assert_user_error(result, "has 6 bands, but a stacked file for this model holds 3 dates x 6 bands")
    assert not list(tmp_path.iterdir())


def test_resample_warps_a_shifted_date_onto_date_1s_grid(tmp_path, masks):
    shifted = rewrite(DATES[1], tmp_path / "shifted.tif", shift=30.0)  # one pixel east
    output = tmp_path / "m.tif"
    result = crops(as_list([DATES[0], shifted, DATES[2]]), f"output={output}",
                   "pipeline.stages.raster_read.resample=nearest")
    assert result.returncode == 0, result.stderr
    with rasterio.open(output) as ds, rasterio.open(masks[0]) as ref:
        assert (ds.transform, ds.shape) == (ref.transform, ref.shape)
        mask, reference = ds.read(1), ref.read(1)
    # date 2 now starts one pixel east: date 1's first column has no date 2 there (nodata); elsewhere its
    # fields moved by one pixel, so the map stays nearly the same
    assert (mask[:, 0] == 255).all() and (reference[:, 0] != 255).any()
    assert (mask[:, 2:] == reference[:, 2:]).mean() > 0.9


def tl_crops_checkpoint(directory):
    """The demo crops shape with time and location encodings, seeded random weights."""
    import torch

    from appliance.config.compose import compose
    from appliance.engine.models.prithvi import build_prithvi_segmentation, save_safetensors

    cfg = compose(["pipeline=prithvi_crops", "model.prithvi.coords_encoding=[time,location]"]).model
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.prithvi, in_chans=len(cfg.geo.bands))
    with torch.no_grad():
        model.encoder.temporal_embed_enc.scale.fill_(1.0)
    path = directory / "tl_crops.safetensors"
    save_safetensors(model, path)
    return path


def test_each_dates_acquisition_reaches_the_model_as_its_frame(tmp_path):
    checkpoint = tl_crops_checkpoint(tmp_path)
    tl = ("model.prithvi.coords_encoding=[time,location]", f"model.checkpoint={checkpoint}")
    dated, given, undated = tmp_path / "dated.tif", tmp_path / "given.tif", tmp_path / "undated.tif"
    assert crops(as_list(DATES), f"output={dated}", *tl).returncode == 0
    result = crops(f"input={STACKED}", f"output={given}", "date=[" + ",".join(WHEN) + "]", *tl)
    assert result.returncode == 0, result.stderr
    result = crops(f"input={STACKED}", f"output={undated}", *tl)
    assert result.returncode == 0, result.stderr
    assert "without its time encoding" in result.stderr  # a stacked file has no dates of its own
    with rasterio.open(dated) as a, rasterio.open(given) as b, rasterio.open(undated) as c:
        assert a.tags()["model_time_coords"] == "2023,105;2023,182;2023,258"  # (year, day of year) per date
        assert b.tags()["model_time_coords"] == a.tags()["model_time_coords"]
        assert b.tags()["acquisition_date_source"] == "date given"
        assert np.array_equal(a.read(), b.read())
        assert not np.array_equal(a.read(), c.read())  # the dates reached the model


def test_one_date_pipelines_still_take_a_flat_list_as_several_scenes(tmp_path):
    scene = tmp_path / "a.tif"
    shutil.copy(SAMPLES / "flood_sample.tif", scene)
    other = tmp_path / "b.tif"
    shutil.copy(SAMPLES / "flood_sample.tif", other)
    result = run_cli("run", "pipeline=prithvi_flood", f"input=[{scene},{other}]", f"output={tmp_path / 'out'}",
                     "pipeline.stages.stitch.progress=false", timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("*.mask.tif")) == ["a.mask.tif", "b.mask.tif"]


def test_three_stac_items_give_the_files_map_and_their_dates(masks, tmp_path):
    """Each date as a STAC item of per-band COGs (HLS asset keys, eo:bands common names): the same class map
    as the files, with each item's `datetime` as its date."""
    from tests.geo.hls import split_bands, stac_item

    items, when = [], ["2024-04-09T16:58:49Z", "2024-06-20T16:58:49Z", "2024-09-02T16:58:49Z"]
    for i, (scene, dated) in enumerate(zip(DATES, when)):
        bands = split_bands(scene, tmp_path / f"date{i}", prefix=f"HLS.S30.T15RYP.date{i}.v2.0")
        items.append(stac_item(tmp_path / f"date{i}" / "item.json", [p.name for p in bands], datetime=dated))
    output = tmp_path / "from_stac.tif"
    result = crops(as_list(items), f"output={output}")
    assert result.returncode == 0, result.stderr
    listed, _ = masks
    with rasterio.open(output) as a, rasterio.open(listed) as b:
        assert np.array_equal(a.read(1), b.read(1)) and a.transform == b.transform and a.crs == b.crs
        assert a.tags()["acquisition_dates"] == "2024-04-09,2024-06-20,2024-09-02"
