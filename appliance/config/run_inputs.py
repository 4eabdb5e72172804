"""The run record: what `appliance run` hands its pipeline's first stage, from the config's per-run keys
(`pipeline.inputs`). `run` runs it; `check`, `run` and their preflight (`Pipeline.preflight`) check it."""
from typing import Any

from omegaconf import OmegaConf

from appliance.pipeline import Record


def run_record(cfg: Any) -> Record:
    """Each key the pipeline takes, as plain Python values: stages see lists as lists, not OmegaConf nodes."""
    return {key: OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
            for key, value in ((key, cfg.get(key)) for key in cfg.pipeline.inputs)}


def names_a_run(record: Record) -> bool:
    """Whether the run record sets any key (`overwrite=true` included): `appliance check` without one checks
    a config to serve, and has no run's inputs to check."""
    return any(value not in (None, False) for value in record.values())
