"""The attention and MLP of an int8 / int4 model on specdec's extension, in fewer ops: the same bits.

A decoding step of the 0.5B draft in int4 spends about half its 19 ms outside the matrix kernels, a third of that in
the attention block's small ops (measured on the AVX-512 EPYC: the three projections' module calls 1.8 ms a step,
the rotary embedding 1.0, the attention interface 1.4, the output projection 1.0, over 24 layers). For Qwen2 and
Llama attention modules whose projections run on the extension, :func:`install` swaps in a forward that

- runs the fused q/k/v layer once for its three parts (one kernel call, no per-member bookkeeping);
- applies the rotary embedding to q and k in one extension call (``rotary``: transformers' arithmetic element for
  element, each product and the sum rounded apart, so the same bits) that writes them as [B, H, L, D];
- calls specdec's row attention directly (:func:`specdec.models.native.row_attention.row_attention`, which the model's
  attention interface would call);
- runs the MLP's fused gate/up layer once for both parts.

Everything else is transformers' own order of operations: the cache update, the output projection. The logits are
the same bits as with transformers' forward (tested), so every exactness property of the model stands. Any other
case (another attention implementation, a cos/sin not per row) runs transformers' forward.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.models.native import row_attention
from specdec.models.quantized.int8_fusion import fused_set

#: The attention classes whose forward is the plain Llama form (q/k/v, rotary, cache, attention, o) this replaces,
#: and the MLPs of the form down(act(gate(x)) * up(x)).
SUPPORTED = ("Qwen2Attention", "LlamaAttention")
SUPPORTED_MLPS = ("Qwen2MLP", "LlamaMLP")

_lean_classes: dict[type, type] = {}


def _qkv(module: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three projections [B, L, w]: one call of their fused layer where they are one, in order."""
    fused = fused_set([module.q_proj, module.k_proj, module.v_proj])
    if fused is not None:
        q, k, v = fused.layer.parts(hidden_states, fused.widths)
        return q, k, v
    return module.q_proj(hidden_states), module.k_proj(hidden_states), module.v_proj(hidden_states)


def lean_forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                 attention_mask: torch.Tensor | None = None, cache: Any = None, **kwargs: Any):
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    batch, width = hidden_states.shape[:2]
    cos, sin = position_embeddings
    kernel = getattr(self, row_attention.KERNEL_ATTRIBUTE, None)  # specdec's extension (use_row_attention sets it)
    if (kernel is None or self.config._attn_implementation != row_attention.NAME or self.training
            or hidden_states.dtype != torch.float32 or cos.shape != (batch, width, self.head_dim)):
        return super(type(self), self).forward(hidden_states, position_embeddings, attention_mask, cache=cache, **kwargs)
    q, k, v = _qkv(self, hidden_states)  # [B, L, w] each
    q, k = kernel.rotary(q.view(batch, width, -1, self.head_dim), k.view(batch, width, -1, self.head_dim), cos,
                         sin)  # [B, H, L, D], [B, H_kv, L, D]
    v = v.view(batch, width, -1, self.head_dim).transpose(1, 2)  # [B, H_kv, L, D]
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    out, weights = row_attention.row_attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling,
                                               sliding_window=getattr(self, "sliding_window", None), **kwargs)
    return self.o_proj(out.reshape(batch, width, -1).contiguous()), weights  # out: [B, L, H, D]


def _gate_up(module: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP's gate and up projections [B, L, I]: one call of their fused layer where they are one."""
    fused = fused_set([module.gate_proj, module.up_proj])
    if fused is not None:
        gate, up = fused.layer.parts(x, fused.widths)
        return gate, up
    return module.gate_proj(x), module.up_proj(x)


def lean_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    """down(act(gate(x)) * up(x)) with gate and up as one call of their fused layer (the same ops otherwise)."""
    gate, up = _gate_up(self, x)
    return self.down_proj(self.act_fn(gate) * up)


def install(hf_model: Any) -> None:
    """Give ``hf_model``'s supported attention and MLP modules the lean forwards (their class becomes a subclass of
    theirs with it; a copy of the model keeps it) where its row attention runs on specdec's extension
    (:func:`specdec.models.native.row_attention.use_row_attention` first)."""
    if getattr(hf_model, row_attention.KERNEL_ATTRIBUTE, None) is None:
        return
    for module in hf_model.modules():
        cls = type(module)
        if cls.__name__ not in SUPPORTED + SUPPORTED_MLPS or cls in _lean_classes.values():
            continue
        if cls not in _lean_classes:
            forward = lean_forward if cls.__name__ in SUPPORTED else lean_mlp_forward
            _lean_classes[cls] = type(f"Lean{cls.__name__}", (cls,), {"forward": forward})
        module.__class__ = _lean_classes[cls]


def uninstall(hf_model: Any) -> None:
    """Back to transformers' forward (for comparisons)."""
    originals = {lean: cls for cls, lean in _lean_classes.items()}
    for module in hf_model.modules():
        if type(module) in originals:
            module.__class__ = originals[type(module)]
