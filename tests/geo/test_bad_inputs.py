"""Bad inputs, end to end through the stages: a clear InputError, and no output or temp file left."""
import logging
import os
import struct

import numpy as np
import pytest
import rasterio
import rasterio.shutil
from affine import Affine

from appliance.errors import InputError
from tests.geo.conftest import run_geo, synthetic, write_raster


@pytest.fixture
def dirs(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    return src, out


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir())


def zero_size_tiff(path):
    """GDAL refuses to create a 0x0 raster, so write the TIFF header by hand."""
    tags = [(256, 3, 1, 0), (257, 3, 1, 0), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, 1, 0), (277, 3, 1, 1), (278, 3, 1, 1), (279, 4, 1, 0)]
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *t) for t in tags) + struct.pack("<I", 0)
    path.write_bytes(b"II*\x00" + struct.pack("<I", 8) + ifd)
    return path


def make_bad(kind, src):
    """Build the input for `kind`; return (input path(s), extra run_geo kwargs)."""
    scene = src / "scene.tif"
    if kind == "missing":
        return str(src / "nope.tif"), {}
    if kind == "text":
        scene.write_text("this is not a raster\n")
    elif kind == "png":
        from PIL import Image

        png = src / "scene.png"
        Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(png)
        return str(png), {}
    elif kind == "truncated":
        synthetic.write_scene(scene, 300, 400, seed=1)
        data = scene.read_bytes()
        scene.write_bytes(data[: len(data) // 2])
    elif kind == "truncated_tail":  # a COG has its header first, so it opens; blocks are missing
        synthetic.write_scene(src / "gtiff.tif", 300, 400, seed=1)
        rasterio.shutil.copy(src / "gtiff.tif", scene, driver="COG")
        (src / "gtiff.tif").unlink()
        data = scene.read_bytes()
        scene.write_bytes(data[: len(data) * 2 // 3])
    elif kind == "truncated_band_interleaved":  # the last band's blocks are the ones missing
        dn = np.ones((6, 64, 64), np.int16)
        with rasterio.open(scene, "w", driver="GTiff", width=64, height=64, count=6, dtype="int16",
                           interleave="band", blockysize=1, crs="EPSG:32615",
                           transform=Affine(30, 0, 0, 0, -30, 0)) as dst:
            dst.write(dn)
        data = scene.read_bytes()
        scene.write_bytes(data[:-100])
    elif kind == "zero_size":
        zero_size_tiff(scene)
    elif kind == "directory":
        scene.mkdir()
    elif kind == "four_bands":
        write_raster(scene, np.ones((4, 20, 20), np.int16))
    elif kind == "band_names":
        synthetic.write_scene(scene, 40, 40, seed=1)
        return str(scene), {"read": {"bands": ["BLUE", "GREEN", "RED", "NIR", "SWIR_1", "SWIR_2"]}}
    elif kind == "band_index":
        synthetic.write_scene(scene, 40, 40, seed=1)
        return str(scene), {"read": {"bands": [1, 2, 3, 4, 5, 9]}}
    elif kind == "one_bad_of_two":
        good = synthetic.write_scene(src / "good.tif", 40, 40, seed=1)
        write_raster(scene, np.ones((3, 20, 20), np.int16))
        return [str(good), str(scene)], {}
    else:
        raise AssertionError(kind)
    return str(scene), {}


@pytest.mark.parametrize(
    "kind, fragments",
    [
        ("missing", ["nope.tif: no such file"]),
        ("text", ["scene.tif: cannot be read as a GeoTIFF"]),
        ("png", ["scene.png: is a PNG file, not a GeoTIFF"]),
        ("truncated", ["scene.tif: is truncated or corrupt"]),
        ("truncated_tail", ["scene.tif: is truncated or corrupt (block"]),
        ("truncated_band_interleaved", ["scene.tif: is truncated or corrupt (block 63,0 of band 6"]),
        ("zero_size", ["scene.tif:"]),
        ("directory", ["scene.tif: is not a file"]),
        ("four_bands", ["has 4 bands but the model expects 6", "pipeline.stages.raster_read.bands="]),
        ("band_names", ["has no band named NIR", "available: 1:BLUE, 2:GREEN, 3:RED, 4:NIR_NARROW"]),
        ("band_index", ["has no band 9: band indexes are 1..6"]),
        ("one_bad_of_two", ["scene.tif: has 3 bands"]),  # checked before the good one is processed
    ],
)
def test_bad_input_files(dirs, kind, fragments):
    src, out = dirs
    inputs, kwargs = make_bad(kind, src)
    before = leftovers(src)
    with pytest.raises(InputError) as info:
        run_geo(inputs, out, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert leftovers(out) == [] and leftovers(src) == before


def test_output_equal_to_input(dirs):
    src, _ = dirs
    scene = synthetic.write_scene(src / "s.tif", 30, 30, seed=1)
    with pytest.raises(InputError, match="output: .*s.tif is an input scene"):
        run_geo(str(scene), scene, overwrite=True)
    assert leftovers(src) == ["s.tif"]


def test_output_exists_needs_overwrite(dirs):
    src, out = dirs
    scene = synthetic.write_scene(src / "s.tif", 30, 30, seed=1)
    (out / "m.tif").write_bytes(b"old")
    with pytest.raises(InputError, match="m.tif exists; pass overwrite=true"):
        run_geo(str(scene), out / "m.tif")
    assert (out / "m.tif").read_bytes() == b"old" and leftovers(out) == ["m.tif"]
    run_geo(str(scene), out / "m.tif", overwrite=True)
    assert rasterio.open(out / "m.tif").width == 30 and leftovers(out) == ["m.stac.json", "m.tif"]


def test_output_directory_below_a_file(dirs):
    src, out = dirs
    scene = synthetic.write_scene(src / "s.tif", 30, 30, seed=1)
    (out / "file").write_text("x")
    with pytest.raises(InputError, match="output: cannot write to directory .*file"):
        run_geo(str(scene), out / "file" / "m.tif")
    assert leftovers(out) == ["file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only directories")
def test_read_only_output_directory(dirs):
    src, out = dirs
    scene = synthetic.write_scene(src / "s.tif", 30, 30, seed=1)
    out.chmod(0o555)
    try:
        with pytest.raises(InputError, match="cannot write to directory"):
            run_geo(str(scene), out / "m.tif")
    finally:
        out.chmod(0o755)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_unwritable_output_directory_even_as_root(dirs):
    src, _ = dirs
    scene = synthetic.write_scene(src / "s.tif", 30, 30, seed=1)
    with pytest.raises(InputError, match="output: cannot write to directory /proc"):
        run_geo(str(scene), "/proc/m.tif")


def test_failure_mid_run_leaves_no_file(dirs):
    src, out = dirs
    scene = synthetic.write_scene(src / "s.tif", 300, 300, seed=1)
    with pytest.raises(RuntimeError, match="on purpose"):
        run_geo(str(scene), out / "m.tif", tile_size=64, overlap=16, fake={"fail_after": 20})
    assert leftovers(out) == []


def test_abandoned_run_leaves_no_file(dirs):
    """A consumer that stops early (client gone) closes the generators: the temp file goes too."""
    from appliance.stages.build import build_pipeline
    from tests.geo.conftest import make_cfg

    src, out = dirs
    a = synthetic.write_scene(src / "a.tif", 64, 64, seed=1)
    b = synthetic.write_scene(src / "b.tif", 300, 300, seed=1)
    pipeline = build_pipeline(make_cfg(tile_size=32, overlap=0))
    stream = pipeline.run([{"input": [str(a), str(b)], "output": str(out), "overwrite": False}])
    next(stream)  # a is done; b is half-written when we walk away
    stream.close()
    assert leftovers(out) == ["a.mask.stac.json", "a.mask.tif"]


@pytest.mark.parametrize("height, width", [(1, 1), (1, 300), (300, 1), (2, 3)])
def test_tiny_rasters_work(dirs, height, width):
    src, out = dirs
    dn = np.full((6, height, width), 300, np.int16)
    scene = write_raster(src / "s.tif", dn, descriptions=synthetic.BANDS)
    records = run_geo(str(scene), out / "m.tif", tile_size=64, overlap=16)
    mask, = rasterio.open(out / "m.tif").read()
    assert mask.shape == (height, width) and set(np.unique(mask)) <= {0, 1}
    assert f"{width}x{height}" in records[0]["display"]


def test_no_crs_works_with_a_warning(dirs, caplog):
    src, out = dirs
    dn, _ = synthetic.make_scene(50, 60, seed=1)
    scene = write_raster(src / "s.tif", dn, crs=None, nodata=synthetic.NODATA_DN, descriptions=synthetic.BANDS)
    with caplog.at_level(logging.WARNING):
        run_geo(str(scene), out / "m.tif")
    assert any("has no CRS" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    with rasterio.open(out / "m.tif") as ds:
        assert ds.crs is None and (ds.width, ds.height) == (60, 50)


def test_all_nodata_scene_gives_an_all_nodata_mask(dirs):
    src, out = dirs
    dn = np.full((6, 40, 50), synthetic.NODATA_DN, np.int16)
    scene = write_raster(src / "s.tif", dn, nodata=synthetic.NODATA_DN, descriptions=synthetic.BANDS)
    records = run_geo(str(scene), out / "m.tif")
    assert (rasterio.open(out / "m.tif").read(1) == 255).all()
    assert records[0]["display"].endswith("water n/a, nodata 100.0%")


def test_nan_pixels_are_nodata(dirs):
    src, out = dirs
    dn = np.full((6, 20, 20), 0.03, np.float32)
    dn[2, 5, 7] = np.nan
    scene = write_raster(src / "s.tif", dn, descriptions=synthetic.BANDS)
    run_geo(str(scene), out / "m.tif", read={"scale": 1.0})
    mask = rasterio.open(out / "m.tif").read(1)
    assert mask[5, 7] == 255 and (mask != 255).sum() == 399


def test_internal_mask_band_is_nodata(dirs):
    src, out = dirs
    dn = np.full((6, 32, 32), 300, np.int16)
    scene = write_raster(src / "s.tif", dn, descriptions=synthetic.BANDS)
    with rasterio.open(scene, "r+") as ds:
        mask = np.full((32, 32), 255, np.uint8)
        mask[:4] = 0
        ds.write_mask(mask)
    run_geo(str(scene), out / "m.tif")
    result = rasterio.open(out / "m.tif").read(1)
    assert (result[:4] == 255).all() and (result[4:] != 255).all()
