"""Engine settings that can never run on this model or host, refused while the config is composed:
`appliance check` (and every other verb) names the constraint in one line before any weight loads. The
rules of a setting alone, or between settings, are on EngineConfig's fields (field_rules.py)."""
import importlib.util
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from appliance.engine.config import EngineKind, Quantization, engine_config_from, quantization_group_sizes
from appliance.errors import ConfigError


def check_engine(cfg) -> None:
    """cfg: the composed AppConfig, its fields' rules checked. `attention_backend=auto` is never refused here:
    it falls back."""
    engine = cfg.engine
    if engine.kind is not EngineKind.generate:
        return
    path = getattr(cfg.model, "path", None)
    if path:
        from appliance.engine.quantized_checkpoint import declared_format, settle_quantization

        fmt = declared_format(str(path))
        engine = settle_quantization(engine_config_from(engine), fmt, str(path))  # as the engine settles it
        if fmt is not None:
            _check_quantized_layers(str(path), fmt, engine.tensor_parallel_size)
        elif engine.quantization is Quantization.int4:
            _check_int4(path, engine)
    backend, device, dtype = engine.attention_backend.value, str(engine.device), engine.dtype.value
    if dtype == "auto":  # what the engine will resolve it to, when the checkpoint declares it
        dtype = _auto_dtype(cfg.model, device)
    if backend == "cpu":
        from appliance.engine.attention_select import cpu_backend_refusal

        why = cpu_backend_refusal(device, None if dtype == "auto" else dtype)
        if why:
            raise ConfigError(f"engine.{why}")
    if backend != "xformers":
        return
    if not device.startswith("cuda"):
        raise ConfigError(f"engine.attention_backend=xformers needs engine.device=cuda (got {device}); "
                          f"use attention_backend=torch or auto")
    from appliance.engine.xformers_plan import config_refusal

    why = config_refusal(engine.block_size, dtype, model_head_dim(cfg.model), _limits())
    if why:
        raise ConfigError(f"engine.attention_backend=xformers cannot run: {why}; fix that or use "
                          f"attention_backend=torch (or auto)")


def _check_int4(path, engine) -> None:
    """The checkpoint's projections against engine.quantization_group_size (and torch's int4 packing)."""
    from appliance.engine.int4_fit import checkpoint_problem

    why = checkpoint_problem(str(path), engine.quantization_group_size, engine.tensor_parallel_size,
                             quantization_group_sizes())
    if why:
        raise ConfigError(f"engine.quantization=int4 cannot hold {why}", param="engine.quantization_group_size")


def _check_quantized_layers(path: str, fmt, tp: int) -> None:
    """A checkpoint quantised already (quantized_checkpoint.py): the layers its format cannot load, and, as
    it runs in its own groups, each rank's share of its projections must hold whole ones."""
    from appliance.engine.int4_fit import split_problem
    from appliance.engine.quantized_checkpoint import a_checkpoint, check_biases

    try:
        fmt.check_layers(path)
        check_biases(path, fmt, _text_config(path))
    except (OSError, ValueError):  # files missing or unreadable: reported where the weights are read
        pass
    why = split_problem(path, fmt, tp)
    if why:
        hint = "; use a smaller engine.tensor_parallel_size" if tp > 1 else ""
        raise ConfigError(f"{path}, {a_checkpoint(fmt)} in groups of {fmt.group_size}, cannot run on "
                          f"engine.tensor_parallel_size={tp}: {why}{hint}", param="engine.tensor_parallel_size")


def _auto_dtype(model, device: str) -> str:
    """engine.dtype=auto as the engine will settle it from the checkpoint (memory_plan's rule); `auto`
    where the host decides (a half precision checkpoint on CPU) or the checkpoint cannot be read yet."""
    from appliance.engine.checkpoint_facts import hf_checkpoint_facts
    from appliance.engine.memory_plan import auto_dtype_without_host

    try:
        own = hf_checkpoint_facts(model.path).dtype if getattr(model, "path", None) else None
    except (OSError, ValueError):  # files missing or unreadable: reported where they are read
        own = None
    settled = auto_dtype_without_host(own, device) if own is not None else None
    return "auto" if settled is None else str(settled).replace("torch.", "")


def model_head_dim(model) -> Optional[int]:
    """The language model's head dim from `model.path`'s config.json (attention_geometry's rule), or None
    when it cannot be read."""
    from appliance.engine.attention_geometry import head_dim_of

    path = getattr(model, "path", None)
    try:
        text = _text_config(path) if path else SimpleNamespace()
    except (OSError, ValueError):
        return None
    try:
        return head_dim_of(text)
    except (AttributeError, TypeError, ZeroDivisionError):  # no head_dim and no hidden size or heads
        return None


def _text_config(path) -> SimpleNamespace:
    """The language model's config from `path`'s config.json (a LLaVA's text_config), as the engine reads
    its fields; OSError or ValueError where it cannot be read."""
    config = json.loads((Path(path) / "config.json").read_text())
    return SimpleNamespace(**((config or {}).get("text_config") or config or {}))


def _limits():
    from appliance.engine.xformers_plan import XFORMERS_0_0_35, XformersLimits

    if importlib.util.find_spec("xformers") is None:
        return XFORMERS_0_0_35  # recorded from 0.0.35, the version this engine was written against
    # Quietly: an xformers whose C++ extension does not load here logs a long warning on import, and
    # a refusal must stay one line (the engine's start-up probe reports what matters at run time).
    log = logging.getLogger("xformers")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from xformers.ops import fmha
    except Exception:  # noqa: BLE001 - e.g. built for another torch: the engine reports it at start
        return XFORMERS_0_0_35
    finally:
        log.setLevel(level)
    return XformersLimits.from_fmha(fmha)

