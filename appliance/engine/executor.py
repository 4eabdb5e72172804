"""Runs scheduled steps on the model: in-process for one rank (tensor-parallel executor: tp_executor)."""
from appliance.engine.config import EngineConfig
from appliance.engine.kernel_plan import KernelPlan
from appliance.engine.model_runner import ModelRunner
from appliance.engine.sampler import SamplerOutput
from appliance.engine.scheduler import SchedulerOutput


class LocalExecutor:
    def __init__(self, model_path: str, hf_config, cfg: EngineConfig, max_model_len: int, plan: KernelPlan):
        self.runner = ModelRunner(model_path, hf_config, cfg, max_model_len, plan)

    @property
    def num_kv_blocks(self) -> int:
        return self.runner.num_kv_blocks

    def run(self, out: SchedulerOutput, masks=None) -> SamplerOutput:
        return self.runner.run(self.runner.prepare(out), out, masks)

    def shutdown(self) -> None:
        pass


def check_executor(cfg: EngineConfig) -> None:
    """Refuse a tensor-parallel size this host's cards cannot run, before the engine plans its kernels (their
    probes run on rank 0's card) or loads anything (the settings' own ranges hold: EngineConfig checks them)."""
    if cfg.tensor_parallel_size > 1:
        from appliance.engine.tp_executor import check_cards
        check_cards(cfg.device, cfg.tensor_parallel_size)


def make_executor(model_path: str, hf_config, cfg: EngineConfig, max_model_len: int, plan: KernelPlan,
                  tp_timeout_s: float):
    """The executor of a config `check_executor` passed."""
    if cfg.tensor_parallel_size == 1:
        return LocalExecutor(model_path, hf_config, cfg, max_model_len, plan)
    from appliance.engine.tp_executor import TPExecutor
    return TPExecutor(model_path, hf_config, cfg, max_model_len, plan, tp_timeout_s)
