"""`pipeline=llava_encode`: the tower's features, fed back as image_features, give the pixel answer."""
import torch
from safetensors.torch import load_file

from appliance.config.compose import compose
from appliance.stages.build import build_pipeline
from tests.chat.conftest import synthetic_shapes
from tests.conftest import assert_user_error, run_cli

shapes = synthetic_shapes()


def test_llava_encode_builds_and_reads_the_vision_tower_only(monkeypatch, tmp_path):
    from appliance.engine import loader
    from appliance.engine.models.llava import checkpoint_name

    real_iter_weights = loader.iter_weights
    read = {}

    def spy(path, keep=lambda name: True):
        for name, tensor in real_iter_weights(path, keep):
            read[name] = tensor.numel()
            yield name, tensor

    monkeypatch.setattr(loader, "iter_weights", spy)
    # Torch's kernels: packing for ours would free the linear weights' [N, K] copies, whose sizes this counts.
    inputs, engine_stage, _ = build_pipeline(compose(["pipeline=llava_encode", "engine.cpu_kernels=false"])).stages
    inputs.setup()
    engine_stage.setup()  # the engine owns the tower (pool mode on the LLaVA checkpoint)
    model = engine_stage.engine.model
    params = dict(model.named_parameters())
    assert params and all(name.startswith("vision_tower.") for name in params)  # no projector, no LM
    assert not hasattr(model, "language_model") and not hasattr(model, "multi_modal_projector")
    assert read and all(checkpoint_name(name).startswith("vision_tower.") for name in read)  # LM tensors unread
    assert sum(p.numel() for p in params.values()) == sum(read.values())  # each parameter read once
    image, _ = shapes.make_sample(7)
    image.save(tmp_path / "a.png")
    item = inputs.side.prepare(str(tmp_path / "a.png"), "input", media_dir=str(tmp_path))
    with torch.no_grad():
        features = model.vision_features(item.pixel_values[None])[0]
    assert tuple(features.shape) == (64, 64)  # the tower's output: 64 patches, vision hidden 64
    assert torch.equal(engine_stage.engine.encode([item.pixel_values[None]])[0][0], features)  # the engine runs it


def test_features_from_llava_encode_give_the_same_answers_as_pixels(tmp_path):
    images = []
    for seed, (shape, color) in enumerate([("circle", "red"), ("triangle", "blue")]):
        image, _ = shapes.make_sample(900 + seed, shape=shape, color=color)
        images.append(tmp_path / f"{shape}.png")
        image.save(images[-1])
    out_dir = tmp_path / "features"
    result = run_cli("run", "pipeline=llava_encode", f"input=[{images[0]},{images[1]}]", f"output={out_dir}")
    assert result.returncode == 0, result.stderr
    assert "wrote 2 feature files, each [64, 64]" in result.stdout
    for image in images:
        features_file = out_dir / f"{image.stem}.features.safetensors"
        assert list(load_file(features_file)["image_features"].shape) == [64, 64]
        for question in ("What color is the shape?", "What shape is this?"):
            from_pixels = run_cli("run", "pipeline=llava_chat", f"input={image}", f"prompt={question}")
            from_features = run_cli("run", "pipeline=llava_chat",
                                    "model.vision_language.image_input_type=image_features",
                                    f"input={features_file}", f"prompt={question}")
            assert from_pixels.returncode == 0 and from_features.returncode == 0, from_features.stderr
            assert from_features.stdout == from_pixels.stdout != ""
    assert sorted(p.name for p in out_dir.iterdir()) == ["circle.features.safetensors", "triangle.features.safetensors"]


def test_llava_encode_refuses_bad_input_before_writing(tmp_path):
    image, _ = shapes.make_sample(5)
    image.save(tmp_path / "a.png")
    target = tmp_path / "a.safetensors"
    target.write_bytes(b"keep")
    assert_user_error(run_cli("run", "pipeline=llava_encode", f"input={tmp_path / 'a.png'}", f"output={target}"),
                      "output:", "overwrite=true")
    assert target.read_bytes() == b"keep"
    assert_user_error(run_cli("run", "pipeline=llava_encode", f"input={tmp_path / 'missing.png'}"),
                      "input:", "missing.png")
    assert_user_error(run_cli("run", "pipeline=llava_encode", "model=llava_next_mistral_7b",
                              f"input={tmp_path / 'a.png'}"), "model.path")
