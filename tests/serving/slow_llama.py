"""A plugin for server tests: `SlowLlamaForCausalLM`, our Llama that takes at least STEP_S per forward, so
a test can hold a request in the engine for a known time whatever the host's speed. Load it with
`plugins=[tests.serving.slow_llama]` and a checkpoint whose config.json names that architecture
(`build_slow_checkpoint`)."""
import json
import time
from pathlib import Path

from appliance.engine.models import MODEL_REGISTRY
from appliance.engine.models.llama import LlamaForCausalLM

STEP_S = 0.01
MODEL_REGISTRY.setdefault("SlowLlamaForCausalLM", (__name__, "SlowLlama"))


class SlowLlama(LlamaForCausalLM):
    def forward(self, *args, **kwargs):
        start = time.perf_counter()
        out = super().forward(*args, **kwargs)
        time.sleep(max(0.0, STEP_S - (time.perf_counter() - start)))
        return out


def build_slow_checkpoint(path) -> str:
    """A small text-only Llama checkpoint (8192 positions, a chat template) that names SlowLlama."""
    from transformers import AutoTokenizer

    from tests.chat.conftest import TEXT_TEMPLATE
    from tests.engine.helpers import build_checkpoint

    model = build_checkpoint(path, max_position_embeddings=8192)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = TEXT_TEMPLATE
    tok.save_pretrained(model)
    config = json.loads((Path(model) / "config.json").read_text())
    config["architectures"] = ["SlowLlamaForCausalLM"]
    (Path(model) / "config.json").write_text(json.dumps(config))
    return model
