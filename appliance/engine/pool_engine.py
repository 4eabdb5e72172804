"""Pool mode: the engine API for non-generative models (no KV cache, no sampling).

A request carries N items (a tensor [N, ...] or a list of same-shaped tensors, e.g. image tiles
[C, H, W]), and optionally the coordinates its items share (`GeoCoords`: a scene's date and centre, for
models with time and location encodings). Each step stacks up to `max_batch_size` items, FCFS across
requests, with their coordinates, runs one forward and scatters the rows back; a request finishes when
all its items have run.

Which kernel multiplies the model's linear layers is the engine's kernel plan's choice
(`kernel_plan.plan_pool_kernels`), built once from the host (less `engine.cpu_features_off`) and the
config, logged in one line, and applied to the model before any request: its plain `nn.Linear` layers
made packable and packed for our GEMM where the plan says.
"""
import dataclasses
import itertools
import logging
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from appliance.engine.config import DType, EngineConfig, EngineKind, dtype_name, engine_config_from, resolve_dtype
from appliance.engine.geo_coords import GeoCoords, batch_coords, coords_kind
from appliance.engine.host import Host
from appliance.engine.kernel_plan import KernelPlan, plan_pool_kernels
from appliance.engine.linear import pack_for_cpu, packable_linears, use_bf16_kernel
from appliance.engine.model_fit import engine_host, pool_fit
from appliance.engine.outputs import PoolOutput

log = logging.getLogger(__name__)


class PoolRequest:
    def __init__(self, request_id: str, items: List[torch.Tensor], coords: Optional[GeoCoords] = None):
        self.request_id = request_id
        self.items = items
        self.coords = coords  # shared by every item (the tiles of one scene)
        self.outputs: List[Optional[torch.Tensor]] = [None] * len(items)
        self.next_item = 0  # items before this one have been scheduled

    @property
    def done(self) -> bool:
        return all(o is not None for o in self.outputs)

    def stacked_outputs(self) -> torch.Tensor:
        """[N, ...]: every item's output, once `done`."""
        outputs = [o for o in self.outputs if o is not None]
        if len(outputs) != len(self.outputs):
            raise RuntimeError(f"pool request {self.request_id} has items still running")
        return torch.stack(outputs)


def plan_batch(queue: Sequence[PoolRequest], max_batch_size: int) -> List[Tuple[PoolRequest, int]]:
    """Pick the next items FCFS, at most `max_batch_size`, all shaped like the first one picked and carrying
    the same kind of coordinates (a batch must stack); other items wait for a later step."""
    batch: List[Tuple[PoolRequest, int]] = []
    key = None
    for req in queue:
        for i in range(req.next_item, len(req.items)):
            if len(batch) == max_batch_size:
                return batch
            item_key = (req.items[i].shape, coords_kind(req.coords))
            if key is None:
                key = item_key
            if item_key != key:
                return batch  # keep FCFS order: do not skip past a different item
            batch.append((req, i))
    return batch


class PoolEngine:
    def __init__(self, model: nn.Module, engine_config: Optional[EngineConfig] = None, host: Optional[Host] = None):
        """`host`: the machine the kernel rules decide for (default: this one, read now)."""
        cfg = engine_config_from(engine_config)
        if cfg.tensor_parallel_size != 1:
            raise ValueError(f"engine.tensor_parallel_size={cfg.tensor_parallel_size}: pool mode runs a model "
                             f"on one device (no tensor parallelism); set it to 1")
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        if cfg.dtype is DType.auto:  # a model given built: its own dtype
            self.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        else:
            self.dtype = resolve_dtype(cfg.dtype)
        self.model = model.to(self.device, self.dtype).eval()
        host = engine_host(cfg, host)
        if cfg.cpu_features_off:
            log.info("CPU features treated as absent (engine.cpu_features_off): %s", " ".join(cfg.cpu_features_off))
        self.kernels = plan_pool_kernels(dataclasses.replace(cfg, dtype=DType(dtype_name(self.dtype))), host)
        log.info("%s", self.kernels.describe())
        apply_kernels(self.model, self.kernels)
        self.queue: Deque[PoolRequest] = deque()
        self.requests: Dict[str, PoolRequest] = {}
        self.ids = itertools.count()
        self.num_forwards = 0

    @classmethod
    def from_config(cls, app_cfg, host: Optional[Host] = None) -> "PoolEngine":
        """Build the registered model for `model.architecture` with its `from_config(model, engine)`, in
        the dtype `plan_memory` settles (or refused before loading when it cannot fit); `host`: the
        machine to size for (default: this one)."""
        from appliance.engine.models import get_model_class, model_architecture
        cfg = engine_config_from(app_cfg.engine)
        if cfg.kind is not EngineKind.pool:
            raise ValueError("PoolEngine serves engine.kind=pool; use LLMEngine for kind=generate")
        model_cls = get_model_class(model_architecture(app_cfg.model.architecture), EngineKind.pool)
        model = app_cfg.model
        host = engine_host(cfg, host)
        plan = pool_fit(cfg, model, host)
        if plan is not None:
            cfg = dataclasses.replace(cfg, dtype=DType(plan.dtype_name))
            log.info("engine.dtype: %s (%s)", plan.dtype_name, plan.dtype_reason)
        elif cfg.dtype is DType.auto:
            cfg = dataclasses.replace(cfg, dtype=DType.float32)  # no checkpoint to read: the model's own rule
        return cls(model_cls.from_config(model, cfg), cfg, host)

    def add_request(self, items: Union[torch.Tensor, List[torch.Tensor]], request_id: Optional[str] = None,
                    coords: Optional[GeoCoords] = None) -> str:
        """Queue `items`; `coords`: the coordinates they share, passed to the model with each of them."""
        items = list(items.unbind(0)) if isinstance(items, torch.Tensor) else list(items)
        if not items:
            raise ValueError("a pool request needs at least one item")
        request_id = str(next(self.ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = PoolRequest(request_id, items, coords)
        self.requests[request_id] = req
        self.queue.append(req)
        return request_id

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and req in self.queue:
            self.queue.remove(req)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> List[PoolOutput]:
        batch = plan_batch(self.queue, self.cfg.max_batch_size)
        if not batch:
            return []
        for req, i in batch:
            req.next_item = i + 1
        while self.queue and self.queue[0].next_item == len(self.queue[0].items):
            self.queue.popleft()  # fully scheduled; outputs are filled below
        outputs = self._run(torch.stack([req.items[i] for req, i in batch]),
                            batch_coords([req.coords for req, _ in batch], self.device))
        finished = []
        for (req, i), out in zip(batch, outputs):
            req.outputs[i] = out
            if req.done and req.request_id in self.requests:
                del self.requests[req.request_id]
                finished.append(PoolOutput(req.request_id, req.stacked_outputs(), True, "done"))
        return finished

    @torch.inference_mode()
    def _run(self, x: torch.Tensor, coords: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        x = x.to(self.device, self.dtype if x.is_floating_point() else x.dtype)
        self.num_forwards += 1
        return self.model(x, **(coords or {})).cpu()

    def close(self) -> None:
        """Nothing to release (no worker processes); present so both engines close alike."""

    def encode(self, inputs: List[Union[torch.Tensor, List[torch.Tensor]]]) -> List[torch.Tensor]:
        """Run every request to completion; outputs ([N, ...] each) in input order."""
        ids = [self.add_request(x) for x in inputs]
        done: Dict[str, torch.Tensor] = {}
        while self.has_unfinished():
            for out in self.step():
                if out.output is None:
                    raise RuntimeError(f"pool request {out.request_id} finished without an output")
                done[out.request_id] = out.output
        return [done[i] for i in ids]


def apply_kernels(model: nn.Module, plan: KernelPlan) -> None:
    """Make `model`'s linear layers take `plan`'s GEMM (as a generate engine's runner applies its plan)."""
    if not (plan.packed_gemm or plan.bf16_weight_rows) or not packable_linears(model):
        return
    if plan.packed_gemm:
        pack_for_cpu(model, plan.bf16_units)
    if plan.bf16_weight_rows:
        use_bf16_kernel(model, plan.bf16_weight_rows)
