"""A plugin for fault tests: `FaultyLlamaForCausalLM`, our Llama whose forward raises when the step's
input holds FAULT_TOKEN (so a test triggers an engine fault with one prompt while others run). Load it
with `plugins=[tests.reliability.faulty_llama]` and a checkpoint whose config.json names it."""
from appliance.engine.models import MODEL_REGISTRY
from appliance.engine.models.llama import LlamaForCausalLM

FAULT_TOKEN = 399  # the tiny test tokenizer's last id: ordinary text never produces it
MODEL_REGISTRY.setdefault("FaultyLlamaForCausalLM", (__name__, "FaultyLlama"))


class FaultyLlama(LlamaForCausalLM):
    def forward(self, input_ids, *args, **kwargs):
        if input_ids is not None and bool((input_ids == FAULT_TOKEN).any()):
            raise RuntimeError(f"injected fault: token {FAULT_TOKEN} in the step's input")
        return super().forward(input_ids, *args, **kwargs)
