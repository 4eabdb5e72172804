"""`pipeline=llava_encode`: the tower's features, fed back as image_features, give the pixel answer."""
from safetensors.torch import load_file

from tests.chat.conftest import synthetic_shapes
from tests.conftest import assert_user_error, run_cli

shapes = synthetic_shapes()


def test_features_from_llava_encode_give_the_same_answers_as_pixels(tmp_path):
    images = []
    for seed, (shape, color) in enumerate([("circle", "red"), ("triangle", "blue")]):
        image, _ = shapes.make_sample(900 + seed, shape=shape, color=color)
        images.append(tmp_path / f"{shape}.png")
        image.save(images[-1])
    out_dir = tmp_path / "features"
    result = run_cli("run", "pipeline=llava_encode", f"input=[{images[0]},{images[1]}]", f"output={out_dir}")
    assert result.returncode == 0, result.stderr
    assert "wrote 2 feature file(s), each [64, 64]" in result.stdout
    for image in images:
        features_file = out_dir / f"{image.stem}.features.safetensors"
        assert list(load_file(features_file)["image_features"].shape) == [64, 64]
        for question in ("What color is the shape?", "What shape is this?"):
            from_pixels = run_cli("run", "pipeline=llava_chat", f"input={image}", f"prompt={question}")
            from_features = run_cli("run", "pipeline=llava_chat", "model.vision_language.image_input_type=image_features",
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
