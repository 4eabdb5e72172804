"""The whole llava_chat pipeline in-process on tiny random LLaVA-1.5 / LLaVA-NeXT checkpoints (CLIP 56/14:
16 tokens a view): the answers equal a greedy loop over transformers' model fed the same prompt ids and
pixel values that `chat_prompt` built (test_parity.py shows those equal transformers' processors')."""
import json

import pytest
import torch

from appliance.config.compose import compose
from appliance.stages.build import build_pipeline
from tests.chat.conftest import LLAVA_TEMPLATE, batch_request, data_url, tokenizer_with_image, write_jsonl

PINPOINTS = [[56, 112], [112, 56], [112, 112]]
MAX_TOKENS = 6


def write_random_llava(path, next_):
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaNextConfig, LlavaNextForConditionalGeneration)

    tok = tokenizer_with_image(path, LLAVA_TEMPLATE)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=56, patch_size=14, projection_dim=16)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       bos_token_id=1, eos_token_id=2)
    image_id = tok.convert_tokens_to_ids("<image>")
    pre = {"crop_size": {"height": 56, "width": 56}, "size": {"shortest_edge": 56}, "do_center_crop": True,
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]}
    if next_:
        config = LlavaNextConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                                 image_grid_pinpoints=PINPOINTS)
        model_cls = LlavaNextForConditionalGeneration
        pre = {**pre, "image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": PINPOINTS}
    else:
        config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id)
        model_cls = LlavaForConditionalGeneration
        pre = {**pre, "image_processor_type": "CLIPImageProcessor"}
    torch.manual_seed(0)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and "vision_tower" not in name:
                p.normal_(0, 0.15)
    model.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    return model.eval()


def hf_greedy(model, ids, item, steps):
    kwargs = {"pixel_values": item.pixel_values[None]} if item is not None else {}
    if item is not None and item.pixel_values.dim() == 4:  # NeXT: [1, views, 3, H, W] + the original size
        kwargs["image_sizes"] = torch.tensor([list(item.image_size)])
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids]), **kwargs).logits[0, -1]
            out.append(int(logits.argmax()))
            ids.append(out[-1])
    return out


@pytest.mark.parametrize("next_", [False, True], ids=["llava-1.5", "llava-next"])
def test_pipeline_answers_equal_transformers(tmp_path, next_):
    arch = "LlavaNextForConditionalGeneration" if next_ else "LlavaForConditionalGeneration"
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    model = write_random_llava(model_dir, next_)
    lines = [
        batch_request("red", [{"type": "image_url", "image_url": {"url": data_url(90, 60, (220, 30, 30))}},
                              {"type": "text", "text": "What color?"}], max_tokens=MAX_TOKENS, temperature=0),
        batch_request("text", "Hello", max_tokens=MAX_TOKENS, temperature=0),
        batch_request("blue", [{"type": "text", "text": "And this?"},
                               {"type": "image_url", "image_url": {"url": data_url(40, 130, (30, 70, 220))}}],
                      max_tokens=MAX_TOKENS, temperature=0),
    ]
    batch = write_jsonl(tmp_path / "requests.jsonl", lines)
    cfg = compose(["pipeline=llava_chat", "plugins=[appliance.stages.chat]", f"model.path={model_dir}",
                   f"model.architecture={arch}", "model.name=tiny-random", "engine.num_kv_blocks=64"])
    stages = cfg.pipeline.stages  # stop before chat_responses to see the prompts and completions
    cfg.pipeline.stages = {k: stages[k] for k in ("chat_requests", "chat_prompt", "engine")}
    pipeline = build_pipeline(cfg)
    try:
        records = list(pipeline.run([{"input": str(batch), "output": str(tmp_path / "answers.jsonl"),
                                      "prompt": None}]))
    finally:
        pipeline.close()
    assert [r["custom_id"] for r in records] == ["red", "text", "blue"]
    assert [len(r["mm_data"] or []) for r in records] == [1, 0, 1]
    for record in records:
        item = record["mm_data"][0] if record["mm_data"] else None
        expected = hf_greedy(model, record["prompt"], item, MAX_TOKENS)
        got = record["completion"].token_ids
        assert got == expected[:len(got)], record["custom_id"]
        assert len(got) == MAX_TOKENS or got[-1] == 2  # length, or stopped at EOS
