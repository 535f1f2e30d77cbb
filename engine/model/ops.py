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
the specification of the op, and `<op>_on(rt, ...)` its CUDA twin on a kernels `Runtime`. The
table below names both for every op, so that an editor goes from `ops.rmsnorm_forward` to its
definitions in one step. Within `use_runtime(rt)` (what `Backend.active()` enters on a GPU) every
op runs its twin on that runtime; outside one, an op runs its twin on the GPU runtime when its
first argument is a CuPy array (on that array's device), and the reference otherwise. An op whose
twin is not written yet (None in the table) raises EngineError naming it, rather than running on
the host behind the user's back. This module knows no GGUF names and holds no state (the runtime of
this thread is engine.kernels.runtime's); `engine.model.layers` and `engine.model.forward` wire the
ops into models.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..errors import EngineError
from ..kernels import attention as _attention
from ..kernels import attention_ext as _attention_ext
from ..kernels import cross_entropy as _cross_entropy
from ..kernels import embedding as _embedding
from ..kernels import glu as _glu
from ..kernels import linear as _linear
from ..kernels import mla as _mla
from ..kernels import moe as _moe
from ..kernels import moe_ext as _moe_ext
from ..kernels import norm as _norm
from ..kernels import rope as _rope
from ..kernels import softcap as _softcap
from ..kernels import swiglu as _swiglu
from ..kernels.attention import AttentionCache, attention_mask
from ..kernels.attention_ext import AttentionExtCache
from ..kernels.cross_entropy import softmax
from ..kernels.embedding import EmbeddingCache, row_chunks, scatter_add_rows, take_rows
from ..kernels.glu import GegluCache, SwigluOaiCache
from ..kernels.linear import LinearCache, LoraTerm
from ..kernels.mla import MlaKvCache
from ..kernels.moe import ExpertActs, ExpertsCache, RouteCache, Routing
from ..kernels.moe_ext import ExpertsExtCache, RouteExtCache
from ..kernels.norm import NormCache
from ..kernels.rope import RopeCache, rope_angles
from ..kernels.runtime import current_runtime, runtime_for, use_runtime
from ..kernels.softcap import SoftcapCache
from ..kernels.swiglu import SwigluCache, sigmoid, silu


def _op(reference: Callable, twin_on: Callable | None) -> Callable:
    """One op of the table: `reference` (`<op>_ref`, NumPy) and `twin_on` (`<op>_on(rt, ...)`, its CUDA
    twin on a runtime, or None when there is none yet); the module docstring says which one runs."""
    name = reference.__name__.removesuffix("_ref")

    @functools.wraps(reference)
    def op(*args, **kwargs):
        rt = current_runtime()
        on_gpu_arrays = rt is None and bool(args) and type(args[0]).__module__.startswith("cupy")
        if rt is None and not on_gpu_arrays:
            return reference(*args, **kwargs)
        if twin_on is None:
            raise EngineError(f"{reference.__module__}.{name} has no CUDA version yet")
        if rt is not None:
            return twin_on(rt, *args, **kwargs)
        with args[0].device:
            return twin_on(runtime_for(args[0], name), *args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.reference = reference  # type: ignore[attr-defined]
    op.twin_on = twin_on  # type: ignore[attr-defined]
    return op


# every op: its NumPy reference, and its CUDA twin on a runtime
embedding_forward = _op(_embedding.embedding_forward_ref, _embedding.embedding_forward_on)
embedding_backward = _op(_embedding.embedding_backward_ref, _embedding.embedding_backward_on)
rmsnorm_forward = _op(_norm.rmsnorm_forward_ref, _norm.rmsnorm_forward_on)
rmsnorm_backward = _op(_norm.rmsnorm_backward_ref, _norm.rmsnorm_backward_on)
linear_forward = _op(_linear.linear_forward_ref, _linear.linear_forward_on)
linear_backward = _op(_linear.linear_backward_ref, _linear.linear_backward_on)
rope_forward = _op(_rope.rope_forward_ref, _rope.rope_forward_on)
rope_backward = _op(_rope.rope_backward_ref, _rope.rope_backward_on)
attention_forward = _op(_attention.attention_forward_ref, _attention.attention_forward_on)
attention_backward = _op(_attention.attention_backward_ref, _attention.attention_backward_on)
swiglu_forward = _op(_swiglu.swiglu_forward_ref, _swiglu.swiglu_forward_on)
swiglu_backward = _op(_swiglu.swiglu_backward_ref, _swiglu.swiglu_backward_on)
route_forward = _op(_moe.route_forward_ref, _moe.route_forward_on)
route_backward = _op(_moe.route_backward_ref, _moe.route_backward_on)
experts_forward = _op(_moe.experts_forward_ref, _moe.experts_forward_on)
experts_backward = _op(_moe.experts_backward_ref, _moe.experts_backward_on)
lm_head_loss = _op(_cross_entropy.lm_head_loss_ref, _cross_entropy.lm_head_loss_on)
project = _op(_cross_entropy.project_ref, _cross_entropy.project_on)
# the newer architectures' ops: references only so far (a GPU backend refuses them by name)
attention_ext_forward = _op(_attention_ext.attention_ext_forward_ref, None)
attention_ext_backward = _op(_attention_ext.attention_ext_backward_ref, None)
geglu_forward = _op(_glu.geglu_forward_ref, None)
geglu_backward = _op(_glu.geglu_backward_ref, None)
swiglu_oai_forward = _op(_glu.swiglu_oai_forward_ref, None)
swiglu_oai_backward = _op(_glu.swiglu_oai_backward_ref, None)
mla_kv_forward = _op(_mla.mla_kv_forward_ref, None)
mla_kv_backward = _op(_mla.mla_kv_backward_ref, None)
route_ext_forward = _op(_moe_ext.route_ext_forward_ref, None)
route_ext_backward = _op(_moe_ext.route_ext_backward_ref, None)
experts_ext_forward = _op(_moe_ext.experts_ext_forward_ref, None)
experts_ext_backward = _op(_moe_ext.experts_ext_backward_ref, None)
softcap_forward = _op(_softcap.softcap_forward_ref, None)
softcap_backward = _op(_softcap.softcap_backward_ref, None)
softcap_head_loss = _op(_softcap.softcap_head_loss_ref, None)

__all__ = [
    "AttentionCache", "EmbeddingCache", "ExpertActs", "ExpertsCache", "LinearCache", "LoraTerm",
    "NormCache", "RopeCache", "RouteCache", "Routing", "SwigluCache", "attention_backward",
    "attention_forward", "attention_mask", "embedding_backward", "embedding_forward", "experts_backward",
    "experts_forward", "linear_backward", "linear_forward", "lm_head_loss", "project", "rmsnorm_backward",
    "rmsnorm_forward", "rope_angles", "rope_backward", "rope_forward", "route_backward", "route_forward",
    "row_chunks", "scatter_add_rows", "sigmoid", "silu", "softmax", "swiglu_backward", "swiglu_forward",
    "take_rows", "current_runtime", "use_runtime",
    "AttentionExtCache", "ExpertsExtCache", "GegluCache", "MlaKvCache", "RouteExtCache", "SoftcapCache",
    "SwigluOaiCache", "attention_ext_backward", "attention_ext_forward", "experts_ext_backward",
    "experts_ext_forward", "geglu_backward", "geglu_forward", "mla_kv_backward", "mla_kv_forward",
    "route_ext_backward", "route_ext_forward", "softcap_backward", "softcap_forward", "softcap_head_loss",
    "swiglu_oai_backward", "swiglu_oai_forward",
]  # fmt: skip
