import importlib.util
import warnings
from pathlib import Path

import pytest
import rasterio
from affine import Affine
from omegaconf import OmegaConf
from rasterio.errors import NotGeoreferencedWarning

import appliance.stages.geo  # noqa: F401  (registers the geo stages)
from appliance.config.schema import AppConfig
from appliance.stages.build import build_pipeline
from appliance.stages.geo.raster_read import RasterReadOptions
from tests.geo import fake_engine  # noqa: F401  (registers fake_water_logits)

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("synthetic_scenes", REPO / "scripts" / "synthetic_scenes.py")
synthetic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic)

# The Prithvi flood model's contract (NOTES.md), band names as written by synthetic_scenes.
NODATA_FILL = RasterReadOptions().nodata_fill  # what inspect_scene gets from the raster_read stage
GEO = {
    "bands": list(synthetic.BANDS),
    "means": [0.1412956, 0.13795798, 0.12353792, 0.30902815, 0.2044958, 0.11912015],
    "stds": [0.07406382, 0.07370365, 0.08692279, 0.11798815, 0.09772074, 0.07659938],
    "scale": 0.0001,
    "class_names": ["land", "water"],
    "stac_bands": ["blue", "green", "red", "nir08", "swir16", "swir22"],
}


def stages(tile_size=128, overlap=32, fake=None, stitch=None, write=None, read=None):
    return {
        "raster_inputs": {},
        "raster_read": {**(read or {})},
        "tile": {"tile_size": tile_size, "overlap": overlap},
        "normalize": {},
        "fake_water_logits": {**(fake or {})},
        "stitch": {**(stitch or {})},
        "raster_write": {**(write or {})},
    }


def make_cfg(nodes=None, **kwargs):
    cfg = OmegaConf.merge(OmegaConf.structured(AppConfig), {
        "model": {"name": "fake-flood", "architecture": "Fake", "geo": GEO},
        "engine": {"kind": "pool", "max_batch_size": 4},
        "pipeline": {"name": "geo-test", "inputs": ["input", "output", "overwrite"],
                     "stages": nodes or stages(**kwargs)},
    })
    return cfg


def run_geo(input, output=None, overwrite=False, cfg=None, **kwargs):
    """Build the geo pipeline and feed it the run record `appliance run` would; the final records."""
    pipeline = build_pipeline(cfg if cfg is not None else make_cfg(**kwargs))
    pipeline.check()
    pipeline.setup()
    try:
        record = {"input": input, "output": None if output is None else str(output), "overwrite": overwrite}
        return list(pipeline.run([record]))
    finally:
        pipeline.close()


@pytest.fixture
def scene(tmp_path):
    """A 300x400 synthetic scene with its labels: (scene path, labels path)."""
    path, labels = tmp_path / "scene.tif", tmp_path / "labels.tif"
    synthetic.write_scene(path, 300, 400, seed=3, labels_path=labels)
    return path, labels


def write_raster(path, data, crs="EPSG:32615", nodata=None, descriptions=None):
    """A GeoTIFF of `data` [bands, h, w]: georeferenced unless crs=None, band names when given."""
    count, height, width = data.shape
    kwargs = dict(crs=crs, transform=Affine(30, 0, 0, 0, -30, 0)) if crs else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(path, "w", driver="GTiff", height=height, width=width, count=count,
                           dtype=data.dtype, nodata=nodata, **kwargs) as dst:
            dst.write(data)
            for band, name in enumerate(descriptions or [], 1):
                dst.set_band_description(band, name)
    return path


@pytest.fixture(scope="session")
def stac_catalog(tmp_path_factory):
    """A real STAC API (tests/stac_api.py) holding the synthetic HLS items of tests/geo/stac_catalog.py, whose
    band COGs a range-request server serves: started once per session. (api_url, items, cog_root, cog_url)."""
    from tests.geo.hls import RangeServer
    from tests.geo.stac_catalog import collection, write_catalog
    from tests.stac_api import StacApi, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(f"no STAC API: {reason}")
    root = tmp_path_factory.mktemp("stac-cogs")
    with RangeServer(root) as cogs:
        items = write_catalog(root, cogs.url)
        with StacApi() as api:
            api.load(collection(items), items)
            yield CatalogUnderTest(api.url, items, root, cogs.url)


class CatalogUnderTest:
    def __init__(self, api_url, items, root, cog_url):
        self.api_url, self.items, self.root, self.cog_url = api_url, items, root, cog_url
