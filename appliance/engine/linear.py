"""Tensor-parallel linear layers. Each parameter carries a `weight_loader` that takes the full
checkpoint tensor and keeps this rank's shard; collectives are visible in `forward`.

Which GEMM multiplies is the engine's kernel plan's choice (kernel_plan.py); the runner applies it once
the weights are loaded. `pack_for_cpu(model, bf16_units)`: each layer's weight is repacked for our GEMM
(bf16 weights for VDPBF16PS or, without bf16 units, for widening on AVX2/FMA) and the [N, K] copy is
freed. `use_bf16_kernel(model, rows)`: steps of those many rows multiply bf16 weights on our few-row GEMM.
`quantize_projections(model, plan)`, first: the decoder's projections keep int8 rows and scales
(engine/int8.py) or int4 groups (engine/int4.py) instead, and packing leaves them be; the int4 groups of a
quantised checkpoint (engine/quantized_checkpoint.py) load into parameters `add_int4_groups` gives the
projections, and are packed as they are. A pool model's plain `nn.Linear` layers take the same plan once
`packable_linears` has swapped them for `PlanLinear`s holding the same parameters."""
from collections import Counter
from typing import Callable, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from appliance.engine import cpu_kernels, hugepages
from appliance.engine.int4 import Int4Plan, Int4Weight, layer_problem
from appliance.engine.int8 import Int8Plan, Int8Weight
from appliance.engine.parallel import ParallelState
from appliance.errors import ConfigError


WEIGHT_LOADER = "weight_loader"  # the parameter attribute load_named_weights calls, where set
INT4_GROUPS = ("group_scales", "group_zeros")  # a projection's int4 groups read from a checkpoint (add_int4_groups)


def set_weight_loader(param: torch.Tensor, loader: Callable[..., None]) -> None:
    """Give `param` the loader that keeps this rank's part of a checkpoint tensor (torch's Parameter
    declares no such attribute, so it is set by name)."""
    setattr(param, WEIGHT_LOADER, loader)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, model expects {tuple(param.shape)}")
    param.data.copy_(loaded)


class PackableLinear(nn.Module):
    """x W^T on torch's GEMM, or on ours once `pack` has repacked W."""

    packed: Optional[cpu_kernels.PackedWeight] = None
    quantized: Optional[Union[Int8Weight, Int4Weight]] = None
    bf16_kernel_rows: range = range(0)  # steps with these many rows run our bf16-weight GEMM (use_bf16_kernel)
    weight: torch.Tensor  # each subclass sets its own Parameter

    def pack(self, out: Optional[torch.Tensor] = None, keep_weight: bool = False, bf16_units: bool = True) -> None:
        self.packed = cpu_kernels.PackedWeight(self.weight.data, out, bf16_units=bf16_units)
        if not keep_weight:
            self.weight.data = torch.empty(0)  # the Parameter (and its name) stays; its memory goes

    def quantize(self, plan: Union[Int8Plan, Int4Plan]) -> Union[Int8Weight, Int4Weight]:
        """The weight as `plan` holds it: quantised now, or, where the checkpoint held int4 groups
        (add_int4_groups), the weight's q with those groups packed as they are."""
        weight = self.weight.data
        groups = {name: p for name, p in self.named_parameters(recurse=False) if name in INT4_GROUPS}
        quantized: Union[Int8Weight, Int4Weight]
        if isinstance(plan, Int8Plan):
            quantized = Int8Weight(weight, plan)
        elif groups:
            scale, zero = (groups[name].data for name in INT4_GROUPS)
            quantized = Int4Weight.from_groups(weight, scale, zero, plan)
        else:
            quantized = Int4Weight(weight, plan)
        self.quantized = quantized
        for param in [self.weight, *groups.values()]:  # the Parameters stay; their memory goes
            param.data = torch.empty(0, device=param.device)
        return quantized

    def matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.quantized is not None:
            return self.quantized.linear(x, bias)
        if self.packed is not None:
            return cpu_kernels.linear(x, self.packed, bias)
        if self.runs_bf16_kernel(x):
            return bf16_weight_linear(x, self.weight, bias)
        return F.linear(x, self.weight, bias)

    def runs_bf16_kernel(self, x: torch.Tensor) -> bool:
        return bool(self.bf16_kernel_rows) and x.numel() // x.shape[-1] in self.bf16_kernel_rows


class PlanLinear(PackableLinear):
    """An `nn.Linear`'s own parameters (the same names in the state dict) behind PackableLinear's matmul."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


def packable_linears(model: nn.Module) -> int:
    """Swap every plain `nn.Linear` in `model` for a PlanLinear (subclasses, e.g. attention modules' output
    projections that their owner reads as parameters, stay); returns how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PlanLinear(child))
                swapped += 1
    return swapped


def bf16_weight_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for a bf16 weight on our CPU kernel: the few rows of x passed as fp32 (a
    few KB), each weight row read once for all of them; the result in x's dtype."""
    shape = x.shape
    y = cpu_kernels.linear_bf16w(x.reshape(-1, shape[-1]).float(), weight).to(x.dtype)
    y = y.reshape(*shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


def use_bf16_kernel(model: nn.Module, rows: range) -> None:
    """Steps with `rows` rows multiply each bf16 weight of `model`'s linear layers (not packed, not
    quantized) on our bf16-weight GEMM (the runner, once, as its kernel plan says)."""
    for m in model.modules():
        if isinstance(m, PackableLinear) and m.packed is None and m.quantized is None \
                and m.weight.dtype == torch.bfloat16 and m.weight.is_contiguous():
            m.bf16_kernel_rows = rows


def pack_for_cpu(model: nn.Module, bf16_units: bool = True) -> None:
    """Pack every PackableLinear's weight, all into one huge-page arena (a decode step streams them
    all); a weight another module also uses (tied embeddings) is kept. bf16 weights multiply on the CPU's
    bf16 units (VDPBF16PS) or, with `bf16_units=False`, widened to fp32 (AVX2/FMA)."""
    layers = [m for m in model.modules() if isinstance(m, PackableLinear) and m.quantized is None]
    dtypes = {m.weight.dtype for m in layers}
    if len(dtypes) > 1:
        raise ValueError(f"pack_for_cpu takes weights of one dtype, got {sorted(map(str, dtypes))}")
    dtype = dtypes.pop() if dtypes else torch.float32
    sizes = [cpu_kernels.PackedWeight.numel(m.weight.shape[0], m.weight.shape[1], dtype) for m in layers]
    # Pages are touched only as each layer is packed into them, and each layer's [N, K] copy is freed
    # after: the peak is the weights plus one layer, not twice the weights.
    arena = hugepages.empty([sum(sizes)], dtype)
    users = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    start = 0
    for m, size in zip(layers, sizes):
        m.pack(arena[start:start + size], keep_weight=users[id(m.weight)] > 1, bf16_units=bf16_units)
        start += size


def quantize_projections(model: nn.Module, plan: Union[Int8Plan, Int4Plan]) -> int:
    """int8 or int4 weights (as `plan` is) for every column- and row-parallel projection (the decoder's;
    the LM head and the embeddings stay in the model's dtype, as vLLM's int8 schemes leave them),
    multiplied as `plan` says. Returns the bytes saved. int4: ConfigError naming the first layer whose
    shape the group size (or torch's kernel) does not fit, and the group sizes that would, before any
    layer is quantised."""
    layers = projections(model)
    if isinstance(plan, Int4Plan):
        check_int4_layers(layers, plan.group_size, plan.group_sizes)
    saved = 0
    for _, m in layers:
        before = m.weight.numel() * m.weight.element_size()
        saved += before - m.quantize(plan).nbytes
    return saved


def projections(model: nn.Module) -> List[Tuple[str, PackableLinear]]:
    """The column- and row-parallel projections of `model` (the decoder's), by name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]


def check_int4_layers(layers: List[Tuple[str, PackableLinear]], group_size: int, group_sizes: Tuple[int, ...]) -> None:
    """ConfigError naming the first layer whose shape groups of `group_size` (or torch's kernel) do not fit,
    and the group sizes that would."""
    for name, m in layers:
        out_features, in_features = m.weight.shape
        problem = layer_problem(name, out_features, in_features, group_size, group_sizes)
        if problem:
            raise ConfigError(f"engine.quantization=int4 cannot hold {problem}", param="engine.quantization_group_size")


def add_int4_groups(model: nn.Module, group_size: int, group_sizes: Tuple[int, ...]) -> None:
    """Give each projection of `model` (built on the meta device, not yet materialized) parameters for the
    int4 groups a quantised checkpoint holds (engine/quantized_checkpoint.py), whose projections' `weight` then holds q
    (0..15, exact in any dtype): `group_scales` and `group_zeros` [out, in / group_size] (this rank's),
    with w = (q - 8) · scale + zero. They load through the layer's own weight loader, fused and sharded
    as the weight is; `quantize` packs them. ConfigError, as `quantize_projections`, for a layer the
    groups do not fit."""
    layers = projections(model)
    check_int4_layers(layers, group_size, group_sizes)
    for _, m in layers:
        out_features, in_features = m.weight.shape
        for name in INT4_GROUPS:
            param = nn.Parameter(torch.empty(out_features, in_features // group_size, device=m.weight.device),
                                 requires_grad=False)
            set_weight_loader(param, getattr(m.weight, WEIGHT_LOADER))  # the weight's: sharded and fused alike
            m.register_parameter(name, param)


class ColumnParallelLinear(PackableLinear):
    """y = x W^T with W split by output rows; each rank returns its slice of y (no collective)."""

    def __init__(self, in_features: int, out_features: int, tp: ParallelState, bias: bool = False):
        super().__init__()
        self.tp = tp
        self.out_local = tp.shard(out_features, "output features")
        self.weight = nn.Parameter(torch.empty(self.out_local, in_features))
        set_weight_loader(self.weight, self.weight_loader)
        self.bias: Optional[nn.Parameter] = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_local))
            set_weight_loader(self.bias, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp.rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections fused into one matmul (e.g. gate_up); shard_id is the index."""

    def __init__(self, in_features: int, output_sizes: List[int], tp: ParallelState, bias: bool = False):
        super().__init__(in_features, sum(output_sizes), tp, bias)
        self.local_sizes = [tp.shard(s, "merged output size") for s in output_sizes]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[int] = None) -> None:
        if shard_id is None:
            raise ValueError("a merged projection loads one part at a time: shard_id says which")
        n = self.local_sizes[shard_id]
        dst = param.data.narrow(0, sum(self.local_sizes[:shard_id]), n)
        dst.copy_(loaded.narrow(0, self.tp.rank * n, n))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; each rank owns whole heads. shard_id is 'q', 'k' or 'v'."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 tp: ParallelState, bias: bool = False):
        self.num_heads = tp.shard(num_heads, "num_attention_heads")
        self.num_kv_heads = tp.shard(num_kv_heads, "num_key_value_heads")
        self.head_dim = head_dim
        super().__init__(hidden, (num_heads + 2 * num_kv_heads) * head_dim, tp, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[str] = None) -> None:
        if shard_id is None:
            raise ValueError("a fused q/k/v projection loads one part at a time: shard_id is 'q', 'k' or 'v'")
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        start, n = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
        param.data.narrow(0, start, n).copy_(loaded.narrow(0, self.tp.rank * n, n))


class RowParallelLinear(PackableLinear):
    """y = x W^T with W split by input columns; partial sums are all-reduced across ranks."""

    def __init__(self, in_features: int, out_features: int, tp: ParallelState, bias: bool = False):
        super().__init__()
        self.tp = tp
        self.in_local = tp.shard(in_features, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))
        set_weight_loader(self.weight, self.weight_loader)
        self.bias: Optional[nn.Parameter] = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features))
            set_weight_loader(self.bias, default_weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.tp.rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x)
        y = self.tp.all_reduce(y)
        # Bias after the reduce, so it is added once rather than once per rank.
        return y if self.bias is None else y + self.bias
