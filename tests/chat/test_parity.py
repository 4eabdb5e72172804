"""The request side against transformers: for the same messages and image, `chat_prompt`'s prompt ids equal
what LlavaProcessor / LlavaNextProcessor produce (chat template + `<image>` expansion), and its pixel values
equal their image processors' (PIL backends: no torchvision here)."""
import json

import pytest
import torch
from PIL import Image

from tests.chat.conftest import llava_overrides, png_bytes, request_side
from tests.conftest import REPO
from tests.vision.helpers import reference_processor


@pytest.mark.parametrize("next_", [False, True], ids=["llava-1.5", "llava-next"])
@pytest.mark.parametrize("width,height", [(500, 300), (200, 700)])
def test_prompt_and_pixels_equal_transformers(llava15_dir, llava_next_dir, tmp_path, next_, width, height):
    from transformers import AutoTokenizer, LlavaNextProcessor, LlavaProcessor

    model_dir = llava_next_dir if next_ else llava15_dir
    (tmp_path / "img.png").write_bytes(png_bytes(width, height, (10, 200, 40)))
    (record,) = request_side(llava_overrides(model_dir, next_),
                             {"input": str(tmp_path / "img.png"), "prompt": "What color is it?"})

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    config = json.loads((model_dir / "preprocessor_config.json").read_text())
    cls = LlavaNextProcessor if next_ else LlavaProcessor
    processor = cls(image_processor=reference_processor(config), tokenizer=tok, patch_size=14,
                    vision_feature_select_strategy="default", num_additional_image_tokens=1,
                    chat_template=tok.chat_template)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color is it?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    reference = processor(text=text, images=Image.open(tmp_path / "img.png").convert("RGB"), return_tensors="pt")

    assert record["prompt"] == reference["input_ids"][0].tolist()
    (item,) = record["mm_data"]
    expected = reference["pixel_values"][0]
    assert item.pixel_values.shape == expected.shape
    torch.testing.assert_close(item.pixel_values, expected, atol=1e-5, rtol=0)


LLAVA_TINY = REPO / "appliance" / "assets" / "models" / "llava_tiny"


@pytest.mark.skipif(not (LLAVA_TINY / "config.json").is_file(),
                    reason="appliance/assets/models/llava_tiny is not there (scripts/train_tiny_llava.py)")
def test_shipped_tiny_llava_equals_its_processor(tmp_path):
    """The embedded demo model (LlavaImageProcessor with do_pad, its own chat template, BOS from the
    tokenizer) through `pipeline=llava_chat`'s defaults, against `AutoProcessor` on the same directory."""
    from transformers import AutoProcessor

    Image.new("RGB", (300, 120), (30, 170, 50)).save(tmp_path / "wide.png")
    (record,) = request_side(["pipeline=llava_chat", "plugins=[appliance.stages.chat]"],
                             {"input": str(tmp_path / "wide.png"), "prompt": "What color is the shape?"})
    processor = AutoProcessor.from_pretrained(str(LLAVA_TINY))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color is the shape?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    reference = processor(text=text, images=Image.open(tmp_path / "wide.png").convert("RGB"), return_tensors="pt")
    assert record["prompt"] == reference["input_ids"][0].tolist()
    assert record["mm_data"][0].num_tokens == 64
    torch.testing.assert_close(record["mm_data"][0].pixel_values, reference["pixel_values"][0], atol=1e-5, rtol=0)
