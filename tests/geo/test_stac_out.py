"""The STAC item written beside each mask, checked offline (pystac's validate fetches JSON schemas over
the network, which tests do not have): structure, projection and classification extensions, links."""
import json
import os

import numpy as np
import pystac
import rasterio
from pystac.extensions.classification import ClassificationExtension
from pystac.extensions.projection import ProjectionExtension

from tests.geo.conftest import run_geo, write_raster


def load(path):
    data = json.loads(path.read_text())
    return data, pystac.Item.from_dict(data)


def test_item_describes_the_mask(scene, tmp_path):
    path, _ = scene
    out = tmp_path / "out" / "m.tif"
    run_geo(str(path), out, write={"quicklook": True})
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.quicklook.png", "m.stac.json", "m.tif"]
    data, item = load(out.parent / "m.stac.json")
    assert data["type"] == "Feature" and data["stac_version"] == pystac.get_stac_version()
    assert item.id == "m" and item.properties["appliance:model"] == "fake-flood"
    assert item.properties["appliance:pipeline"] == "geo-test"
    assert item.assets["mask"].href == "m.tif" and item.assets["quicklook"].href == "m.quicklook.png"
    assert item.assets["mask"].media_type == pystac.MediaType.COG
    with rasterio.open(out) as ds:
        projection = ProjectionExtension.ext(item)
        assert projection.epsg == ds.crs.to_epsg() == 32615
        assert projection.shape == [ds.height, ds.width]
        assert projection.transform == list(ds.transform)[:6]
        assert projection.bbox == list(ds.bounds)
    west, south, east, north = item.bbox
    assert -180 <= west < east <= 180 and -90 <= south < north <= 90
    assert data["geometry"]["type"] == "Polygon"
    classes = ClassificationExtension.ext(item.assets["mask"]).classes
    assert [(c.value, c.name, c.nodata) for c in classes] == [(0, "land", None), (1, "water", None),
                                                              (255, "nodata", True)]
    assert classes[1].color_hint == "005AFF"
    links = [link for link in item.links if link.rel == "derived_from"]
    assert [link.href for link in links] == [os.path.relpath(path, out.parent)]
    assert set(data["stac_extensions"]) == {ProjectionExtension.get_schema_uri(),
                                            ClassificationExtension.get_schema_uri()}


def test_derived_from_resolves_from_the_item_wherever_the_run_started(scene, tmp_path, monkeypatch):
    """A relative input and an output elsewhere: the link is relative to the item's directory, so pystac
    (and any STAC client) finds the source from the item, not from the run's working directory."""
    path, _ = scene  # tmp_path/scene.tif
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    run_geo("../scene.tif", tmp_path / "out" / "deep" / "m.tif")
    monkeypatch.chdir("/")
    item = pystac.Item.from_file(str(tmp_path / "out" / "deep" / "m.stac.json"))
    (link,) = item.get_links(pystac.RelType.DERIVED_FROM)
    assert link.href == "../../scene.tif"
    assert link.get_absolute_href() == str(path)
    assert os.path.isfile(link.get_absolute_href())


def test_datetime_comes_from_the_source(tmp_path):
    data = np.full((6, 40, 40), 1000, dtype=np.int16)
    src = write_raster(tmp_path / "s.tif", data)
    with rasterio.open(src, "r+") as ds:
        ds.update_tags(TIFFTAG_DATETIME="2024:04:09 16:58:49")
    run_geo(str(src), tmp_path / "m.tif")
    _, item = load(tmp_path / "m.stac.json")
    assert item.datetime.isoformat() == "2024-04-09T16:58:49+00:00"


def test_probabilities_item_has_no_classes(scene, tmp_path):
    path, _ = scene
    run_geo(str(path), tmp_path / "p.tif", stitch={"output": "probabilities"})
    data, item = load(tmp_path / "p.stac.json")
    assert not ClassificationExtension.has_extension(item)
    assert "classification:classes" not in data["assets"]["mask"]


def test_stac_opt_out(scene, tmp_path):
    path, _ = scene
    run_geo(str(path), tmp_path / "out" / "m.tif", write={"stac": False})
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["m.tif"]


def test_item_without_crs_has_no_footprint(tmp_path):
    src = write_raster(tmp_path / "s.tif", np.full((6, 40, 40), 1000, dtype=np.int16), crs=None)
    run_geo(str(src), tmp_path / "m.tif")
    data, item = load(tmp_path / "m.stac.json")
    assert data["geometry"] is None and "bbox" not in data
    assert ProjectionExtension.ext(item).epsg is None
