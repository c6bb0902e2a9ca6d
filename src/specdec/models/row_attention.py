"""Block-invariant attention: each query row of a pass computed through exactly the call a one-token step makes.

Speculative verification feeds the target a block of k = gamma + 1 tokens; plain decoding feeds it one
token at a time. A float attention kernel over a block of query rows need not give a row the bits it
gives the same row alone (the matrix products are blocked by the number of rows). For an int8 target
whose linear layers are row-invariant (:class:`specdec.models.quantize.Int8Linear`), attention is the
last place where a position's logits depend on what shares its pass; these functions remove it.

Row i of a block (its absolute position is the cache's length before the pass plus i) attends through
one ``scaled_dot_product_attention`` call with that one query row (its heads packed per key/value head,
as transformers' SDPA path does for a one-token query) and exactly the keys a one-token step at that
position would see, so every row and every one-token step run the same kernel on the same shapes:

- ``specdec_rows`` (the dynamic engine: the keys are exactly the filled cache): the keys up to the row's
  position, from the start of its sliding window on a sliding-window layer, with no mask (batch 1, no
  padding: the sessions' case). A pass from position 0 (the prefill) runs the usual causal kernel: plain
  and speculative decoding prefill the same prompt with the same call.
- ``specdec_rows_static`` (the static engine: the keys are the whole position-indexed buffer): the whole
  buffer and the row's own line of the mask the static cache made, as a one-token step has.

A one-token step goes through the same functions, so nothing changes for plain decoding but the cost of
one Python call per layer. :func:`use_row_attention` switches a transformers model to them.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdec.errors import SpecDecError

try:
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError:  # pragma: no cover - an older transformers layout
    AttentionMaskInterface = None

DYNAMIC, STATIC = "specdec_rows", "specdec_rows_static"


def _row(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
         scaling: float | None) -> torch.Tensor:
    """One query row query [B, H, 1, D] over key/value [B, H_kv, L, D] (mask: None or [B, 1, 1, L]);
    [B, H, D]. The query heads that share a key/value head attend together (as transformers' SDPA path
    packs a one-token query): [B, H_kv, H / H_kv, D] against [B, H_kv, L, D]."""
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, key.shape[1], heads // key.shape[1], dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, value.shape[-1])


def _check(kwargs: dict) -> None:
    for name in ("softcap", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise SpecDecError(f"row-wise attention (the int8 models) does not support {name}; load this model "
                               "without quantize=")


def _stack(rows: list[torch.Tensor]) -> torch.Tensor:
    """[B, H, D] per row -> [B, q, H, D] (the layout transformers' attention functions return)."""
    return rows[0][:, None] if len(rows) == 1 else torch.stack(rows, dim=1)


def rows_dynamic(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, q, D]; key/value [B, H_kv, L, D], the cache's positions with the q new ones last."""
    q, length = query.shape[2], key.shape[2]
    if q == length and q > 1:  # a pass from position 0: the prefill, the usual causal kernel
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    _check(kwargs)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    scaling = kwargs.get("scaling")
    rows = []
    for i in range(q):
        end = length - q + i + 1  # the keys of positions 0 .. the row's own
        start = max(0, end - window) if window else 0  # a sliding-window layer sees the last `window`
        rows.append(_row(module, query[:, :, i:i + 1], key[:, :, start:end], value[:, :, start:end], None, scaling))
    return _stack(rows), None  # [B, q, H, D]


def rows_static(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, q, D]; key/value [B, H_kv, capacity, D]; attention_mask [B, 1, q, capacity] (the static
    cache's: which positions each row sees)."""
    if attention_mask is None:
        return rows_dynamic(module, query, key, value, attention_mask, **kwargs)
    _check(kwargs)
    scaling = kwargs.get("scaling")
    rows = [_row(module, query[:, :, i:i + 1], key, value, attention_mask[:, :, i:i + 1], scaling)
            for i in range(query.shape[2])]
    return _stack(rows), None


AttentionInterface.register(DYNAMIC, rows_dynamic)
AttentionInterface.register(STATIC, rows_static)
if AttentionMaskInterface is not None:  # masks as SDPA takes them (the static engine passes its own)
    AttentionMaskInterface.register(DYNAMIC, sdpa_mask)
    AttentionMaskInterface.register(STATIC, sdpa_mask)


def use_row_attention(hf_model: Any, engine: str) -> None:
    """Run ``hf_model``'s attention through the row functions of ``engine`` ("dynamic" or "static")."""
    hf_model.set_attn_implementation(STATIC if engine == "static" else DYNAMIC)


def uses_row_attention(hf_model: Any) -> bool:
    return getattr(hf_model.config, "_attn_implementation", None) in (DYNAMIC, STATIC)
