"""The embedded tiny LLaVA (appliance/assets/models/llava_tiny) loads offline with transformers, has the
llava-hf layout our engine reads, and answers questions about fresh synthetic shapes.

transformers is the reference here: this checks the shipped artefact, independently of the training
script (scripts/train_tiny_llava.py) and of our engine.
"""
from pathlib import Path

import pytest
import torch

from appliance.config.compose import compose
from appliance.vl_config import resolve_vision_language
from scripts.synthetic_shapes import COLORS, SHAPES, generate

MODEL_DIR = Path(__file__).resolve().parents[2] / "appliance" / "assets" / "models" / "llava_tiny"
TEST_SEED = 3_000_017  # neither the training (0) nor the evaluation (2_000_001) stream
QUESTIONS = {"color": "What color is the shape?", "shape": "What shape is this?"}


@pytest.fixture(scope="module")
def llava():
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    torch.set_num_threads(1)
    model = LlavaForConditionalGeneration.from_pretrained(MODEL_DIR, local_files_only=True).eval()
    processor = AutoProcessor.from_pretrained(MODEL_DIR, local_files_only=True)
    return model, processor


def prompt(processor, question):
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(conversation, add_generation_prompt=True)


def test_shipped_files_and_sizes():
    names = {p.name for p in MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "preprocessor_config.json", "processor_config.json", "metrics.json"} <= names
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) < 5 * 1024 * 1024


def test_llava_15_conventions(llava):
    model, processor = llava
    config, tokenizer = model.config, processor.tokenizer
    assert model.dtype == torch.float32
    assert (config.vision_feature_layer, config.vision_feature_select_strategy, config.projector_hidden_act) == \
        (-2, "default", "gelu")
    assert config.image_token_index == tokenizer.convert_tokens_to_ids("<image>") == processor.image_token_id
    assert [tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token, tokenizer.pad_token] == \
        ["<s>", "</s>", "<unk>", "<pad>"]
    assert prompt(processor, "Hi?") == "USER: <image>\nHi? ASSISTANT:"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Hi?"}], tokenize=False,
                                         add_generation_prompt=True) == "USER: Hi? ASSISTANT:"
    text = "naïve ✓ text"  # byte fallback: anything encodes and decodes
    assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text

    side = config.vision_config.image_size
    inputs = processor(images=[next(generate(1, seed=TEST_SEED))[0]], text=[prompt(processor, "Hi?")],
                       return_tensors="pt")
    assert inputs["pixel_values"].shape == (1, 3, side, side)
    expected_tokens = (side // config.vision_config.patch_size) ** 2
    assert (inputs["input_ids"] == config.image_token_index).sum() == expected_tokens == config.image_seq_length


def test_model_config_resolves_against_the_checkpoint():
    resolved = resolve_vision_language(compose(["pipeline=llava_chat", "model=llava_tiny"]).model)
    assert resolved.image_input_shape == (3, 112, 112)
    assert resolved.image_feature_size == resolved.max_image_feature_size == 64


@torch.no_grad()
def test_greedy_answers_on_fresh_images(llava):
    model, processor = llava
    samples = list(generate(100, seed=TEST_SEED))  # enough answers that one unlucky image does not decide
    right, wrong = 0, []
    for kind, question in QUESTIONS.items():
        options = set(COLORS) if kind == "color" else set(SHAPES)
        inputs = processor(images=[im for im, _ in samples], text=[prompt(processor, question)] * len(samples),
                           return_tensors="pt")
        out = model.generate(**inputs, do_sample=False, max_new_tokens=10)
        answers = processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        for (_, labels), answer in zip(samples, answers):
            truth = getattr(labels, kind)
            words = set(answer.lower().replace(".", " ").split())
            if truth in words and not words & (options - {truth}):
                right += 1
            else:
                wrong.append((question, truth, answer))
    assert right / (2 * len(samples)) >= 0.9, wrong
