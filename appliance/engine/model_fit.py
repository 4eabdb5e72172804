"""Whether a model fits this machine, in which dtype and with which KV budget: memory_plan's rule applied
to the model's files (config.json and the safetensors headers, never the weights). The engines build with
these plans, and the engine stage's `check` asks the same functions, so `appliance check` and `run`
refuse a model that cannot fit with the engine's own line before any weight loads."""
from typing import Optional, Tuple

from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.checkpoint_facts import hf_checkpoint_facts, model_checkpoint_facts
from appliance.engine.config import EngineConfig
from appliance.engine.host import Host
from appliance.engine.memory_plan import MemoryPlan, plan_memory


def max_model_len(text_config, requested: Optional[int]) -> int:
    """Tokens a sequence may hold: `requested` (engine.max_model_len), else the model's limit, which is
    `max_position_embeddings` capped by a sliding window (no sliding-window attention here: staying
    within the window keeps results exact). ValueError when `requested` exceeds the limit."""
    limit = text_config.max_position_embeddings
    window = getattr(text_config, "sliding_window", None)
    if window:
        limit = min(limit, window)
    if requested and requested > limit:
        raise ValueError(f"engine.max_model_len={requested} exceeds the model's limit {limit}")
    return requested or limit


def engine_host(cfg: EngineConfig, host: Optional[Host] = None) -> Host:
    """The machine an engine sizes for: `host` (default: this one, read now) less engine.cpu_features_off."""
    return (host or Host.read(cfg.device)).without(cfg.cpu_features_off)


def generate_fit(cfg: EngineConfig, model_path: str, hf_config, host: Host,
                 max_len: int) -> Tuple[MemoryPlan, AttentionGeometry]:
    """A language model's plan (ConfigError when it cannot fit) and one rank's attention geometry;
    `hf_config`: its transformers config (or text config), `max_len`: its context (max_model_len)."""
    geometry = AttentionGeometry.of(hf_config, cfg.tensor_parallel_size, cfg.block_size)
    plan = plan_memory(cfg, hf_checkpoint_facts(model_path), host, f"model {model_path}", geometry, max_len)
    return plan, geometry


def pool_fit(cfg: EngineConfig, model_cfg, host: Host) -> Optional[MemoryPlan]:
    """A pooling model's plan (weights only; ConfigError when they cannot fit), or None for a model built
    from its config alone (no `model.checkpoint` or `model.path` to read)."""
    source = getattr(model_cfg, "checkpoint", None) or getattr(model_cfg, "path", None)
    if not source:
        return None
    return plan_memory(cfg, model_checkpoint_facts(model_cfg), host, f"model {source}")
