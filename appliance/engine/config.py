"""The engine's configuration: a plain dataclass (the `engine` config group's schema) and the two
helpers every engine needs from it. Imports neither Hydra nor torch nor the generation stack, so the
pool engine (and a config tree) can use it alone; `appliance/config/schema.py` re-exports the names."""
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, List, Optional, Tuple

from appliance.field_rules import check_fields, field_rule, rule, unbounded
from appliance.errors import ConfigError

if TYPE_CHECKING:
    import torch


class DType(str, Enum):
    auto = "auto"  # the checkpoint's own, by the rule in memory_plan.py (docs/engine.md)
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class EngineKind(str, Enum):
    generate = "generate"
    pool = "pool"


class Quantization(str, Enum):
    auto = "auto"  # the checkpoint's: int4 for an AWQ or GPTQ one (engine/quantized_checkpoint.py), else none
    none = "none"
    int8 = "int8"  # weights per output channel, quantised at load (engine/int8.py)
    int4 = "int4"  # weights in groups of quantization_group_size inputs, quantised at load (engine/int4.py)


class AttentionBackend(str, Enum):
    auto = "auto"
    torch = "torch"
    cpu = "cpu"
    xformers = "xformers"


@dataclass
class EngineConfig:
    kind: EngineKind = EngineKind.generate
    dtype: DType = DType.auto
    device: str = field(default="cpu", metadata=rule(pattern=r"cpu|cuda(:[0-9]+)?", why="cpu, cuda or cuda:N"))
    tensor_parallel_size: int = field(default=1, metadata=rule(ge=1))
    block_size: int = field(default=16, metadata=rule(ge=1, why="tokens per KV cache block"))
    # KV pool across all layers, per rank; None: from the machine
    kv_cache_memory_bytes: Optional[int] = field(default=None, metadata=rule(ge=1))
    # overrides the budget (tests use it to force preemption)
    num_kv_blocks: Optional[int] = field(default=None, metadata=rule(ge=1))
    # The memory the engine plans within (the host; per card on CUDA); None: what is available now.
    memory_budget_bytes: Optional[int] = field(default=None, metadata=rule(ge=1))
    max_num_batched_tokens: int = field(default=2048, metadata=rule(ge=1, why="tokens one step may compute"))
    max_num_seqs: int = field(default=64, metadata=rule(ge=1, why="sequences one step may run"))
    # defaults to the model's max_position_embeddings
    max_model_len: Optional[int] = field(default=None, metadata=rule(ge=1))
    max_batch_size: int = field(default=8, metadata=rule(ge=1, why="pool mode: items per forward"))
    enable_prefix_caching: bool = True
    # image embeddings kept by content hash (rank 0)
    encoder_cache_bytes: int = field(default=256 * 1024 * 1024, metadata=rule(
        ge=0, why="0: no encoder cache, every request encodes its images again"))
    attention_backend: AttentionBackend = AttentionBackend.auto
    cpu_kernels: bool = True  # our AVX2 GEMM and paged decode attention for fp32 on CPU, where they build
    # CPU flags the dtype and kernel rules treat as absent (e.g. [avx512_bf16, avx512_vnni, amx_bf16]: a newer
    # CPU runs the AVX2 paths, to compare them or to keep off a unit); [] uses all the CPU has.
    cpu_features_off: List[str] = field(default_factory=list)
    quantization: Quantization = Quantization.auto  # int8, int4: the language model's linear layers, at load
    # int4: inputs sharing one scale and zero (torch's int4 kernel takes these; smaller is closer, larger smaller);
    # an AWQ or GPTQ checkpoint's own group size replaces it
    quantization_group_size: int = field(default=128, metadata=rule(
        choices=(32, 64, 128), why="int4: weights per scale and zero"))
    seed: int = field(default=0, metadata=unbounded("any integer seeds the sampler's generators"))

    def __post_init__(self):
        """Choices hold their Enum members, however the config was built (composed, a dict, a test's
        `dtype="bfloat16"`): converted here once, so every reader compares members."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(f.type, type) and issubclass(f.type, Enum) and not isinstance(value, f.type):
                try:
                    setattr(self, f.name, f.type(value))
                except ValueError:
                    raise ValueError(f"engine.{f.name}: {value!r} is not one of "
                                     f"{', '.join(m.value for m in f.type)}") from None
        check_fields(self, EngineConfig, "engine.")  # however built, an engine gets valid settings

    def verify(self) -> None:
        """Rules between fields (check_fields calls it on a composed node too)."""
        if self.kind is not EngineKind.generate and self.quantization not in (Quantization.auto, Quantization.none):
            raise ConfigError(f"engine.quantization={self.quantization.value} applies to a language model "
                              f"(engine.kind=generate); pool models run in engine.dtype", param="engine.quantization")
        if self.quantization is Quantization.int4 and str(self.device).startswith("cuda"):
            raise ConfigError("engine.quantization=int4 runs on CPU (torch's int4 CPU kernel); on CUDA use "
                              "engine.quantization=int8 or none", param="engine.quantization")


def quantization_group_sizes() -> Tuple[int, ...]:
    """The group sizes engine.quantization_group_size allows (its rule), to name where one does not fit."""
    allowed = field_rule(EngineConfig, "quantization_group_size")
    return tuple(int(g) for g in (allowed.choices if allowed and allowed.choices else ()))


def dtype_name(dtype) -> str:
    """A torch dtype's plain name, as settings and logs write it: float32, bfloat16."""
    return str(dtype).replace("torch.", "")


def resolve_dtype(dtype: DType) -> "torch.dtype":
    """The torch dtype of `engine.dtype`. torch is imported here, not with the module: composing a config
    needs this schema but not torch."""
    import torch

    if dtype is DType.auto:
        raise ValueError("engine.dtype=auto names no dtype until the checkpoint is known; the engine "
                         "resolves it (memory_plan.plan_memory) before building the model")
    return getattr(torch, dtype.value)


def engine_config_from(node) -> EngineConfig:
    """An EngineConfig from a dataclass, a plain mapping or an OmegaConf node (the composed `engine`
    group; omegaconf is imported only for one)."""
    if isinstance(node, EngineConfig):
        return node
    if node is None:
        return EngineConfig()
    if isinstance(node, dict):
        return EngineConfig(**node)
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(EngineConfig), node)
    config = OmegaConf.to_object(merged)
    if not isinstance(config, EngineConfig):  # a structured node's object is its dataclass
        raise TypeError(f"the engine group built a {type(config).__name__}, not an EngineConfig")
    return config
