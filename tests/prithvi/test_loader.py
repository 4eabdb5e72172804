"""Checkpoint layouts terratorch has used, and strict key matching."""
import pytest
import torch

from appliance.engine.models.prithvi import load_prithvi, normalize_state_dict, read_checkpoint
from appliance.errors import ConfigError

from .helpers import GOLDEN, golden_prithvi_cfg, golden_reference, model_cfg


def _golden_state():
    return read_checkpoint(str(GOLDEN / "checkpoint.pt"))


def _logits(path):
    ref = golden_reference()
    with torch.no_grad():
        return load_prithvi(model_cfg(golden_prithvi_cfg(), path))(ref["input"])


@pytest.mark.parametrize(
    "name, transform",
    [
        ("new layout, Lightning wrapper", lambda s: {"state_dict": s}),
        ("bare state dict with model. prefix", lambda s: s),
        ("no model. prefix", lambda s: {k[len("model."):]: v for k, v in s.items()}),
        ("old decoder.fpn layout",
         lambda s: {"state_dict": {k.replace("neck.2.fpn", "decoder.fpn"): v for k, v in s.items()}}),
        ("aux heads and criterion ignored", lambda s: {"state_dict": {
            **s, "model.aux_heads.aux.0.weight": torch.zeros(3), "criterion.weight": torch.ones(2)}}),
        ("_timm_module encoder keys", lambda s: {k.replace("model.encoder.", "model.encoder._timm_module."): v
                                                 for k, v in s.items()}),
        ("no pos_embed, float32", lambda s: {k: v.float() for k, v in s.items() if not k.endswith("pos_embed")}),
    ],
)
def test_layouts_load_to_the_same_model(tmp_path, name, transform):
    path = tmp_path / "ckpt.pt"
    torch.save(transform(_golden_state()), path)
    assert (_logits(path) - golden_reference()["logits_no_coords"]).abs().max().item() < 1e-4, name


def test_normalize_maps_old_pyramid_keys():
    state = {"model.decoder.fpn1.0.weight": 1, "model.decoder.fpn_bottleneck.conv.weight": 2,
             "model.head.head.2.bias": 3, "model.aux_heads.x.weight": 4, "criterion.weight": 5}
    assert normalize_state_dict(state) == {
        "neck.2.fpn1.0.weight": 1, "decoder.fpn_bottleneck.conv.weight": 2, "head.head.2.bias": 3}


def _error(tmp_path, state, **cfg_overrides):
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    cfg = golden_prithvi_cfg()
    for key, value in cfg_overrides.items():
        cfg[key] = value
    with pytest.raises(ConfigError) as info:
        load_prithvi(model_cfg(cfg, path))
    return str(info.value)


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    state = _golden_state()
    del state["model.decoder.bottleneck.conv.weight"]
    state["model.decoder.extra.weight"] = torch.zeros(1)
    message = _error(tmp_path, state)
    assert "missing (1): decoder.bottleneck.conv.weight" in message
    assert "unexpected (1): decoder.extra.weight" in message
    assert "\n" not in message


def test_wrong_architecture_is_reported_as_shape_mismatch(tmp_path):
    message = _error(tmp_path, _golden_state(), num_classes=3)
    assert "shape mismatch" in message and "head.head.2.weight" in message


def test_missing_coords_encoders_are_reported(tmp_path):
    message = _error(tmp_path, _golden_state(), coords_encoding=[])
    assert "unexpected (2)" in message and "encoder.temporal_embed_enc.scale" in message


def test_wrong_band_count_names_geo_bands(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save(_golden_state(), path)
    with pytest.raises(ConfigError, match="geo.bands"):
        load_prithvi(model_cfg(golden_prithvi_cfg(), path, bands=["RED", "GREEN", "BLUE"]))


class _Opaque:  # a pickled object that weights_only loading refuses
    pass


def test_non_tensor_pickles_are_refused_with_a_hint(tmp_path):
    path = tmp_path / "full.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": _Opaque()}, path)
    with pytest.raises(ConfigError, match="weights_only"):
        read_checkpoint(str(path))


@pytest.mark.parametrize("name, expected", [("nope.pt", "does not exist"), ("ckpt.txt", "expected a .safetensors")])
def test_bad_paths(tmp_path, name, expected):
    path = tmp_path / name
    if name.endswith(".txt"):
        path.write_text("x")
    with pytest.raises(ConfigError, match=expected):
        read_checkpoint(str(path))


def test_no_checkpoint_configured():
    cfg = model_cfg(golden_prithvi_cfg(), "x")
    cfg.checkpoint = None
    with pytest.raises(ConfigError, match="model.checkpoint=PATH"):
        load_prithvi(cfg)


def test_prithvi_modules_import_each_other_one_way():
    """No import cycle inside the package (loader reads checkpoints; segmentation builds and loads)."""
    import ast
    from pathlib import Path

    import appliance.engine.models.prithvi as package

    root = Path(package.__file__).parent
    imports = {}
    for path in root.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                names.add(node.module.split(".")[0])
        imports[path.stem] = names - {"__init__"}

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, (*seen, n))) for n in imports.get(start, ()))

    cycles = [name for name in imports if name != "__init__" and reaches(name, name)]
    assert cycles == [], f"import cycle through {cycles}"
