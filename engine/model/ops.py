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
the specification of the op, and `<op>` its CUDA twin. This module gives model code one name per
op. Within `use_runtime(rt)` (what `Backend.active()` enters on a GPU) every op runs its twin on
that runtime (`<op>_on(rt, ...)`, the MoE ops through `<op>_launch`); outside one, an op runs
the twin when its first argument is a CuPy array and the reference otherwise. It knows no GGUF
names and holds no state besides the current runtime of this thread; `engine.model.layers` and
`engine.model.forward` wire the ops into models.
"""

from __future__ import annotations

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
from ..kernels.runtime import current_runtime, use_runtime
from ..kernels.softcap import SoftcapCache
from ..kernels.swiglu import SwigluCache, sigmoid, silu


def _dispatch(module, name: str):
    """The op `name` of kernels `module`: on the current runtime its `<name>_on(rt, ...)` (or
    `<name>_launch(..., xp=, launch=)`); otherwise its NumPy reference `<name>_ref`, or its CUDA twin
    `<name>` when the first argument is a CuPy array (a twin not written yet is an EngineError)."""
    ref = getattr(module, name + "_ref")
    on = getattr(module, name + "_on", None)
    launch = getattr(module, name + "_launch", None)

    def op(*args, **kwargs):
        rt = current_runtime()
        if rt is not None:
            if on is not None:
                return on(rt, *args, **kwargs)
            if launch is not None:
                return launch(*args, xp=rt.xp, launch=module.runtime_launch(rt), **kwargs)
            raise EngineError(f"{module.__name__}.{name} has no CUDA version yet")
        if args and type(args[0]).__module__.startswith("cupy"):
            twin = getattr(module, name, None)
            if twin is None:
                raise EngineError(f"{module.__name__}.{name} has no CUDA version yet")
            return twin(*args, **kwargs)
        return ref(*args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = ref.__doc__
    op.reference = ref  # type: ignore[attr-defined]
    return op


embedding_forward = _dispatch(_embedding, "embedding_forward")
embedding_backward = _dispatch(_embedding, "embedding_backward")
rmsnorm_forward = _dispatch(_norm, "rmsnorm_forward")
rmsnorm_backward = _dispatch(_norm, "rmsnorm_backward")
linear_forward = _dispatch(_linear, "linear_forward")
linear_backward = _dispatch(_linear, "linear_backward")
rope_forward = _dispatch(_rope, "rope_forward")
rope_backward = _dispatch(_rope, "rope_backward")
attention_forward = _dispatch(_attention, "attention_forward")
attention_backward = _dispatch(_attention, "attention_backward")
swiglu_forward = _dispatch(_swiglu, "swiglu_forward")
swiglu_backward = _dispatch(_swiglu, "swiglu_backward")
route_forward = _dispatch(_moe, "route_forward")
route_backward = _dispatch(_moe, "route_backward")
experts_forward = _dispatch(_moe, "experts_forward")
experts_backward = _dispatch(_moe, "experts_backward")
lm_head_loss = _dispatch(_cross_entropy, "lm_head_loss")
project = _dispatch(_cross_entropy, "project")
# ops of the architectures added with issue 17 (references only so far: a GPU backend says so)
attention_ext_forward = _dispatch(_attention_ext, "attention_ext_forward")
attention_ext_backward = _dispatch(_attention_ext, "attention_ext_backward")
geglu_forward = _dispatch(_glu, "geglu_forward")
geglu_backward = _dispatch(_glu, "geglu_backward")
swiglu_oai_forward = _dispatch(_glu, "swiglu_oai_forward")
swiglu_oai_backward = _dispatch(_glu, "swiglu_oai_backward")
mla_kv_forward = _dispatch(_mla, "mla_kv_forward")
mla_kv_backward = _dispatch(_mla, "mla_kv_backward")
route_ext_forward = _dispatch(_moe_ext, "route_ext_forward")
route_ext_backward = _dispatch(_moe_ext, "route_ext_backward")
experts_ext_forward = _dispatch(_moe_ext, "experts_ext_forward")
experts_ext_backward = _dispatch(_moe_ext, "experts_ext_backward")
softcap_forward = _dispatch(_softcap, "softcap_forward")
softcap_backward = _dispatch(_softcap, "softcap_backward")
softcap_head_loss = _dispatch(_softcap, "softcap_head_loss")

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
