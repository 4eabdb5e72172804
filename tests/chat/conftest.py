"""Checkpoint directories for the chat stages.

- `llava15_dir` / `llava_next_dir`: config.json (transformers' LlavaConfig / LlavaNextConfig: CLIP 336/14,
  the NeXT pinpoints), preprocessor_config.json as llava-hf ships it, and a small byte-level BPE tokenizer
  with `<image>` appended and a llava-style chat template. No weights: the request side needs none.
- `text_llama_dir`: the engine tests' tiny random Llama with a chat template: runs end to end.
"""
import base64
import importlib.util
import io
import json
import sys

import pytest
from PIL import Image

from appliance.config.compose import compose
from appliance.stages.build import build_pipeline
from tests.conftest import one_torch_thread

LLAVA_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() + ': ' }}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>\n' }}{% endif %}{% endfor %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] + ' ' }}{% endif %}{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
TEXT_TEMPLATE = ("{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
CLIP = {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "do_normalize": True,
        "do_rescale": True, "do_resize": True, "do_convert_rgb": True, "resample": 3,
        "rescale_factor": 1 / 255, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "size": {"shortest_edge": 336}}
PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]


def tokenizer_with_image(path, template):
    from tests.engine.helpers import build_tokenizer

    tok = build_tokenizer(str(path))
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.chat_template = template
    tok.save_pretrained(str(path))
    return tok


def write_llava_dir(path, next_=False):
    from transformers import LlamaConfig, LlavaConfig, LlavaNextConfig

    tok = tokenizer_with_image(path, LLAVA_TEMPLATE)
    image_id = tok.convert_tokens_to_ids("<image>")
    text = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    if next_:
        config = LlavaNextConfig(text_config=text, image_token_index=image_id, image_grid_pinpoints=PINPOINTS)
        config.architectures = ["LlavaNextForConditionalGeneration"]
        pre = {**CLIP, "image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": PINPOINTS}
    else:
        config = LlavaConfig(text_config=text, image_token_index=image_id)
        config.architectures = ["LlavaForConditionalGeneration"]
        pre = {**CLIP, "image_processor_type": "CLIPImageProcessor"}
    config.save_pretrained(str(path))
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    return path


@pytest.fixture(scope="session")
def llava15_dir(tmp_path_factory):
    return write_llava_dir(tmp_path_factory.mktemp("llava15"))


@pytest.fixture(scope="session")
def llava_next_dir(tmp_path_factory):
    return write_llava_dir(tmp_path_factory.mktemp("llava_next"), next_=True)


@pytest.fixture(scope="session")
def text_llama_dir(tmp_path_factory):
    from tests.engine.helpers import build_checkpoint

    path = build_checkpoint(tmp_path_factory.mktemp("text_llama"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEXT_TEMPLATE
    tok.save_pretrained(path)
    return path


def llava_overrides(model_dir, next_=False, *extra):
    arch = "LlavaNextForConditionalGeneration" if next_ else "LlavaForConditionalGeneration"
    return ["pipeline=llava_chat", "plugins=[appliance.stages.chat]", f"model.path={model_dir}",
            f"model.architecture={arch}", *extra]


def text_overrides(model_dir, *extra):
    return ["pipeline=llava_chat", "plugins=[appliance.stages.chat]", f"model.path={model_dir}",
            "model.name=tiny-llama", "model.architecture=LlamaForCausalLM", "model.vision_language=null",
            "engine.num_kv_blocks=64", *extra]


def request_side(overrides, record):
    """Run chat_requests + chat_prompt on one run record: the records the engine would receive."""
    cfg = compose(overrides)
    cfg.pipeline.stages = {k: cfg.pipeline.stages[k] for k in ("chat_requests", "chat_prompt")}
    pipeline = build_pipeline(cfg)
    try:
        pipeline.check()
        return list(pipeline.run([{"input": None, "output": None, "prompt": None, **record}]))
    finally:
        pipeline.close()


def png_bytes(width, height, color=(200, 30, 30)):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(width, height, color=(200, 30, 30)):
    return "data:image/png;base64," + base64.b64encode(png_bytes(width, height, color)).decode()


def write_jsonl(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def batch_request(custom_id, content, **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": content}], **body}}


def completion_request(custom_id, prompt, **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {"prompt": prompt, **body}}


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def synthetic_shapes():
    """scripts/synthetic_shapes.py as a module (scripts/ is not a package)."""
    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("synthetic_shapes", REPO / "scripts" / "synthetic_shapes.py")
    shapes = importlib.util.module_from_spec(spec)
    sys.modules["synthetic_shapes"] = shapes  # its dataclasses look their module up while being built
    spec.loader.exec_module(shapes)
    return shapes


def clear_samples(shapes, count, first_seed=1000):
    """Seeded samples drawn plainly (aspect <= 2, shape >= 40 % of the short side): what the demo is for."""
    seed = first_seed
    while count:
        image, labels = shapes.make_sample(seed)
        width, height = labels.image_size
        if max(width, height) <= 2 * min(width, height) and labels.bbox[2] - labels.bbox[0] >= 0.4 * min(width, height):
            count -= 1
            yield image, labels
        seed += 1


def seeded_image_questions(directory, count=4, first_seed=3000):
    """(prompt, mm_data) of the tiny LLaVA's colour and shape questions on `count` seeded images saved
    under `directory`, as the chat pipeline's request side makes them: engine-level comparisons run
    these."""
    shapes = synthetic_shapes()
    requests = []
    for i, (image, _) in enumerate(clear_samples(shapes, count, first_seed=first_seed)):
        image.save(directory / f"{i}.png")
        for question in (shapes.COLOR_QUESTIONS[0], shapes.SHAPE_QUESTIONS[0]):
            (record,) = request_side(["pipeline=llava_chat", "plugins=[appliance.stages.chat]"],
                                     {"input": str(directory / f"{i}.png"), "prompt": question})
            requests.append((record["prompt"], record["mm_data"]))
    return requests


def names_only(answer, colour, colours):
    answer = answer.lower()
    return colour in answer and not [c for c in colours if c != colour and c in answer]
