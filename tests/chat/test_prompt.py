"""`chat_prompt` up to the engine boundary: prompt ids, placeholder runs, ImageItems, and the refusals.

The LLaVA checkpoints here are config + tokenizer only (conftest): the request side loads no weights.
"""
import pytest
import torch

from appliance.engine.multimodal import mm_ranges
from appliance.errors import InputError
from appliance.stages.chat.template import expand_placeholders
from appliance.vision import AnyresConfig, llava_next_feature_count
from tests.chat.conftest import (batch_request, data_url, llava_overrides, png_bytes, request_side, text_overrides,
                                 write_jsonl)

IMG = 7  # image token id in the pure tests


@pytest.mark.parametrize("ids,counts,expected,offsets", [
    ([1, IMG, 2], [3], [1, IMG, IMG, IMG, 2], [1]),
    ([IMG, 5, IMG], [2, 1], [IMG, IMG, 5, IMG], [0, 3]),
    ([1, 2], [], [1, 2], []),
    ([IMG], [1], [IMG], [0]),
])
def test_expand_placeholders_table(ids, counts, expected, offsets):
    assert expand_placeholders(ids, IMG, counts) == (expected, offsets)


def test_expand_placeholders_needs_one_token_per_image():
    with pytest.raises(ValueError, match="2 image tokens for 1 images"):
        expand_placeholders([IMG, IMG], IMG, [4])


def _image(tmp_path, width, height, name="img.png", color=(200, 30, 30)):
    (tmp_path / name).write_bytes(png_bytes(width, height, color))
    return str(tmp_path / name)


def _check_runs(record, image_token_id):
    """Every ImageItem's placeholder run sits in the prompt, and nothing else is an image token."""
    ids, items = record["prompt"], record["mm_data"]
    assert record["mm_ranges"] == mm_ranges(items)
    marked = set()
    for item in items:
        run = ids[item.offset:item.offset + item.num_tokens]
        assert run == [image_token_id] * item.num_tokens
        marked |= set(range(item.offset, item.offset + item.num_tokens))
    assert {i for i, t in enumerate(ids) if t == image_token_id} == marked


def _image_token_id(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("<image>")


def test_llava15_single_image(llava15_dir, tmp_path):
    (record,) = request_side(llava_overrides(llava15_dir), {"input": _image(tmp_path, 640, 480), "prompt": "What?"})
    (item,) = record["mm_data"]
    assert item.num_tokens == 576 and item.pixel_values.shape == (3, 336, 336) and item.image_size == (480, 640)
    assert record["mm_ranges"] == [(item.content_hash, item.offset, 576)]
    _check_runs(record, _image_token_id(llava15_dir))


@pytest.mark.parametrize("width,height", [(1024, 768), (300, 900), (2000, 40), (336, 336), (1, 1)])
def test_llava_next_counts_follow_image_size(llava_next_dir, tmp_path, width, height):
    (record,) = request_side(llava_overrides(llava_next_dir, True),
                             {"input": _image(tmp_path, width, height), "prompt": "Describe."})
    (item,) = record["mm_data"]
    import json

    config = json.loads((llava_next_dir / "config.json").read_text())
    assert item.num_tokens == llava_next_feature_count((height, width), AnyresConfig.from_model_config(config))
    if (width, height) == (1024, 768):
        assert item.num_tokens == 2340  # the figure docs/vision.md checks against transformers
    assert item.pixel_values.shape[1:] == (3, 336, 336) and item.image_size == (height, width)
    _check_runs(record, _image_token_id(llava_next_dir))


def test_two_images_in_order_within_the_limit(llava_next_dir, tmp_path):
    content = [{"type": "image_url", "image_url": {"url": "a.png"}}, {"type": "text", "text": "Compare."},
               {"type": "image_url", "image_url": {"url": data_url(500, 100, (0, 0, 255))}}]
    _image(tmp_path, 100, 500, "a.png")
    batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("two", content), batch_request("none", "Hi")])
    records = request_side(llava_overrides(llava_next_dir, True, "model.vision_language.limit_per_prompt=2"),
                           {"input": str(batch), "output": str(tmp_path / "out.jsonl")})
    first, second = records
    a, b = first["mm_data"]
    assert a.image_size == (500, 100) and b.image_size == (100, 500) and a.offset < b.offset
    assert a.num_tokens != b.num_tokens  # portrait vs landscape grids differ
    _check_runs(first, _image_token_id(llava_next_dir))
    assert second["mm_data"] is None and second["mm_ranges"] is None
    assert [r["custom_id"] for r in records] == ["two", "none"]


def test_same_picture_same_hash_any_source(llava15_dir, tmp_path):
    content = [{"type": "image_url", "image_url": {"url": "a.png"}},
               {"type": "image_url", "image_url": {"url": data_url(64, 48)}}, {"type": "text", "text": "Same?"}]
    _image(tmp_path, 64, 48, "a.png")
    batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("x", content)])
    (record,) = request_side(llava_overrides(llava15_dir, False, "model.vision_language.limit_per_prompt=2"),
                             {"input": str(batch), "output": str(tmp_path / "o.jsonl")})
    a, b = record["mm_data"]
    assert a.content_hash == b.content_hash
    assert b.offset == a.offset + 576 + 1  # the template writes "<image>\n": one token between the runs
    torch.testing.assert_close(a.pixel_values, b.pixel_values)


def _refused(overrides, record, *fragments):
    with pytest.raises(InputError) as e:
        request_side(overrides, record)
    for fragment in fragments:
        assert fragment in str(e.value), (fragment, str(e.value))


def test_too_many_images(llava15_dir, tmp_path):
    content = [{"type": "image_url", "image_url": {"url": "a.png"}}] * 2 + [{"type": "text", "text": "?"}]
    _image(tmp_path, 64, 64, "a.png")
    batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("ok", "Hi"), batch_request("many", content)])
    _refused(llava_overrides(llava15_dir), {"input": str(batch), "output": str(tmp_path / "o.jsonl")},
             "r.jsonl line 2 (custom_id 'many')", "2 images in one request", "allows 1",
             "model.vision_language.limit_per_prompt")


def test_prompt_too_long_with_image_tokens(llava15_dir, tmp_path):
    _refused(llava_overrides(llava15_dir, False, "engine.max_model_len=590"),
             {"input": _image(tmp_path, 64, 64), "prompt": "What is this? " * 4},
             "input: the prompt is", "+ 576 image tokens for 1 image)", "context is 590 tokens")


def test_prompt_fits_just_below_the_context(llava15_dir, tmp_path):
    path = _image(tmp_path, 64, 64)
    (record,) = request_side(llava_overrides(llava15_dir), {"input": path, "prompt": "Hi"})
    n = len(record["prompt"])
    request_side(llava_overrides(llava15_dir, False, f"engine.max_model_len={n + 1}"), {"input": path, "prompt": "Hi"})
    _refused(llava_overrides(llava15_dir, False, f"engine.max_model_len={n}"), {"input": path, "prompt": "Hi"},
             f"the prompt is {n} tokens")


def test_image_outside_the_allowed_dir(llava15_dir, tmp_path):
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    _image(outside, 32, 32, "secret.png")
    for url in ("../out/secret.png", str(outside / "secret.png"), "file://" + str(outside / "secret.png")):
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
        batch = write_jsonl(inside / "r.jsonl", [batch_request("x", content)])
        _refused(llava_overrides(llava15_dir), {"input": str(batch), "output": str(inside / "o.jsonl")},
                 "r.jsonl line 1 (custom_id 'x')", "messages[0].content[0].image_url", "outside the allowed")


def test_allowed_dir_from_server_config(llava15_dir, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    _image(media, 32, 32, "pic.png")
    content = [{"type": "image_url", "image_url": {"url": "pic.png"}}, {"type": "text", "text": "?"}]
    batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("x", content)])
    (record,) = request_side(llava_overrides(llava15_dir, False, f"server.allowed_local_media_dir={media}"),
                             {"input": str(batch), "output": str(tmp_path / "o.jsonl")})
    assert record["mm_data"][0].image_size == (32, 32)


def test_bad_image_data_and_pixel_limit(llava15_dir, tmp_path):
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, {"type": "text", "text": "?"}]
    batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("x", content)])
    _refused(llava_overrides(llava15_dir), {"input": str(batch), "output": str(tmp_path / "o.jsonl")},
             "line 1 (custom_id 'x')", "image_url", "not an image")
    _refused(llava_overrides(llava15_dir, False, "server.limits.max_image_pixels=1000"),
             {"input": _image(tmp_path, 100, 100), "prompt": "?"}, "10000 pixels", "limit is 1000")


def test_placeholder_typed_as_text_is_refused(llava15_dir, tmp_path):
    _refused(llava_overrides(llava15_dir), {"input": _image(tmp_path, 32, 32), "prompt": "look: <image>"},
             "input:", "contains the image placeholder")


def test_text_only_request_on_a_vlm(llava15_dir):
    (record,) = request_side(llava_overrides(llava15_dir), {"prompt": "Hello there"})
    assert record["mm_data"] is None and record["mm_ranges"] is None
    assert _image_token_id(llava15_dir) not in record["prompt"]


def test_text_model_renders_strings_and_refuses_images(text_llama_dir, tmp_path):
    from transformers import AutoTokenizer

    (record,) = request_side(text_overrides(text_llama_dir), {"prompt": "Hello"})
    text = AutoTokenizer.from_pretrained(text_llama_dir).decode(record["prompt"])
    assert text == "<user>Hello\n<assistant>"
    _refused(text_overrides(text_llama_dir), {"input": _image(tmp_path, 8, 8), "prompt": "?"},
             "takes no images")


def test_image_features_input(llava15_dir, tmp_path):
    from safetensors.torch import save_file

    features = torch.randn(576, 1024)
    save_file({"features": features}, str(tmp_path / "f.safetensors"))
    torch.save(features, str(tmp_path / "f.pt"))
    save_file({"features": torch.randn(10, 1024)}, str(tmp_path / "bad.safetensors"))
    overrides = llava_overrides(llava15_dir, False, "model.vision_language.image_input_type=image_features")
    for name in ("f.safetensors", "f.pt"):
        content = [{"type": "image_url", "image_url": {"url": name}}, {"type": "text", "text": "?"}]
        batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("x", content)])
        (record,) = request_side(overrides, {"input": str(batch), "output": str(tmp_path / "o.jsonl")})
        (item,) = record["mm_data"]
        assert item.pixel_values is None and item.num_tokens == 576
        torch.testing.assert_close(item.features, features)
    for name, fragment in (("bad.safetensors", "shape [10, 1024]"), (data_url(8, 8), "takes image features")):
        content = [{"type": "image_url", "image_url": {"url": name}}, {"type": "text", "text": "?"}]
        batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("x", content)])
        _refused(overrides, {"input": str(batch), "output": str(tmp_path / "o.jsonl")}, fragment)


def test_each_image_is_capped_by_max_media_bytes_not_the_body_limit(llava15_dir, tmp_path):
    import numpy as np
    from PIL import Image

    from appliance.config.compose import compose
    from appliance.stages.chat.images import ImageSide

    overrides = llava_overrides(llava15_dir, False, "server.limits.max_media_bytes=1000",
                                "server.limits.max_request_bytes=5")
    side = ImageSide.from_config(compose(overrides))
    assert side.reading.max_bytes == side.reading.fetch_policy.max_bytes == 1000
    big = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(big)
    _refused(overrides, {"input": str(big), "prompt": "What?"}, "the limit is 1000 bytes")


@pytest.mark.parametrize("model", ["llava15_dir", "text_llama_dir"])
def test_a_text_refused_before_tokenizing_never_fits(model, request):
    """`check_text_fits` refuses only texts whose real token count is past the context, whatever their
    characters and spacing; and a 10 MB prompt is refused without tokenizing it."""
    from hypothesis import given, settings, strategies as st
    from transformers import AutoTokenizer

    from appliance.stages.engine_stage import check_text_fits, longest_token

    tokenizer = AutoTokenizer.from_pretrained(request.getfixturevalue(model))
    longest, limit = longest_token(tokenizer), 4
    refused = []
    pieces = st.sampled_from(["a", "word", " ", "  \n", "ünï", "中文", "🙂", "----", "\t", "0123456789"])

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(st.lists(pieces, max_size=120).map("".join))
    def refused_only_when_too_long(text):
        try:
            check_text_fits(text, longest, limit, "prompt")
        except InputError:
            assert len(tokenizer.encode(text, add_special_tokens=False)) >= limit, text
            refused.append(text)

    refused_only_when_too_long()
    assert refused  # the examples reach the bound
    with pytest.raises(InputError, match="prompt: the prompt is 10000000 characters"):
        check_text_fits("word " * 2_000_000, longest, 4096, "prompt")


def test_a_group_prepared_together_fails_only_its_bad_requests(llava15_dir, tmp_path):
    # What a server's preparer does with the requests waiting: each good one comes out as when it is
    # prepared alone, each bad one as its own error.
    from appliance.config.compose import compose
    from appliance.stages.build import build_pipeline

    pipeline = build_pipeline(compose(llava_overrides(llava15_dir)))
    stage = next(s for s in pipeline.stages if s.name == "chat_prompt")
    stage.setup()

    def request(*content):
        return {"messages": [{"role": "user", "content": list(content)}], "where": "messages", "media_dir": None}

    def image(url):
        return {"type": "image_url", "image_url": {"url": url}}

    question = {"type": "text", "text": "What colour?"}
    group = [request(image(data_url(64, 48)), question), request(image("data:image/png;base64,AAAA"), question),
             request(image(data_url(40, 90, (10, 200, 10))), question),
             request(image(data_url(8, 8)), image(data_url(8, 8)), question),
             request(question), request(image(data_url(30, 30, (10, 10, 200))), question)]
    try:
        results = stage.process_each(group)
        for i in (0, 2, 4, 5):
            (alone,) = stage.process(iter([group[i]]))
            assert results[i]["prompt"] == alone["prompt"] and results[i]["mm_ranges"] == alone["mm_ranges"]
            for together, single in zip(results[i]["mm_data"] or [], alone["mm_data"] or []):
                assert torch.equal(together.pixel_values, single.pixel_values)
        assert isinstance(results[1], InputError) and str(results[1]).startswith("messages[0].content[0].image_url")
        assert isinstance(results[3], InputError) and "2 images in one request" in str(results[3])
    finally:
        pipeline.close()
