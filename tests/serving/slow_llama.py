"""A plugin for server tests: `SlowLlamaForCausalLM`, our Llama that takes at least STEP_S per forward, so
a test can hold a request in the engine for a known time whatever the host's speed. Load it with
`plugins=[tests.serving.slow_llama]` and a checkpoint whose config.json names that architecture."""
import time

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
