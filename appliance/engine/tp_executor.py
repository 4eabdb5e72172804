"""Tensor parallelism: rank 0 runs in this process, ranks 1..N-1 in spawned worker processes.

Control plane: rank 0 schedules and sends each step's StepInput to every worker over a pipe (workers
block on it, so an idle engine never trips a collective timeout). For multimodal models the StepInput
carries the image embeddings of the step's placeholder rows, computed once on rank 0; text-only steps
carry none. Data plane: the model's own collectives (gloo on CPU, NCCL on CUDA) on a group built
from a TCPStore on a port the OS picks.
A worker that dies is noticed before the next step (liveness check) or inside the forward (the
collective fails or times out); either way the engine raises instead of hanging.
"""
import dataclasses
import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from appliance.config.schema import EngineConfig
from appliance.engine.model_runner import ModelRunner
from appliance.engine.parallel import ParallelState, make_group
from appliance.engine.sampler import SamplerOutput
from appliance.engine.scheduler import SchedulerOutput


STARTUP_TIMEOUT_S = 300.0  # spawning, importing torch and loading weights can be slow


class WorkerDiedError(RuntimeError):
    pass


def rank_device(cfg: EngineConfig, rank: int) -> torch.device:
    device = torch.device(cfg.device)
    return torch.device("cuda", rank) if device.type == "cuda" else device


def worker_main(rank: int, world: int, port: int, model_path: str, cfg: EngineConfig, max_model_len: int,
                timeout_s: float, conn) -> None:
    from transformers import AutoConfig
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = rank_device(cfg, rank)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                              timeout=datetime.timedelta(seconds=max(timeout_s, STARTUP_TIMEOUT_S)))
        conn.send(("connecting", None))  # rank 0 builds its group only now, so slow imports can't time it out
        tp = ParallelState(rank, world, make_group(store, rank, world, device, timeout_s))
        runner = ModelRunner(model_path, AutoConfig.from_pretrained(model_path), cfg, max_model_len, tp, device)
        conn.send(("ready", runner.num_kv_blocks))
        while True:
            step = conn.recv()  # EOF when rank 0 goes away
            if step is None:
                break
            runner.execute(step)
    except EOFError:
        pass
    except Exception:
        conn.send(("error", traceback.format_exc()))
        raise


class TPExecutor:
    def __init__(self, model_path: str, hf_config, cfg: EngineConfig, max_model_len: int,
                 timeout_s: float = 120.0):
        world = cfg.tensor_parallel_size
        self.timeout_s = timeout_s
        self.closed = False
        self.startup_timeout_s = max(timeout_s, STARTUP_TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=self.startup_timeout_s))
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        for rank in range(1, world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, daemon=True, name=f"tp-rank{rank}",
                            args=(rank, world, store.port, model_path, cfg, max_model_len, timeout_s, child))
            p.start()
            self.procs.append(p)
            self.conns.append(parent)
        self.store = store
        for rank, conn in enumerate(self.conns, start=1):
            self._expect(rank, conn, "connecting")
        device = rank_device(cfg, 0)
        try:
            tp = ParallelState(0, world, make_group(store, 0, world, device, timeout_s))
            self.runner = ModelRunner(model_path, hf_config, cfg, max_model_len, tp, device)
        except Exception:
            self.shutdown(graceful=False)  # e.g. heads not divisible by the TP size: no orphans
            raise
        for rank, conn in enumerate(self.conns, start=1):
            payload = self._expect(rank, conn, "ready")
            if payload != self.runner.num_kv_blocks:
                self._fail(f"rank {rank} sized its KV cache to {payload} blocks, rank 0 to "
                           f"{self.runner.num_kv_blocks}")

    def _expect(self, rank: int, conn, what: str):
        """Wait for a start-up message from a worker; a crash or silence becomes a clear error."""
        deadline = time.monotonic() + self.startup_timeout_s
        while not conn.poll(1.0):
            if not self.procs[rank - 1].is_alive() or time.monotonic() > deadline:
                self._fail(f"tensor-parallel rank {rank} did not reach {what!r} "
                           f"(exit code {self.procs[rank - 1].exitcode})")
        try:
            kind, payload = conn.recv()
        except EOFError:
            kind, payload = "exited", f"exit code {self.procs[rank - 1].exitcode}"
        if kind != what:
            self._fail(f"tensor-parallel rank {rank} failed to start:\n{payload}")
        return payload

    @property
    def num_kv_blocks(self) -> int:
        return self.runner.num_kv_blocks

    def check_alive(self) -> None:
        for rank, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                self._fail(f"tensor-parallel worker rank {rank} (pid {p.pid}) died with exit code {p.exitcode}")

    def run(self, out: SchedulerOutput) -> SamplerOutput:
        if self.closed:
            raise WorkerDiedError("the tensor-parallel engine is shut down; create a new one")
        self.check_alive()
        step = self.runner.prepare(out)  # rank 0 also computes the step's image embeddings, if any
        wire = step
        if step.mm_embeds is not None and step.mm_embeds.device.type != "cpu":
            wire = dataclasses.replace(step, mm_embeds=step.mm_embeds.cpu())  # each rank moves them to its device
        try:
            for conn in self.conns:
                conn.send(wire)
            return self.runner.run(step, out)
        except (RuntimeError, OSError) as e:
            self.check_alive()  # prefer naming the dead rank
            self._fail(f"tensor-parallel step failed: {e}")

    def _fail(self, msg: str):
        self.shutdown(graceful=False)
        raise WorkerDiedError(msg + "; the engine is shut down, create a new one")

    def shutdown(self, graceful: bool = True) -> None:
        self.closed = True
        for conn in self.conns if graceful else ():
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(timeout=10 if graceful else 0)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
