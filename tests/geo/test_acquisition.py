"""A scene's date and centre (stages/geo/acquisition.py): each date source, the centre from the georeference,
what a TL model is given (and what it runs without), and where the mask and its STAC item record them."""
import datetime as dt
import json
import logging

import numpy as np
import pytest
import rasterio
from affine import Affine
from omegaconf import OmegaConf

from appliance.config.schema import PrithviConfig, ServerLimits
from appliance.errors import InputError
from appliance.stages.geo.acquisition import model_coords, name_date, parse_date, parse_when, scene_centre
from appliance.stages.geo.scene import inspect_scene
from appliance.stages.geo.scene_sources import scene_spec
from appliance.stages.geo.stac_in import load_item as load_item_within
from tests.geo.conftest import GEO, NODATA_FILL, make_cfg, synthetic, write_raster
from tests.geo.hls import STAC_BANDS, split_bands, stac_item

UTC = dt.timezone.utc
TL = ("time", "location")


@pytest.mark.parametrize("text, expected", [
    ("2024-06-30", dt.datetime(2024, 6, 30, tzinfo=UTC)),
    ("2024-06-30T16:58:49Z", dt.datetime(2024, 6, 30, 16, 58, 49, tzinfo=UTC)),
    ("2024-06-30T23:30:00-02:00", dt.datetime(2024, 7, 1, 1, 30, tzinfo=UTC)),  # the UTC day counts
    ("2024:06:30 10:00:00", dt.datetime(2024, 6, 30, 10, tzinfo=UTC)),  # TIFFTAG_DATETIME
    ("2021-01-01T16:04:16.8964190Z; 2021-01-01T16:04:40.7610470Z", dt.datetime(2021, 1, 1, 16, 4, 16, tzinfo=UTC)),
    ("2024-02-30", None), ("30/06/2024", None), ("", None), (20240630, None),
])
def test_timestamps_as_sources_write_them(text, expected):
    assert parse_when(text) == expected


@pytest.mark.parametrize("name, expected", [
    ("HLS.S30.T15RYP.2024100T165849.v2.0.B02.tif", dt.date(2024, 4, 9)),  # year and day of year
    ("S2A_20240409T165849_scene.tif", dt.date(2024, 4, 9)),
    ("scene.tif", None), ("a_12345678901234T123456.tif", None),
])
def test_dates_in_file_names(name, expected):
    when = name_date(name)
    assert (when.date() if when else None) == expected


@pytest.mark.parametrize("value", ["2024-13-01", "yesterday", 20240630, "2024-06"])
def test_a_bad_explicit_date_names_the_field(value):
    with pytest.raises(InputError) as info:
        parse_date(value, "data.date")
    assert info.value.param == "data.date" and str(info.value).startswith("data.date: ")
    assert "YYYY-MM-DD" in str(info.value)


def _scene(path, crs="EPSG:32615", tags=None):
    synthetic.write_scene(path, 64, 96, seed=1)
    if crs is None:
        with rasterio.open(path) as ds:
            data, nodata = ds.read(), ds.nodata
        write_raster(path, data, crs=None, nodata=nodata, descriptions=GEO["bands"])
    if tags:
        with rasterio.open(path, "r+") as ds:
            ds.update_tags(**tags)
    return path


def _inspect(source, date=None):
    return inspect_scene(source, 0, GEO["bands"], model_scale=GEO["scale"], date=date, nodata_fill=NODATA_FILL)


def load_item(href):
    return load_item_within(href, timeout_s=ServerLimits().fetch_timeout_s)


def test_date_sources_in_order(tmp_path):
    plain = _scene(tmp_path / "plain.tif")
    tiff = _scene(tmp_path / "tiff.tif", tags={"TIFFTAG_DATETIME": "2023:08:01 10:20:30"})
    hls = _scene(tmp_path / "hls.tif", tags={"SENSING_TIME": "2022-05-03T16:35:37.263213Z",
                                             "TIFFTAG_DATETIME": "2023:08:01 10:20:30"})
    bands = split_bands(plain, tmp_path / "bands")  # HLS names: ...2024100T165849...
    item = stac_item(tmp_path / "item.json", [f"bands/{p.name}" for p in bands], datetime="2021-02-01T10:00:00Z")
    item_spec = scene_spec(str(item), STAC_BANDS, GEO["bands"], load_item)
    given = dt.datetime(2024, 6, 30, tzinfo=UTC)
    cases = [
        (_inspect(str(plain)), None, None),
        (_inspect(str(tiff)), "2023-08-01", "TIFFTAG_DATETIME tag"),
        (_inspect(str(hls)), "2022-05-03", "SENSING_TIME tag"),
        (_inspect(scene_spec([str(p) for p in bands], None, GEO["bands"], load_item)), "2024-04-09", "file name"),
        (_inspect(item_spec), "2021-02-01", "STAC datetime"),
        (_inspect(item_spec, date=given), "2024-06-30", "date given"),
        (_inspect(str(tiff), date=given), "2024-06-30", "date given"),
    ]
    for scene, date, source in cases:
        got = (scene.acquired.date, scene.acquired.source) if scene.acquired else (None, None)
        assert got == (date, source), scene.path
        assert (scene.datetime or "")[:10] == (date or "")


def test_the_centre_is_the_scene_centre_in_lat_lon(tmp_path):
    path = _scene(tmp_path / "s.tif")
    scene = _inspect(str(path))
    with rasterio.open(path) as ds:
        lon, lat = ds.lnglat()  # rasterio's centre, (lon, lat)
    assert scene.centre == pytest.approx((lat, lon), abs=1e-9)  # the encoder takes (lat, lon)
    assert _inspect(str(_scene(tmp_path / "n.tif", crs=None))).centre is None
    # A geographic grid centred on (-15.3, 27.9): the centre comes back as it is.
    grid = Affine(0.01, 0, 27.9 - 0.48, 0, -0.01, -15.3 + 0.32)
    assert scene_centre(rasterio.crs.CRS.from_epsg(4326), grid, 96, 64) == pytest.approx((-15.3, 27.9), abs=1e-9)


def test_what_a_tl_model_is_given(caplog):
    acquired = parse_date("2024-06-30", "date")
    from appliance.stages.geo.acquisition import Acquired

    coords = model_coords(TL, Acquired(acquired, "date given"), (29.5, -92.9), "s.tif")
    assert coords.temporal.tolist() == [[2024.0, 182.0]] and coords.temporal.dtype.is_floating_point
    assert coords.location.tolist() == pytest.approx([29.5, -92.9])
    assert model_coords((), Acquired(acquired, "date given"), (29.5, -92.9), "s.tif") is None  # not a TL model
    only_place = model_coords(("location",), Acquired(acquired, "date given"), (29.5, -92.9), "s.tif")
    assert only_place.temporal is None and only_place.location is not None
    with caplog.at_level(logging.WARNING):
        bare = model_coords(TL, None, None, "s.tif")
    assert bare.temporal is None and bare.location is None
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["s.tif", "s.tif"]
    assert "without its time encoding" in caplog.records[0].getMessage()
    assert "without its location encoding" in caplog.records[1].getMessage()


def _tl_cfg(**kwargs):
    cfg = make_cfg(tile_size=64, overlap=16, **kwargs)
    cfg.model.prithvi = OmegaConf.merge(OmegaConf.structured(PrithviConfig), {"coords_encoding": list(TL)})
    cfg.pipeline.inputs = ["input", "output", "overwrite", "date"]
    return cfg


def _run(source, output, cfg, date=None):
    from appliance.stages.build import build_pipeline

    pipeline = build_pipeline(cfg)
    pipeline.check()
    pipeline.setup()
    try:
        return list(pipeline.run([{"input": str(source), "output": str(output), "overwrite": True, "date": date}]))
    finally:
        pipeline.close()


def test_tiles_of_a_tl_model_carry_their_scene_coords(tmp_path):
    """Every tile record of a TL model's scene carries the scene's coordinates; other models' carry none."""
    from appliance.stages.build import build_pipeline

    scene = _scene(tmp_path / "s.tif")
    for cfg, expected in ((_tl_cfg(), [[2024.0, 182.0]]), (make_cfg(tile_size=64, overlap=16), None)):
        cfg.pipeline.inputs = ["input", "output", "overwrite", "date"]
        cfg.pipeline.stages = {k: v for k, v in cfg.pipeline.stages.items() if k in ("raster_inputs", "raster_read",
                                                                                      "tile", "normalize")}
        pipeline = build_pipeline(cfg)
        pipeline.setup()
        try:
            record = {"input": str(scene), "output": str(tmp_path / "m.tif"), "date": "2024-06-30"}
            records = list(pipeline.run([record]))
        finally:
            pipeline.close()
        assert len(records) == 2  # 64 rows x 96 columns in 64-pixel tiles
        if expected is None:
            assert all("coords" not in r for r in records)
        else:
            assert all(r["coords"] is records[0]["coords"] for r in records)
            assert records[0]["coords"].temporal.tolist() == expected


def test_the_mask_and_its_item_record_the_coordinates(tmp_path, caplog):
    tiff = _scene(tmp_path / "tiff.tif", tags={"TIFFTAG_DATETIME": "2023:08:01 10:20:30"})
    bare = _scene(tmp_path / "bare.tif", crs=None)
    _run(tiff, tmp_path / "a.tif", _tl_cfg())
    _run(tiff, tmp_path / "b.tif", _tl_cfg(), date="2024-06-30")
    with caplog.at_level(logging.WARNING):
        _run(bare, tmp_path / "c.tif", _tl_cfg())
    with rasterio.open(tmp_path / "a.tif") as a, rasterio.open(tmp_path / "b.tif") as b:
        a_tags, b_tags = a.tags(), b.tags()
        lon, lat = rasterio.open(tiff).lnglat()
    assert a_tags["acquisition_date"] == "2023-08-01" and a_tags["acquisition_date_source"] == "TIFFTAG_DATETIME tag"
    assert a_tags["model_time_coords"] == "2023,213"
    assert a_tags["model_location_coords"] == f"{lat:.6f},{lon:.6f}"
    assert b_tags["acquisition_date"] == "2024-06-30" and b_tags["model_time_coords"] == "2024,182"
    item = json.loads((tmp_path / "b.stac.json").read_text())["properties"]
    assert item["datetime"] == "2024-06-30T00:00:00Z"
    assert item["appliance:model_coords"] == {"time": [[2024, 182]], "location": [round(lat, 6), round(lon, 6)]}
    with rasterio.open(tmp_path / "c.tif") as c:
        c_tags = c.tags()
    assert "acquisition_date" not in c_tags
    assert c_tags["model_time_coords"] == "none (no acquisition date)"
    assert c_tags["model_location_coords"] == "none (no CRS)"
    said = [r.getMessage() for r in caplog.records if r.name.endswith("acquisition")]
    assert len(said) == 2, said  # once per missing encoding for the scene, not once per tile
    assert json.loads((tmp_path / "c.stac.json").read_text())["properties"]["appliance:model_coords"] == {
        "time": None, "location": None}


def test_a_model_without_encodings_is_given_nothing_and_its_mask_unchanged(tmp_path):
    scene = _scene(tmp_path / "s.tif")
    cfg = make_cfg(tile_size=64, overlap=16)
    cfg.pipeline.inputs = ["input", "output", "overwrite", "date"]
    _run(scene, tmp_path / "a.tif", cfg)
    _run(scene, tmp_path / "b.tif", cfg, date="2024-06-30")
    with rasterio.open(tmp_path / "a.tif") as a, rasterio.open(tmp_path / "b.tif") as b:
        assert np.array_equal(a.read(), b.read())
        assert not any(k.startswith("model_") for k in {**a.tags(), **b.tags()})
        assert b.tags()["acquisition_date"] == "2024-06-30"  # the run knows it: the mask says so
    assert "appliance:model_coords" not in json.loads((tmp_path / "b.stac.json").read_text())["properties"]


def test_a_bad_date_fails_before_any_output(tmp_path):
    scene = _scene(tmp_path / "s.tif")
    with pytest.raises(InputError) as info:
        _run(scene, tmp_path / "a.tif", _tl_cfg(), date="2024-02-30")
    assert info.value.param == "date"
    assert not list(tmp_path.glob("a*"))
