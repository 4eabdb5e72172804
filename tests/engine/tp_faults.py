"""Worker entry points for the tensor-parallel failure tests: `rank_main` with a fault injected in
the spawned process (a monkeypatch in the test's process does not reach it)."""
import itertools

from appliance.engine.model_runner import ModelRunner
from appliance.engine.parallel import ParallelState
from appliance.engine.tp_executor import rank_main


def _fail_on_call(cls, name: str, n: int, rank: int) -> None:
    original, calls = getattr(cls, name), itertools.count(1)

    def failing(self, *args, **kwargs):
        call = next(calls)
        if call == n:
            raise RuntimeError(f"injected fault: {cls.__name__}.{name} call {call} on rank {rank}")
        return original(self, *args, **kwargs)

    setattr(cls, name, failing)


def worker_raising_before_step_3(rank, *args):
    """Raises as its 3rd step starts: rank 0 is then waiting in that step's first collective."""
    _fail_on_call(ModelRunner, "execute", 3, rank)
    rank_main(rank, *args)


def worker_raising_mid_forward(rank, *args):
    """Raises at its 7th all-reduce: inside the forward of the second step, after some collectives."""
    _fail_on_call(ParallelState, "all_reduce", 7, rank)
    rank_main(rank, *args)
