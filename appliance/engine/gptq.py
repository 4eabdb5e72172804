"""GPTQ checkpoints (4-bit, as AutoGPTQ and GPTQModel publish them and vLLM loads them): the format's
config and its layers' packing and formula (quantized_checkpoint.py reads them as int4 weights).

config.json declares `quantization_config: {"quant_method": "gptq", "bits": 4, "group_size": G,
"desc_act": bool, "sym": bool}`, with `"checkpoint_format": "gptq_v2"` where the zeros are stored as they
are (GPTQModel's `"lm_head": true`, a quantised LM head, is refused). Each quantised linear X holds
`X.qweight` int32 [K/8, N] (packed along the inputs: nibble j, bits 4j..4j+3, of qweight[i, n] is
q[8i + j, n]), `X.qzeros` int32 [K/G, N/8] (packed along the outputs: nibble j of qzeros[g, c] is column
8c + j), `X.scales` fp16 [K/G, N] and `X.g_idx` int32 [K], the group of each input (AutoGPTQ's exports
add `X.bias`, all zeros where the model has none: quantized_checkpoint.py drops it).
w[k, n] = (q[k, n] - z[g, n]) · s[g, n] with g = g_idx[k], where the zero z is the stored nibble + 1 in
the common format (AutoGPTQ stores z - 1) and the stored nibble in gptq_v2; a symmetric
checkpoint stores z = 8 like any other.

Groups must follow the inputs (g_idx[k] = k // G), as torch's int4 kernel reads them: a checkpoint
quantised in activation order (desc_act, unless its groups were fixed first) is refused by name, by
`check` from the g_idx tensors alone and again as each layer loads.
A layer becomes torch's int4 convention (w = (q - 8) · scale + zero) as AWQ's does: scale = s and
zero = (8 - z) · s, exact in fp32.
"""
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import torch

from appliance.engine.int4 import MIDPOINT
from appliance.engine.safetensors_files import iter_weights
from appliance.errors import ConfigError

CHECKPOINT_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> what to add to a stored zero


@dataclass(frozen=True)
class GptqFormat:
    group_size: int  # inputs sharing a scale and a zero
    zero_offset: int  # added to each stored zero: 1 (AutoGPTQ's z - 1) or 0 (gptq_v2)
    where: str  # the config's quantization_config, named where a layer is refused
    desc_act: bool = False
    name: str = "GPTQ"
    parts: Tuple[str, ...] = ("qweight", "qzeros", "scales", "g_idx")

    def dense_shape(self, qweight_shape: Sequence[int]) -> Tuple[int, int]:
        """[N, K] of the nn.Linear weight a layer's qweight [K/8, N] holds."""
        return int(qweight_shape[1]), int(qweight_shape[0]) * 8

    def int4_groups(self, layer: str, parts: Dict[str, torch.Tensor]
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer `layer`'s (q [N, K], scale [N, K/G], zero [N, K/G]) in torch's int4 convention, fp32
        (exact); ValueError naming a part of the wrong shape, ConfigError for groups out of input order."""
        qweight, qzeros, scales, g_idx = (parts[p] for p in self.parts)
        n, k = self.dense_shape(qweight.shape)
        g = self.group_size
        expected = {"qweight": (k // 8, n), "qzeros": (k // g, n // 8), "scales": (k // g, n), "g_idx": (k,)}
        for part in self.parts:
            if tuple(parts[part].shape) != expected[part] or k % g:
                raise ValueError(f"{layer}.{part} has shape {tuple(parts[part].shape)}; GPTQ in groups of {g} "
                                 f"with qweight {tuple(qweight.shape)} needs {expected[part]}")
        self._check_order(layer, g_idx)
        shifts = torch.arange(0, 32, 4, dtype=torch.int32)  # nibble j of an int32: bits 4j..4j+3
        q = ((qweight[:, None, :] >> shifts[:, None]) & 0xF).reshape(k, n)  # row 8i + j: nibble j
        z = ((qzeros[..., None] >> shifts) & 0xF).reshape(k // g, n) + self.zero_offset  # column 8c + j
        scale = scales.float()
        zero = (MIDPOINT - z) * scale
        return q.t(), scale.t(), zero.t()

    def check_layers(self, path: str) -> None:
        """ConfigError for a layer whose groups do not follow its inputs, read from the g_idx tensors of
        the checkpoint at `path` (not its weights): only where desc_act says they may not."""
        if self.desc_act:
            for name, g_idx in iter_weights(path, keep=lambda name: name.endswith(".g_idx")):
                self._check_order(name.rsplit(".", 1)[0], g_idx)

    def _check_order(self, layer: str, g_idx: torch.Tensor) -> None:
        if not torch.equal(g_idx.long(), torch.arange(g_idx.numel()) // self.group_size):
            raise ConfigError(f"{self.where}.desc_act={self.desc_act}: {layer}.g_idx puts inputs in groups out of "
                              f"input order (activation order); only GPTQ whose groups follow the inputs loads",
                              param="model.path")


def gptq_format(quant: dict, where: str, group_size: int) -> GptqFormat:
    """The GPTQ format `quant` (a config.json's quantization_config, at `where`; its bits and group size
    checked already) declares; ConfigError naming the field this engine cannot load."""
    layout = str(quant.get("checkpoint_format", "gptq")).lower()
    if layout not in CHECKPOINT_FORMATS:
        raise ConfigError(f"{where}.checkpoint_format={quant.get('checkpoint_format')}: only GPTQ's own layouts "
                          f"load ({' or '.join(CHECKPOINT_FORMATS)})", param="model.path")
    if quant.get("lm_head", False):
        raise ConfigError(f"{where}.lm_head={quant.get('lm_head')}: only the decoder's projections load quantised "
                          f"(an LM head in GPTQ does not)", param="model.path")
    return GptqFormat(group_size, CHECKPOINT_FORMATS[layout], where, bool(quant.get("desc_act", False)))
