"""Block-invariant attention: each query row of a pass computed through exactly the call a one-token step makes.

Speculative verification feeds the target a block of k = gamma + 1 tokens; plain decoding feeds it one
token at a time. A float attention kernel over a block of query rows need not give a row the bits it
gives the same row alone (the matrix products are blocked by the number of rows). For an int8 target
whose linear layers are row-invariant (:class:`specdec.models.quantized.int8_linear.Int8Linear`), attention is the
last place where a position's logits depend on what shares its pass; these functions remove it.

Row i of a block (its absolute position is the cache's length before the pass plus i) attends through
one ``scaled_dot_product_attention`` call with that one query row (its heads packed per key/value head,
as transformers' SDPA path does for a one-token query) and exactly the keys a one-token step at that
position would see, so every row and every one-token step run the same kernel on the same shapes:

- without a mask (the dynamic engine: the keys are exactly the filled cache, batch 1, no padding; the
  mask function drops the plain causal mask there): the keys up to the row's position, from the start of
  its sliding window on a sliding-window layer. A pass from position 0 (the prefill) runs the usual causal
  kernel: plain and speculative decoding prefill the same prompt with the same call.
- with a mask (the static engine and the beam batch, whose keys are the whole position-indexed buffer;
  padded batches; custom patterns): the whole key tensor and the row's own line of the mask, as a
  one-token step there has.
- in a ragged batch (:class:`~specdec.models.sessions.batch_session.BatchSession`, inside :func:`exact_rows`):
  each sequence of the batch as the one-sequence dynamic engine runs it, whatever shares the pass: its
  prefill through the causal call over its own prompt (the extension's rows with it), each later query row over the keys of its own
  prefix, batch 1, no mask. A batched row then gets the bits :func:`specdec.generate` gives it alone.

A one-token step goes through the same functions, so nothing changes for plain decoding but the cost of
one Python call per layer. :func:`use_row_attention` switches a transformers model to them.

Where the model's int8 layers run specdec's ``specdec`` kernel (:mod:`specdec.models.kernels.extension`), the rows go
through that extension's attention instead of one SDPA call each: every query row of the pass in one call,
each over its own keys, with arithmetic fixed in the extension (float32; a row's bits do not depend on what
else shares the call). The choice is made once per model, from its layers' kernel, so a model's plain steps
and verification passes always compute attention the same way. With the extension a prefill's rows go through it
too (each over its own prefix), so a prompt fed in one pass, in chunks or after a kept prefix gives the same bits;
without it the prefill keeps the causal SDPA call.
"""

from __future__ import annotations

import contextlib
import threading
from contextvars import ContextVar
from typing import Any, Iterator, Sequence

import torch

from specdec.errors import SpecDecError

# (transformers' attention and mask registries, its SDPA attention and mask are imported where used: they bring in
# its modeling code, seconds of import that ``import specdec`` need not pay before a model is loaded)

NAME = "specdec_rows"  # the attention implementation of the int8 models


KERNEL_ATTRIBUTE = "_specdec_row_kernel"  # set on a model's modules by use_row_attention: the extension or None


def _kernel(module: Any, query: torch.Tensor) -> Any:
    """The extension whose row attention ``module`` runs (None: SDPA per row)."""
    kernel = getattr(module, KERNEL_ATTRIBUTE, None)
    return kernel if kernel is not None and query.dtype == torch.float32 and query.device.type == "cpu" else None


def _rows(kernel: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: torch.Tensor,
          ends: torch.Tensor, mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """Every query row of query [B, H, q, D] over keys [starts[b, i], ends[b, i]) of key/value [B, H_kv, L, D]
    (mask: None or [B, q, L]) in one extension call; [B, q, H, D]."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if mask is not None and mask.dtype not in (torch.bool, torch.float32):
        mask = mask.float()
    return kernel.row_attention(query, key, value, starts, ends, mask, float(scale))


def _row(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
         scaling: float | None, kernel: Any = None) -> torch.Tensor:
    """One query row query [B, H, 1, D] over key/value [B, H_kv, L, D] (mask: None or [B, 1, 1, L]);
    [B, H, D]. The query heads that share a key/value head attend together (as transformers' SDPA path
    packs a one-token query): [B, H_kv, H / H_kv, D] against [B, H_kv, L, D]. ``kernel``: the extension's
    row attention instead (the same for every row)."""
    batch, heads, _, dim = query.shape
    if kernel is not None:
        length = key.shape[2]
        starts = torch.zeros(batch, 1, dtype=torch.long)
        ends = torch.full((batch, 1), length, dtype=torch.long)
        line = mask.reshape(batch, 1, length) if mask is not None else None
        return _rows(kernel, query, key, value, starts, ends, line, scaling)[:, 0]
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


#: The rows of the ragged batch pass under way, (first position, tokens fed) per sequence (None: no batch).
_BATCH_ROWS: ContextVar[Sequence[tuple[int, int]] | None] = ContextVar("specdec_batch_rows", default=None)


@contextlib.contextmanager
def exact_rows(spans: Sequence[tuple[int, int]]) -> Iterator[None]:
    """Inside: a pass's batch row b holds a sequence fed ``spans[b] = (start, n)``: tokens at positions
    start .. start + n - 1 (the rest of the row is padding), its keys at their positions from 0."""
    token = _BATCH_ROWS.set(spans)
    try:
        yield
    finally:
        _BATCH_ROWS.reset(token)


def _prefill(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, window: int | None,
             kwargs: dict) -> torch.Tensor:
    """A pass from position 0 over q tokens ([1, H, q, D] and keys [1, H_kv, q, D]): the usual causal kernel
    (a sliding window's band mask where q exceeds it); [1, q, H, D]."""
    q, mask = query.shape[2], None
    if window and q > window:
        i = torch.arange(q, device=query.device)
        mask = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window))[None, None]  # [1, 1, q, q]
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs = {k: v for k, v in kwargs.items() if k != "is_causal"}
    return sdpa_attention_forward(module, query, key, value, mask, is_causal=mask is None, **kwargs)[0]


def _batch(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           spans: Sequence[tuple[int, int]], window: int | None, kwargs: dict) -> torch.Tensor:
    """Each sequence of a ragged batch as the one-sequence engine computes it; padded rows get zeros.
    query [B, H, w, D]; key/value [B, H_kv, L, D] at positions 0 .. L - 1; [B, w, H, D]."""
    batch, heads, width, _ = query.shape
    kernel = _kernel(module, query)
    if kernel is not None:  # every row of every sequence in one kernel call, each over its own keys (its own bits)
        out = _rows(kernel, query, key, value, *_batch_spans(spans, width, window), None, kwargs.get("scaling"))
    else:
        out = query.new_zeros(batch, width, heads, value.shape[-1])
    if kernel is not None:
        return out
    for b, (start, n) in enumerate(spans):
        if start == 0 and n > 1:  # its prefill
            out[b, :n] = _prefill(module, query[b:b + 1, :, :n], key[b:b + 1, :, :n], value[b:b + 1, :, :n], window,
                                  kwargs)[0]
            continue
        for i in range(n):
            end = start + i + 1
            first = max(0, end - window) if window else 0
            out[b, i] = _row(query[b:b + 1, :, i:i + 1], key[b:b + 1, :, first:end], value[b:b + 1, :, first:end],
                             None, kwargs.get("scaling"), kernel)[0]
    return out


def row_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, q, D]; key/value [B, H_kv, L, D]; attention_mask None or [B, 1, q, L] (True: attend).

    Without a mask (:func:`skip_plain_causal_mask` dropped it: no padding, the plain causal or sliding
    pattern) the keys are exactly the cache's positions with the q new ones last, and each row takes the
    keys of its own prefix. With a mask (the static engine's and the beam batch's position-indexed buffers,
    padded batches, custom patterns) each row takes the whole key tensor and its own line of the mask.
    """
    _check(kwargs)
    scaling = kwargs.get("scaling")
    q, length = query.shape[2], key.shape[2]
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    spans = _BATCH_ROWS.get()
    if spans is not None:  # a ragged batch: every sequence as it runs alone (the mask is not needed)
        return _batch(module, query, key, value, spans, window, kwargs), None
    kernel = _kernel(module, query)
    if attention_mask is not None:
        if kernel is not None:
            batch = query.shape[0]
            starts = torch.zeros(batch, q, dtype=torch.long)
            ends = torch.full((batch, q), length, dtype=torch.long)
            mask = attention_mask[:, 0].expand(batch, q, length)  # [B, q, L]
            return _rows(kernel, query, key, value, starts, ends, mask, scaling), None
        rows = [_row(query[:, :, i:i + 1], key, value, attention_mask[:, :, i:i + 1], scaling)
                for i in range(q)]
        return _stack(rows), None
    if q == length and q > 1 and kernel is None:  # a pass from position 0 without the extension: the causal kernel
        return _prefill(module, query, key, value, window, kwargs), None
    if kernel is not None:  # every row at once (a prefill's too), each over the keys of its own prefix (its window's)
        starts, ends = _spans(query.shape[0], q, length, window)  # [B, q] each
        return _rows(kernel, query, key, value, starts, ends, None, scaling), None
    rows = []
    for i in range(q):
        end = length - q + i + 1  # the keys of positions 0 .. the row's own
        start = max(0, end - window) if window else 0  # a sliding-window layer sees the last `window`
        rows.append(_row(query[:, :, i:i + 1], key[:, :, start:end], value[:, :, start:end], None, scaling))
    return _stack(rows), None  # [B, q, H, D]


class _LastSpans(threading.local):
    key: tuple | None = None
    value: tuple[torch.Tensor, torch.Tensor] | None = None


_last_spans = _LastSpans()


def _spans(batch: int, q: int, length: int, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The key spans [start, end) of q rows ending at ``length`` (batch rows alike): made once per pass, not per
    layer (every layer of a pass asks the same)."""
    key = (batch, q, length, window)
    if _last_spans.key != key:
        ends = torch.arange(length - q + 1, length + 1).expand(batch, q).contiguous()  # [B, q]
        starts = (ends - window).clamp_min(0) if window else torch.zeros_like(ends)
        _last_spans.key, _last_spans.value = key, (starts, ends)
    return _last_spans.value


def _batch_spans(spans: Sequence[tuple[int, int]], width: int, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The key spans [start, end) [B, w] of a ragged pass's rows: row i of a sequence fed (start, n) ends at
    start + i + 1 (from its window's first key), a prefill's rows too; padding rows an empty span (the kernel writes
    zeros). Made once per pass, as :func:`_spans`."""
    key = ("batch", tuple(spans), width, window)
    if _last_spans.key != key:
        ends = torch.zeros(len(spans), width, dtype=torch.long)
        for b, (start, n) in enumerate(spans):
            if n:
                ends[b, :n] = torch.arange(start + 1, start + n + 1)
        starts = (ends - window).clamp_min(0) if window else torch.zeros_like(ends)
        _last_spans.key, _last_spans.value = key, (starts, ends)
    return _last_spans.value


def skip_plain_causal_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The mask function of :data:`NAME`: None where the pattern is the plain causal one (or its sliding
    window) without padding, which :func:`row_attention` applies by slicing the keys; else SDPA's mask.
    (transformers clears ``allow_is_causal_skip`` for packed sequences and custom patterns.)"""
    padding = kwargs.get("attention_mask")
    if kwargs.get("allow_is_causal_skip", True) and (padding is None or bool(padding.all())):
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def _register() -> None:
    """:data:`NAME` in transformers' attention (and mask) registries: what ``set_attn_implementation(NAME)`` looks
    up (idempotent: each call sets the same entries)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, row_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # pragma: no cover - an older transformers layout
        return
    AttentionMaskInterface.register(NAME, skip_plain_causal_mask)


def use_row_attention(hf_model: Any) -> None:
    """Run ``hf_model``'s attention row by row (:func:`row_attention`); through the ``specdec`` extension's attention
    where its int8 layers run that kernel."""
    from specdec.models.quantized.int8_linear import Int8Linear

    kernels = {m.kernel for m in hf_model.modules() if isinstance(m, Int8Linear)}
    kernel = None
    if kernels == {"specdec"}:
        from specdec.models.kernels import extension

        kernel = extension.loaded()
    for module in hf_model.modules():
        object.__setattr__(module, KERNEL_ATTRIBUTE, kernel)
    if not getattr(hf_model, "native", False):  # (specdec.models.native.causal_lm's model calls row_attention itself)
        _register()
    hf_model.set_attn_implementation(NAME)
