"""The whole geo chain with the fake-logits engine: files in, masks out."""
import io
import re
import sys

import numpy as np
import pytest
import rasterio
from affine import Affine

from appliance.stages.build import build_pipeline
from tests.geo.conftest import make_cfg, run_geo, stages, synthetic


def read(path, band=None):
    with rasterio.open(path) as ds:
        return ds.read(band) if band else ds.read(), ds.profile


def water_iou(mask, labels):
    known = (labels != 255) & (mask != 255)
    inter = ((mask == 1) & (labels == 1) & known).sum()
    union = (((mask == 1) | (labels == 1)) & known).sum()
    return inter / union


def test_mask_matches_labels_and_input_grid(scene, tmp_path):
    path, labels_path = scene
    out = tmp_path / "out" / "mask.tif"
    records = run_geo(str(path), out)
    assert len(records) == 1
    display = records[0]["display"]
    assert re.fullmatch(rf"wrote {re.escape(str(out))}: 400x300, 12 tiles, water \d+\.\d%, nodata \d+\.\d%",
                        display), display
    mask, profile = read(out, 1)
    labels, _ = read(labels_path, 1)
    _, source = read(path)
    assert (profile["width"], profile["height"], profile["crs"], profile["transform"]) == (
        source["width"], source["height"], source["crs"], source["transform"])
    assert profile["dtype"] == "uint8" and profile["nodata"] == 255 and profile["count"] == 1
    assert profile["tiled"] and profile["compress"] == "deflate"
    assert set(np.unique(mask)) <= {0, 1, 255}
    dn, _ = read(path)
    input_nodata = (dn == synthetic.NODATA_DN).any(axis=0)
    assert (mask[input_nodata] == 255).all() and (mask[~input_nodata] != 255).all()
    assert water_iou(mask, labels) > 0.9
    water_share = float(display.split("water ")[1].split("%")[0])
    assert water_share == pytest.approx(100 * (mask == 1).sum() / (mask != 255).sum(), abs=0.05)
    assert sorted(p.name for p in out.parent.iterdir()) == ["mask.stac.json", "mask.tif"]  # no temp files left


@pytest.mark.parametrize("tile_size, overlap", [(64, 0), (100, 37), (128, 32), (256, 200), (333, 1)])
def test_any_tiling_gives_the_untiled_answer_for_a_pointwise_model(scene, tmp_path, tile_size, overlap):
    """The fake model is pointwise, so tiling must not change a single pixel."""
    path, _ = scene
    run_geo(str(path), tmp_path / "whole.tif", tile_size=512, overlap=0)  # one padded tile
    run_geo(str(path), tmp_path / "tiled.tif", tile_size=tile_size, overlap=overlap)
    whole, _ = read(tmp_path / "whole.tif", 1)
    tiled, _ = read(tmp_path / "tiled.tif", 1)
    assert (whole == tiled).mean() > 0.9999  # argmax ties at ~0 logits may flip a pixel


def smooth_scene(path, height, width, crs="EPSG:32615"):
    """Bands are smooth ramps: the fake `smooth` logits are then smooth across the scene."""
    yy, xx = np.mgrid[0:height, 0:width]
    bands = [1000 + 2 * xx + yy * (b + 1) for b in range(6)]
    with rasterio.open(path, "w", driver="GTiff", height=height, width=width, count=6, dtype="int16",
                       crs=crs, transform=Affine(10, 0, 0, 0, -10, 0)) as dst:
        dst.write(np.stack(bands).astype(np.int16))
    return path


def test_stitched_probabilities_equal_the_untiled_result(tmp_path):
    path = smooth_scene(tmp_path / "smooth.tif", 200, 260)
    kwargs = dict(fake={"mode": "smooth"}, stitch={"output": "probabilities"})
    run_geo(str(path), tmp_path / "whole.tif", tile_size=512, overlap=0, **kwargs)
    run_geo(str(path), tmp_path / "tiled.tif", tile_size=64, overlap=24, **kwargs)
    whole, profile = read(tmp_path / "whole.tif")
    tiled, _ = read(tmp_path / "tiled.tif")
    assert profile["dtype"] == "float32" and profile["count"] == 2
    np.testing.assert_allclose(tiled, whole, atol=1e-5)
    np.testing.assert_allclose(tiled.sum(axis=0), 1.0, atol=1e-5)


def test_context_dependent_model_leaves_no_seam(tmp_path):
    """Per-tile bias (a stand-in for context effects): the blend ramps it, no jump at tile borders."""
    path = smooth_scene(tmp_path / "smooth.tif", 192, 192)
    kwargs = dict(fake={"mode": "smooth", "tile_bias": 0.5}, stitch={"output": "probabilities"})
    run_geo(str(path), tmp_path / "cos.tif", tile_size=64, overlap=32, **kwargs)
    run_geo(str(path), tmp_path / "flat.tif", tile_size=64, overlap=32,
            fake=kwargs["fake"], stitch={"output": "probabilities", "blending": "none"})
    jumps = {}
    for name in ("cos", "flat"):
        water = read(tmp_path / f"{name}.tif", 2)[0]
        jumps[name] = max(np.abs(np.diff(water, axis=0)).max(), np.abs(np.diff(water, axis=1)).max())
    assert jumps["cos"] < jumps["flat"] / 2


def test_several_inputs_into_a_directory(tmp_path):
    a, b = tmp_path / "a.tif", tmp_path / "b.tif"
    synthetic.write_scene(a, 100, 120, seed=1)
    synthetic.write_scene(b, 90, 70, seed=2)
    records = run_geo([str(a), str(b)], tmp_path / "masks")
    masks = tmp_path / "masks"
    assert [r["output_path"] for r in records] == [str(masks / "a.mask.tif"), str(masks / "b.mask.tif")]
    assert read(tmp_path / "masks" / "b.mask.tif", 1)[0].shape == (90, 70)


def test_default_output_is_beside_the_input(tmp_path):
    path = synthetic.write_scene(tmp_path / "s.tif", 50, 60, seed=1)
    records = run_geo(str(path))
    assert records[0]["output_path"] == str(tmp_path / "s.mask.tif")
    assert (tmp_path / "s.mask.tif").exists()


def test_numpy_logits_and_batches_across_scenes(tmp_path):
    a, b = tmp_path / "a.tif", tmp_path / "b.tif"
    synthetic.write_scene(a, 70, 70, seed=1)
    synthetic.write_scene(b, 70, 70, seed=1)
    run_geo([str(a), str(b)], tmp_path / "out", tile_size=32, overlap=8, fake={"as_numpy": True})
    assert (read(tmp_path / "out" / "a.mask.tif", 1)[0] == read(tmp_path / "out" / "b.mask.tif", 1)[0]).all()


def test_bands_selected_by_name_in_any_file_order(scene, tmp_path):
    path, _ = scene
    dn, profile = read(path)
    shuffled = tmp_path / "shuffled.tif"
    with rasterio.open(shuffled, "w", **profile) as dst:
        dst.write(dn[::-1])
        for band, name in enumerate(reversed(synthetic.BANDS), 1):
            dst.set_band_description(band, name)
    run_geo(str(path), tmp_path / "a.tif")
    run_geo(str(shuffled), tmp_path / "b.tif")
    assert (read(tmp_path / "a.tif", 1)[0] == read(tmp_path / "b.tif", 1)[0]).all()


def test_scale_declared_in_the_file_wins_over_the_model_default(scene, tmp_path):
    path, _ = scene
    dn, profile = read(path)
    tagged = tmp_path / "tagged.tif"
    with rasterio.open(tagged, "w", **profile) as dst:
        dst.write(dn)
        dst.scales = [0.0001] * 6
        dst.offsets = [0.0] * 6
    cfg = make_cfg()
    cfg.model.geo.scale = 1.0  # wrong for DN: only the file's tags can make this right
    run_geo(str(path), tmp_path / "a.tif")
    run_geo(str(tagged), tmp_path / "b.tif", cfg=cfg)
    assert (read(tmp_path / "a.tif", 1)[0] == read(tmp_path / "b.tif", 1)[0]).all()


def test_quicklook(scene, tmp_path):
    from PIL import Image

    from appliance.stages.geo.class_colours import NODATA_GREY, default_colours

    path, _ = scene
    records = run_geo(str(path), tmp_path / "m.tif", write={"quicklook": True, "quicklook_size": 200})
    png = tmp_path / "m.quicklook.png"
    assert "quicklook" in records[0]["display"] and png.exists()
    with Image.open(png) as image:
        assert image.mode == "RGB" and image.width == 200 and image.height > 150  # 200x150, a legend below
        legend = np.asarray(image)[150:].reshape(-1, 3)
    colours = {tuple(int(v) for v in c) for c in np.unique(legend, axis=0)}
    assert {default_colours(2)[1], NODATA_GREY, (0, 0, 0), (255, 255, 255)} <= colours  # water, nodata swatches; text


def test_pipeline_graph_and_option_errors():
    from appliance.errors import ConfigError

    pipeline = build_pipeline(make_cfg())
    assert [s.name for s in pipeline.stages][-1] == "raster_write"
    nodes = stages()
    nodes["tile"] = {"stage": "tile", "tile_size": 64, "stride": 48, "overlap": 8}
    with pytest.raises(ConfigError, match="disagree"):
        build_pipeline(make_cfg(nodes))
    nodes = stages(stitch={"blending": "gaussian"})
    with pytest.raises(ConfigError, match="blending"):
        build_pipeline(make_cfg(nodes))
    nodes = stages()
    del nodes["normalize"]  # no normalize: nothing produces `tensor`
    with pytest.raises(ConfigError, match="'tensor'"):
        build_pipeline(make_cfg(nodes))
    cfg = make_cfg()
    cfg.model.geo.stds = [1.0] * 5
    with pytest.raises(ConfigError, match="5 stds for 6 bands"):
        build_pipeline(cfg)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def results_with_stderr_so_far(monkeypatch, stream, cfg, input, output):
    """Run the chain lazily; each result record with what stderr held when it came out."""
    monkeypatch.setattr(sys, "stderr", stream)
    pipeline = build_pipeline(cfg)
    pipeline.check()
    pipeline.setup()
    try:
        return [(record, stream.getvalue())
                for record in pipeline.run([{"input": str(input), "output": str(output), "overwrite": False}])]
    finally:
        pipeline.close()


def test_progress_line_reaches_n_of_n_before_the_result_comes_out(scene, tmp_path, monkeypatch):
    """Without a terminal: the scene's last progress line (12/12, 100 %) is out before `wrote ...` is."""
    path, _ = scene
    [(record, stderr)] = results_with_stderr_so_far(monkeypatch, io.StringIO(), make_cfg(), path, tmp_path / "m.tif")
    assert record["display"].startswith("wrote ")
    assert re.fullmatch(r"scene\.tif: 12/12 tiles \(100%\), \d+\.\d tiles/s, in \d+s", stderr.splitlines()[-1]), stderr


def test_progress_bar_ends_at_100_percent_on_its_own_line_before_the_result(scene, tmp_path, monkeypatch):
    """On a terminal: the bar is closed at 12/12 (a line of its own) before `wrote ...` comes out, though
    the last tiles arrive together in one engine batch."""
    path, _ = scene
    [(record, stderr)] = results_with_stderr_so_far(monkeypatch, Terminal(), make_cfg(), path, tmp_path / "m.tif")
    assert record["display"].startswith("wrote ")
    assert stderr.endswith("\n"), repr(stderr)
    last = re.split(r"[\r\n]", stderr.rstrip("\n"))[-1]
    assert last.startswith("scene.tif: 100%") and "12/12" in last, repr(last)


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_progress_false_prints_nothing(scene, tmp_path, monkeypatch, stream):
    path, _ = scene
    cfg = make_cfg(stitch={"progress": False})
    [(record, stderr)] = results_with_stderr_so_far(monkeypatch, stream(), cfg, path, tmp_path / "m.tif")
    assert record["display"].startswith("wrote ") and stderr == ""
