"""`stitch.output: classes_and_probabilities`: the class map at the output path and, beside it, the per-class
probabilities as a float32 COG (`<stem>.probabilities.tif`), both the same as the runs that write each
alone, both in the STAC item, and neither left behind by a failed run."""
import json

import numpy as np
import pytest
import rasterio

from appliance.output_files import AtomicFile
from appliance.stages.geo.stitch import NODATA_CLASS, StitchOutput, finish
from appliance.stages.geo.write import probabilities_path
from tests.geo.conftest import run_geo
from tests.geo.test_cog import cog_problems

BOTH = {"output": "classes_and_probabilities"}


def read(path):
    """(pixels, profile, tags, band descriptions); the profile's values as text (NaN nodata compares equal)."""
    with rasterio.open(path) as ds:
        return ds.read(), {k: str(v) for k, v in ds.profile.items()}, ds.tags(), ds.descriptions


@pytest.mark.parametrize("output, expected", [("m.tif", "m.probabilities.tif"), ("a/b.TIF", "a/b.probabilities.tif"),
                                              ("scene.mask.tif", "scene.mask.probabilities.tif")])
def test_probabilities_path(output, expected):
    assert probabilities_path(output) == expected


def test_finish_keeps_both_as_each_mode_gives_them():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
    valid = rng.random((5, 7)) > 0.2
    classes, counts, none = finish(logits.copy(), valid, StitchOutput.classes)
    probs, probs_counts, _ = finish(logits.copy(), valid, StitchOutput.probabilities)
    both, both_counts, kept = finish(logits.copy(), valid, StitchOutput.classes_and_probabilities)
    assert none is None and both.dtype == np.uint8 and kept.dtype == np.float32
    assert (both == classes).all() and np.array_equal(kept, probs, equal_nan=True)
    assert (counts == probs_counts).all() and (counts == both_counts).all()
    assert (kept.argmax(axis=0)[valid] == both[0][valid]).all()
    assert (both[0][~valid] == NODATA_CLASS).all() and np.isnan(kept[:, ~valid]).all()


def test_both_files_equal_the_runs_that_write_each_alone(scene, tmp_path):
    path, _ = scene
    records = run_geo(str(path), tmp_path / "both" / "m.tif", stitch=BOTH)
    run_geo(str(path), tmp_path / "classes" / "m.tif")
    run_geo(str(path), tmp_path / "probs" / "m.tif", stitch={"output": "probabilities"})
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == ["m.probabilities.tif", "m.stac.json", "m.tif"]
    assert records[0]["display"].endswith(f" (probabilities {tmp_path / 'both' / 'm.probabilities.tif'})")

    classes, class_profile, class_tags, class_bands = read(tmp_path / "both" / "m.tif")
    probs, prob_profile, prob_tags, prob_bands = read(tmp_path / "both" / "m.probabilities.tif")
    alone_classes, alone_class_profile, alone_class_tags, _ = read(tmp_path / "classes" / "m.tif")
    alone_probs, alone_prob_profile, alone_prob_tags, _ = read(tmp_path / "probs" / "m.tif")
    assert (classes == alone_classes).all() and np.array_equal(probs, alone_probs, equal_nan=True)
    assert class_tags == alone_class_tags and prob_tags == alone_prob_tags
    assert class_profile == alone_class_profile and prob_profile == alone_prob_profile

    valid = classes[0] != NODATA_CLASS
    assert 0 < valid.sum() < valid.size  # the scene has nodata and water, so the checks below bite
    assert set(np.unique(classes[0][valid])) == {0, 1}
    assert (probs.argmax(axis=0)[valid] == classes[0][valid]).all()
    assert np.isnan(probs[:, ~valid]).all() and not np.isnan(probs[:, valid]).any()
    assert np.allclose(probs[:, valid].sum(axis=0), 1.0, atol=1e-5)

    assert prob_bands == ("p(land)", "p(water)") and class_bands == ("class",)
    assert (prob_profile["dtype"], prob_profile["nodata"], class_profile["nodata"]) == ("float32", "nan", "255.0")
    for key in ("crs", "transform", "width", "height"):
        assert prob_profile[key] == class_profile[key]
    assert prob_tags["class_names"] == "land,water" and prob_tags["source"] == "scene.tif"
    assert cog_problems(str(tmp_path / "both" / "m.tif")) == []
    assert cog_problems(str(tmp_path / "both" / "m.probabilities.tif")) == []


def test_stac_item_lists_both_assets(scene, tmp_path):
    path, _ = scene
    run_geo(str(path), tmp_path / "m.tif", stitch=BOTH)
    assets = json.loads((tmp_path / "m.stac.json").read_text())["assets"]
    assert sorted(assets) == ["mask", "probabilities"]
    mask, probs = assets["mask"], assets["probabilities"]
    assert (mask["href"], probs["href"]) == ("m.tif", "m.probabilities.tif")
    assert mask["roles"] == probs["roles"] == ["data"] and mask["type"] == probs["type"]
    assert [c["name"] for c in mask["classification:classes"]] == ["land", "water", "nodata"]
    assert "classification:classes" not in probs and "p(water)" in probs["description"]


def test_gtiff_format_writes_both_plain(scene, tmp_path):
    path, _ = scene
    run_geo(str(path), tmp_path / "m.tif", stitch=BOTH, write={"format": "gtiff"})
    for name in ("m.tif", "m.probabilities.tif"):
        assert "GDAL does not report LAYOUT=COG" in cog_problems(str(tmp_path / name))


def test_failed_run_leaves_neither_file(scene, tmp_path):
    path, _ = scene
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="on purpose"):
        run_geo(str(path), out / "m.tif", stitch=BOTH, fake={"fail_after": 5})
    assert list(out.iterdir()) == []


def test_a_failed_cog_copy_of_the_probabilities_leaves_neither_file(scene, tmp_path, monkeypatch):
    import appliance.stages.geo.write as write

    copy = write.translate_to_cog

    def fail_on_probabilities(source, target, *args):
        if ".m.probabilities.tif." in target:
            raise OSError(28, "No space left on device")
        copy(source, target, *args)

    monkeypatch.setattr(write, "translate_to_cog", fail_on_probabilities)
    path, _ = scene
    out = tmp_path / "out"
    with pytest.raises(Exception, match="No space left on device"):
        run_geo(str(path), out / "m.tif", stitch=BOTH)
    assert list(out.iterdir()) == []


def test_a_failed_rename_of_the_class_map_takes_the_probabilities_back(scene, tmp_path, monkeypatch):
    """The probabilities file is renamed into place first; the class map's rename failing removes it."""
    commit = AtomicFile.commit

    def fail_on_class_map(self):
        if self.path.endswith("/m.tif"):
            raise OSError(5, "Input/output error")
        commit(self)

    monkeypatch.setattr(AtomicFile, "commit", fail_on_class_map)
    path, _ = scene
    out = tmp_path / "out"
    with pytest.raises(Exception, match="Input/output error"):
        run_geo(str(path), out / "m.tif", stitch=BOTH)
    assert list(out.iterdir()) == []


def test_classes_alone_write_no_probabilities_file(scene, tmp_path):
    path, _ = scene
    out = tmp_path / "out"
    run_geo(str(path), out / "m.tif")
    run_geo(str(path), out / "p.tif", stitch={"output": "probabilities"})
    assert sorted(p.name for p in out.iterdir()) == ["m.stac.json", "m.tif", "p.stac.json", "p.tif"]


def test_a_probabilities_file_that_would_replace_the_input_is_refused(scene, tmp_path):
    from appliance.errors import InputError

    path, _ = scene
    source = tmp_path / "m.probabilities.tif"
    source.write_bytes(path.read_bytes())
    with pytest.raises(InputError, match="would replace the input"):
        run_geo(str(source), tmp_path / "m.tif", stitch=BOTH)
    assert source.read_bytes() == path.read_bytes() and not (tmp_path / "m.tif").exists()
