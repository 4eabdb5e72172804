"""Checkpoints for the reliability servers: the engine tests' tiny random Llama with a chat template,
optionally renamed to a test architecture registered by a plugin."""
import json
from pathlib import Path

from tests.chat.conftest import TEXT_TEMPLATE


def text_llama(path, architecture=None, **config):
    from transformers import AutoTokenizer

    from tests.engine.helpers import build_checkpoint

    model = build_checkpoint(path, **config)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = TEXT_TEMPLATE
    tok.save_pretrained(model)
    if architecture:
        cfg = json.loads((Path(model) / "config.json").read_text())
        cfg["architectures"] = [architecture]
        (Path(model) / "config.json").write_text(json.dumps(cfg))
    return model


def overrides(model, *extra):
    return ["pipeline=llava_chat", f"model.path={model}", "model.name=tiny", "model.architecture=LlamaForCausalLM",
            "model.vision_language=null", *extra]
