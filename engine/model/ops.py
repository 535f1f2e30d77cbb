"""The forward and backward operations the model is built from, by the names model code calls.

Each op is a pure function `op_forward(...) -> (out, cache)` in the style of llm.c: `cache` (a
named tuple) holds the activations a matching `op_backward(dout, cache, ...)` needs, so that
training code can pair them; inference simply drops it. Caches never hold weights: a backward is
given the weights it needs (llm.c's `matmul_backward(..., weight, ...)`), so the weight store may
drop a dequantized layer between its forward and its backward.

Weights are NumPy arrays, or the weight store's lazy views: an expert stack is anything indexable
by expert id giving that expert's (n_out, n_in) matrix; the embedding and the output head accept a
view with `take_rows(ids)` and `row_chunks()`, so that a large vocabulary is dequantized a block of
rows at a time. Shapes use the house vocabulary (B batch, T tokens, C channels, NH/NKV heads, HS
head size, E experts, K experts per token, F ffn width, r LoRA rank). The functions work in
whatever float dtype they are given (float32 in use, float64 in tests).

The implementations live in `engine.kernels.<op>`: each `<op>_ref` there is the NumPy reference,
the specification of the op (one per op: an architecture's variant is an argument of it, never a
copy), `<op>_on(rt, ...)` its CUDA twin on a kernels `Runtime`, and where it has one a CPU twin
(`engine.kernels.<op>_cpu`: the MoE experts on CPU workers, and compiled kernels through numba,
engine.kernels.jit, which run the reference where numba is missing). The table below names them
for every op, so that an editor goes from `ops.rmsnorm_forward` to its definitions in one step.
Within `use_runtime(rt)` (what `Backend.active()` enters on a GPU) every op runs its CUDA twin on
that runtime; outside one, an op runs its CUDA twin on the GPU runtime when its first argument is a
CuPy array (on that array's device), and otherwise its CPU twin where it has one, else the
reference. An op whose CUDA twin is not written yet (None in the table) raises EngineError naming
it, rather than running on the host behind the user's back; a twin that lacks one of the
reference's options refuses it by name. This module knows no GGUF names and holds no state (the
runtime of this thread is engine.kernels.runtime's); `engine.model.layers` and
`engine.model.forward` wire the ops into models.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..errors import EngineError
from ..kernels import adamw as _adamw
from ..kernels import adamw_cpu as _adamw_cpu
from ..kernels import attention as _attention
from ..kernels import attention_cpu as _attention_cpu
from ..kernels import cross_entropy as _cross_entropy
from ..kernels import cross_entropy_cpu as _cross_entropy_cpu
from ..kernels import dequant as _dequant
from ..kernels import dequant_cpu as _dequant_cpu
from ..kernels import embedding as _embedding
from ..kernels import glu as _glu
from ..kernels import glu_cpu as _glu_cpu
from ..kernels import linear as _linear
from ..kernels import linear_cpu as _linear_cpu
from ..kernels import mla as _mla
from ..kernels import moe as _moe
from ..kernels import moe_cpu as _moe_cpu
from ..kernels import moe_cuda as _moe_cuda
from ..kernels import norm as _norm
from ..kernels import norm_cpu as _norm_cpu
from ..kernels import rope as _rope
from ..kernels import rope_cpu as _rope_cpu
from ..kernels.attention import AttentionCache, attention_mask
from ..kernels.cross_entropy import SoftcapCache, softmax
from ..kernels.embedding import EmbeddingCache, row_chunks, scatter_add_rows, take_rows
from ..kernels.glu import GluCache, sigmoid, silu
from ..kernels.linear import LinearCache, LoraTerm
from ..kernels.mla import MlaKvCache
from ..kernels.moe import ExpertActs, ExpertsCache, RouteCache, Routing
from ..kernels.norm import NormCache
from ..kernels.rope import RopeCache, rope_angles
from ..kernels.runtime import current_runtime, runtime_for, use_runtime


def _op(reference: Callable, twin_on: Callable | None, cpu: Callable | None = None) -> Callable:
    """One op of the table: `reference` (`<op>_ref`, NumPy), `twin_on` (`<op>_on(rt, ...)`, its CUDA
    twin on a runtime, or None when there is none yet) and `cpu`, its CPU twin where it has one; the
    module docstring says which one runs."""
    name = reference.__name__.removesuffix("_ref")
    on_host = cpu or reference

    @functools.wraps(reference)
    def op(*args, **kwargs):
        rt = current_runtime()
        on_gpu_arrays = rt is None and bool(args) and type(args[0]).__module__.startswith("cupy")
        if rt is None and not on_gpu_arrays:
            return on_host(*args, **kwargs)
        if twin_on is None:
            raise EngineError(f"{reference.__module__}.{name} has no CUDA version yet")
        if rt is not None:
            return twin_on(rt, *args, **kwargs)
        with args[0].device:
            return twin_on(runtime_for(args[0], name), *args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.reference = reference  # type: ignore[attr-defined]
    op.twin_on = twin_on  # type: ignore[attr-defined]
    op.cpu = cpu  # type: ignore[attr-defined]
    return op


# every op: its NumPy reference, its CUDA twin on a runtime (and its CPU twin where it has one: compiled
# kernels through numba, engine.kernels.jit, each running the reference where numba is missing)
embedding_forward = _op(_embedding.embedding_forward_ref, _embedding.embedding_forward_on)
embedding_backward = _op(_embedding.embedding_backward_ref, _embedding.embedding_backward_on)
rmsnorm_forward = _op(_norm.rmsnorm_forward_ref, _norm.rmsnorm_forward_on, _norm_cpu.rmsnorm_forward_cpu)
rmsnorm_backward = _op(_norm.rmsnorm_backward_ref, _norm.rmsnorm_backward_on, _norm_cpu.rmsnorm_backward_cpu)
linear_forward = _op(_linear.linear_forward_ref, _linear.linear_forward_on)
linear_backward = _op(_linear.linear_backward_ref, _linear.linear_backward_on)
linear_group_forward = _op(
    _linear.linear_group_forward_ref, _linear.linear_group_forward_on, _linear_cpu.linear_group_forward_cpu
)
linear_group_backward = _op(
    _linear.linear_group_backward_ref, _linear.linear_group_backward_on, _linear_cpu.linear_group_backward_cpu
)
rope_forward = _op(_rope.rope_forward_ref, _rope.rope_forward_on, _rope_cpu.rope_forward_cpu)
rope_backward = _op(_rope.rope_backward_ref, _rope.rope_backward_on, _rope_cpu.rope_backward_cpu)
attention_forward = _op(
    _attention.attention_forward_ref, _attention.attention_forward_on, _attention_cpu.attention_forward_cpu
)
attention_backward = _op(
    _attention.attention_backward_ref, _attention.attention_backward_on, _attention_cpu.attention_backward_cpu
)
mla_kv_forward = _op(_mla.mla_kv_forward_ref, _mla.mla_kv_forward_on)
mla_kv_backward = _op(_mla.mla_kv_backward_ref, _mla.mla_kv_backward_on)
glu_forward = _op(_glu.glu_forward_ref, _glu.glu_forward_on, _glu_cpu.glu_forward_cpu)
glu_backward = _op(_glu.glu_backward_ref, _glu.glu_backward_on, _glu_cpu.glu_backward_cpu)
route_forward = _op(_moe.route_forward_ref, _moe_cuda.route_forward_on)
route_backward = _op(_moe.route_backward_ref, _moe_cuda.route_backward_on)
experts_forward = _op(_moe.experts_forward_ref, _moe_cuda.experts_forward_on, _moe_cpu.experts_forward_cpu)
experts_backward = _op(
    _moe.experts_backward_ref, _moe_cuda.experts_backward_on, _moe_cpu.experts_backward_cpu
)
lm_head_loss = _op(
    _cross_entropy.lm_head_loss_ref, _cross_entropy.lm_head_loss_on, _cross_entropy_cpu.lm_head_loss_cpu
)
project = _op(_cross_entropy.project_ref, _cross_entropy.project_on)
softcap_forward = _op(_cross_entropy.softcap_forward_ref, _cross_entropy.softcap_forward_on)
softcap_backward = _op(_cross_entropy.softcap_backward_ref, _cross_entropy.softcap_backward_on)
# not model ops, but held to their references the same way: the optimizer's step (engine.train.optim)
# and dequantization (the weight store runs the CPU twin's kernels through engine.io.quants)
adamw_step = _op(_adamw.adamw_step_ref, _adamw.adamw_step_on, _adamw_cpu.adamw_step_cpu)
dequant = _op(_dequant.dequant_ref, _dequant.dequant_on, _dequant_cpu.dequant_cpu)

__all__ = [
    "AttentionCache", "EmbeddingCache", "ExpertActs", "ExpertsCache", "GluCache", "LinearCache", "LoraTerm",
    "MlaKvCache", "NormCache", "RopeCache", "RouteCache", "Routing", "SoftcapCache", "adamw_step",
    "attention_backward", "attention_forward", "attention_mask", "current_runtime", "dequant",
    "embedding_backward", "embedding_forward", "experts_backward", "experts_forward", "glu_backward",
    "glu_forward", "linear_backward", "linear_forward", "linear_group_backward", "linear_group_forward",
    "lm_head_loss", "mla_kv_backward", "mla_kv_forward", "project", "rmsnorm_backward", "rmsnorm_forward",
    "rope_angles", "rope_backward", "rope_forward", "route_backward", "route_forward", "row_chunks",
    "scatter_add_rows", "sigmoid", "silu", "softcap_backward", "softcap_forward", "softmax", "take_rows",
    "use_runtime",
]  # fmt: skip
