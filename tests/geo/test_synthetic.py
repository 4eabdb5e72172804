"""The synthetic scene generator and the packaged sample."""
import numpy as np
import rasterio

from tests.geo.conftest import REPO, synthetic

SAMPLE = REPO / "appliance" / "assets" / "samples" / "flood_sample.tif"
BURN_SAMPLE = REPO / "appliance" / "assets" / "samples" / "burn_scars_sample.tif"
# sha256 over make_scene's arrays for a few seeds and sizes, taken before the burn scars target was added:
# the flood scenes (and so the flood demo model's training data) must stay the same.
FLOOD_SCENES_SHA256 = "663e40ae33576101d26355add61a93a5e75f6fe0551b54776dd8157eddeddfaf"


def test_deterministic_from_seed_and_size():
    a, la = synthetic.make_scene(60, 80, seed=7)
    b, lb = synthetic.make_scene(60, 80, seed=7)
    c, _ = synthetic.make_scene(60, 80, seed=8)
    assert (a == b).all() and (la == lb).all() and not (a == c).all()
    assert a.shape == (6, 60, 80) and a.dtype == np.int16 and la.dtype == np.uint8


def test_surfaces_have_their_signatures():
    dn, labels = synthetic.make_scene(300, 400, seed=2)
    assert set(np.unique(labels)) == {0, 1, 255}
    nodata = (dn == synthetic.NODATA_DN).all(axis=0)
    assert nodata.any() and (labels[nodata] == 255).all()
    assert not ((dn == synthetic.NODATA_DN).any(axis=0) & ~nodata).any()
    water = dn[:, labels == 1].mean(axis=1)
    land = dn[:, labels == 0].mean(axis=1)
    blue, green, red, nir, swir1, swir2 = range(6)
    assert water[blue] > water[nir] and water[green] > water[nir] and water[swir1] < water[nir]
    assert land[nir] > 2 * water[nir] and land[swir1] > 5 * water[swir1]
    assert 0.03 < (labels == 1).mean() < 0.4
    clouds = (labels == 255) & ~nodata
    assert clouds.any() and dn[:, clouds].mean(axis=1)[blue] > 3000  # bright in the visible


def test_options_switch_clouds_and_nodata_off():
    dn, labels = synthetic.make_scene(50, 50, seed=1, clouds=False, nodata=False)
    assert set(np.unique(labels)) <= {0, 1} and (dn != synthetic.NODATA_DN).all()


def test_tiny_scene():
    dn, labels = synthetic.make_scene(1, 1, seed=0)
    assert dn.shape == (6, 1, 1) and labels.shape == (1, 1)


def test_written_scene_is_a_georeferenced_hls_like_geotiff(tmp_path):
    path = synthetic.write_scene(tmp_path / "s.tif", 40, 50, seed=1, labels_path=tmp_path / "l.tif")
    with rasterio.open(path) as ds:
        assert ds.descriptions == synthetic.BANDS and ds.dtypes[0] == "int16"
        assert ds.nodata == synthetic.NODATA_DN and ds.crs is not None
        assert (ds.read() == synthetic.make_scene(40, 50, seed=1)[0]).all()
    with rasterio.open(tmp_path / "l.tif") as ds:
        assert ds.nodata == 255 and ds.transform == rasterio.open(path).transform


def test_packaged_sample_is_small_and_reproducible():
    assert SAMPLE.exists() and SAMPLE.stat().st_size < 1_000_000
    with rasterio.open(SAMPLE) as ds:
        assert (ds.height, ds.width) == (300, 400)
        assert (ds.read() == synthetic.make_scene(300, 400, seed=0)[0]).all()


def test_flood_scenes_are_unchanged_by_the_burn_scars_target():
    import hashlib

    digest = hashlib.sha256()
    for seed, height, width in [(0, 300, 400), (1001, 128, 128), (10000, 97, 511), (5, 512, 512), (3, 16, 20)]:
        for options in ({}, {"clouds": False}, {"nodata": False}):
            dn, labels = synthetic.make_scene(height, width, seed, **options)
            digest.update(dn.tobytes())
            digest.update(labels.tobytes())
    assert digest.hexdigest() == FLOOD_SCENES_SHA256


def normalised_burn_ratio(dn, where):
    nir, swir2 = dn[3][where].astype(float), dn[5][where].astype(float)
    return ((nir - swir2) / (nir + swir2)).mean()


def test_burn_scar_scenes_mark_low_burn_ratio_patches_in_vegetation():
    dn, labels = synthetic.make_scene(300, 400, seed=2, target="burn_scar")
    again, _ = synthetic.make_scene(300, 400, seed=2, target="burn_scar")
    flood, _ = synthetic.make_scene(300, 400, seed=2)
    assert (dn == again).all() and not (dn == flood).all()
    assert set(np.unique(labels)) == {synthetic.UNBURNED, synthetic.BURN_SCAR, 255}
    nodata = (dn == synthetic.NODATA_DN).all(axis=0)
    assert nodata.any() and (labels[nodata] == 255).all()
    scar, unburned = labels == synthetic.BURN_SCAR, labels == synthetic.UNBURNED
    assert 0.03 < scar.mean() < 0.3
    blue, green, red, nir, swir1, swir2 = range(6)
    burnt, rest = dn[:, scar].mean(axis=1), dn[:, unburned].mean(axis=1)
    assert burnt[nir] < 0.7 * rest[nir] and burnt[swir2] > rest[swir2]  # dark NIR, bright SWIR
    assert normalised_burn_ratio(dn, scar) < 0.3 < normalised_burn_ratio(dn, unburned)


def test_unknown_target_is_refused():
    import pytest

    with pytest.raises(ValueError, match="target"):
        synthetic.make_scene(10, 10, target="snow")


def test_packaged_burn_scars_sample_is_small_and_reproducible():
    assert BURN_SAMPLE.exists() and BURN_SAMPLE.stat().st_size < 1_000_000
    with rasterio.open(BURN_SAMPLE) as ds, rasterio.open(BURN_SAMPLE.with_name("burn_scars_sample_labels.tif")) as lab:
        dn, labels = synthetic.make_scene(300, 400, seed=0, target="burn_scar")
        assert (ds.height, ds.width) == (300, 400) and ds.descriptions == synthetic.BANDS
        assert (ds.read() == dn).all() and (lab.read(1) == labels).all()
