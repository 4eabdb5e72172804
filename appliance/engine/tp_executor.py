"""Tensor parallelism: rank 0 runs in this process, ranks 1..N-1 in spawned worker processes.

Control plane: rank 0 schedules and sends each step's StepInput to every worker over a pipe (workers
block on it, so an idle engine never trips a collective timeout). For multimodal models the StepInput
carries the image embeddings of the step's placeholder rows, computed once on rank 0; text-only steps
carry none. Data plane: the model's own collectives (gloo on CPU, NCCL on CUDA, both bounded by the
timeout) on a group built from a TCPStore on a port the OS picks. Rank r of an engine on `cuda:N`
uses card N + r.

Failures: a worker that raises, at start-up or in any step, sends its traceback up its pipe and exits
at once (so the peers' collectives fail instead of waiting). Rank 0 looks at the pipes before each
step and whenever a step fails; on CUDA, where the forward only queues work, it also waits for the
step's kernels while watching the workers, and aborts the NCCL group if one failed. Either way the
engine raises RankDiedError naming the rank and its error, within the timeout.
"""
import dataclasses
import datetime
import os
import sys
import time
import traceback
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from appliance.engine.config import EngineConfig
from appliance.engine.kernel_plan import KernelPlan
from appliance.engine.model_runner import ModelRunner
from appliance.engine.models import MODEL_REGISTRY, model_architecture
from appliance.engine.parallel import ParallelState, make_group, rank_device
from appliance.engine.sampler import SamplerOutput
from appliance.engine.scheduler import SchedulerOutput


STARTUP_TIMEOUT_S = 300.0  # spawning, importing torch and loading weights can be slow
REPORT_WAIT_S = 2.0  # after a failed collective, how long a worker's own report may take to arrive


class RankDiedError(RuntimeError):
    pass


def rank_main(rank: int, world: int, port: int, model_path: str, cfg: EngineConfig, max_model_len: int,
                plan: KernelPlan, timeout_s: float, conn, model_entry=None) -> None:
    from transformers import AutoConfig

    try:
        if model_entry is not None:  # an architecture a plugin registered in rank 0's process only
            MODEL_REGISTRY.setdefault(*model_entry)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = rank_device(torch.device(cfg.device), rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # current-device work (Triton launches, NCCL) on this rank's card
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                              timeout=datetime.timedelta(seconds=max(timeout_s, STARTUP_TIMEOUT_S)))
        conn.send(("connecting", None))  # rank 0 builds its group only now, so slow imports can't time it out
        tp = ParallelState(rank, world, make_group(store, rank, world, device, timeout_s))
        runner = ModelRunner(model_path, AutoConfig.from_pretrained(model_path), cfg, max_model_len, plan, tp,
                             device)
        conn.send(("ready", runner.num_kv_blocks))
        while True:
            step = conn.recv()  # EOF when rank 0 goes away
            if step is None:
                break
            runner.execute(step)
    except EOFError:
        pass
    except BaseException:  # noqa: BLE001 - reported to rank 0, then this process exits
        report = traceback.format_exc()
        print(f"tensor-parallel rank {rank} failed:\n{report}", file=sys.stderr, flush=True)
        try:
            conn.send(("error", report))
        finally:
            # Exit now, skipping clean-up that could wait on a collective: the peers' collectives fail
            # at once (gloo) and rank 0 is not left waiting for this rank.
            os._exit(1)


def _summary(report: str) -> str:
    """The exception line of a formatted traceback."""
    lines = [line for line in report.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no traceback"


class TPExecutor:
    def __init__(self, model_path: str, hf_config, cfg: EngineConfig, max_model_len: int, plan: KernelPlan,
                 timeout_s: float = 120.0):
        world = cfg.tensor_parallel_size
        device = rank_device(torch.device(cfg.device), 0)
        self.timeout_s = timeout_s
        self.closed = False
        self.startup_timeout_s = max(timeout_s, STARTUP_TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=self.startup_timeout_s))
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        arch = model_architecture(None, hf_config, model_path)
        entry = (arch, MODEL_REGISTRY[arch]) if arch in MODEL_REGISTRY else None
        for rank in range(1, world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=rank_main, daemon=True, name=f"tp-rank{rank}",
                            args=(rank, world, store.port, model_path, cfg, max_model_len, plan, timeout_s, child,
                                  entry))
            p.start()
            self.procs.append(p)
            self.conns.append(parent)
        self.store = store
        for rank, conn in enumerate(self.conns, start=1):
            self._expect(rank, conn, "connecting")
        try:
            # Rank 0 lives in the caller's process: its runner scopes CUDA work to its card instead of
            # calling torch.cuda.set_device, which would change the caller's current device.
            tp = ParallelState(0, world, make_group(store, 0, world, device, timeout_s))
            self.runner = ModelRunner(model_path, hf_config, cfg, max_model_len, plan, tp, device)
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

    def check_ranks(self, wait_s: float = 0.0) -> None:
        """Raise RankDiedError if a worker reported an error or died (waiting up to `wait_s` for a
        report that may still be on its way)."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, (conn, p) in enumerate(zip(self.conns, self.procs), start=1):
                report = self._report(conn)
                if report is not None:
                    self._fail(f"tensor-parallel rank {rank} failed: {_summary(report)}", report)
                if not p.is_alive():
                    self._fail(f"tensor-parallel worker rank {rank} (pid {p.pid}) died with exit code {p.exitcode}")
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    @staticmethod
    def _report(conn):
        """A worker's error report, if one is waiting in its pipe (workers send nothing else after start-up)."""
        try:
            if not conn.poll():
                return None
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return None  # the pipe closed without a report: the liveness check names the exit code
        return payload if kind == "error" else None

    def run(self, out: SchedulerOutput, masks=None) -> SamplerOutput:
        if self.closed:
            raise RankDiedError("the tensor-parallel engine is shut down; create a new one")
        self.check_ranks()
        step = self.runner.prepare(out)  # rank 0 also computes the step's image embeddings, if any
        wire = step
        if step.mm_embeds is not None and step.mm_embeds.device.type != "cpu":
            wire = dataclasses.replace(step, mm_embeds=step.mm_embeds.cpu())  # each rank moves them to its device
        deadline = time.monotonic() + self.timeout_s
        try:
            for conn in self.conns:
                conn.send(wire)
            logits = self.runner.execute(step)
            self._await_device(deadline)
            return self.runner.sample(logits, out, masks)
        except RankDiedError:
            raise
        except (RuntimeError, OSError) as e:
            self.check_ranks(REPORT_WAIT_S)  # prefer the worker's own error, or naming the dead rank
            self._fail(f"tensor-parallel step failed: {e}")

    def _await_device(self, deadline: float) -> None:
        """On CUDA the forward only queued its kernels, NCCL's among them: wait for them here while
        watching the workers, rather than block in the sampler's copy until NCCL's own timeout (whose
        watchdog may end this whole process instead of raising)."""
        if self.runner.device.type != "cuda":
            return  # gloo collectives ran on the host: a failed peer already raised in the forward
        with self.runner.on_device():
            done = torch.cuda.Event()
            done.record()
        if not wait_watching(done.query, self.check_ranks, deadline):
            self._fail(f"tensor-parallel step did not finish within {self.timeout_s:g} s")

    def _fail(self, msg: str, report: str = "") -> NoReturn:
        runner = getattr(self, "runner", None)  # absent while starting up
        if runner is not None and runner.device.type == "cuda" and runner.tp.group is not None:
            try:
                runner.tp.group.abort()  # frees rank 0's stream from a collective whose peer is gone
            except Exception:  # noqa: BLE001 - already broken: the shutdown below is what matters
                pass
        self.shutdown(graceful=False)
        detail = f"\nworker traceback:\n{report}" if report else ""
        raise RankDiedError(msg + "; the engine is shut down, create a new one" + detail)

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


def wait_watching(finished, check, deadline: float, check_every_s: float = 0.01) -> bool:
    """Poll `finished()` until it is true (returns True) or the monotonic `deadline` passes (False),
    calling `check()` (which raises on a failed worker) every `check_every_s`."""
    last_check = time.monotonic()
    while not finished():
        now = time.monotonic()
        if now - last_check >= check_every_s:
            check()
            last_check = now
        if now > deadline:
            return False
        time.sleep(0.0002)
    return True


def check_cards(name: str, world: int) -> None:
    """engine.device=`name` with `world` ranks needs that many cards from its first (CUDA only)."""
    device = rank_device(torch.device(name), 0)
    if device.type != "cuda":
        return
    count = torch.cuda.device_count()
    last = rank_device(device, world - 1).index
    if last >= count:
        raise ValueError(f"engine.device={name} with tensor_parallel_size={world} needs cards "
                         f"cuda:{device.index}..cuda:{last}, but this host has {count}; lower the first card "
                         f"or tensor_parallel_size")
