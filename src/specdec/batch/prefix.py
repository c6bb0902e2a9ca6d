"""The batch engine's prefix cache (:mod:`specdec.batch.prefix_cache`): a joining row starts from the longest prefix a
finished row left, for the target and the model draft, and a finished row leaves its keys and values."""

from __future__ import annotations

from typing import Any

from specdec.batch.row import MODEL, BatchRow
from specdec.batch.prefix_cache import PrefixCache
from specdec.models.sessions.window import contiguous_length


def prefix_cache(target: Any, budget_bytes: int) -> PrefixCache | None:
    """A prefix cache of ``budget_bytes`` for a batch over ``target``, or None: no budget, or a target whose reused
    prefix could differ from a fresh prefill (a float model's passes round by their shape; a sliding window's
    one-pass prefill rounds otherwise than a prefill and steps)."""
    if budget_bytes <= 0 or not reuse_keeps_bits(target):
        return None
    return PrefixCache(budget_bytes)


def reuse_keeps_bits(target: Any) -> bool:
    """Whether a prompt fed in parts after kept positions (a reused prefix, prefill chunks) gives a one-pass prefill's
    bits: a block-invariant target without sliding windows whose attention runs on specdec's extension (each row of
    a prefill over its own prefix, as a later chunk's rows; without it a one-pass prefill is torch's causal SDPA,
    whose bits for a row depend on the prompt's length)."""
    from specdec.models.cache.static_cache import sliding_windows
    from specdec.models.native.row_attention import KERNEL_ATTRIBUTE

    return (bool(target.block_invariant) and getattr(target.hf_model, KERNEL_ATTRIBUTE, None) is not None
            and not any(sliding_windows(target.hf_model.config)))


def reuse_prefix(engine: Any, slot: int, row: BatchRow) -> tuple[int, int]:
    """Write the longest kept prefix of ``row``'s prompt into ``slot`` (target, and its model draft's); returns
    the positions each holds now (what its prefill need not feed): (target, draft)."""
    cache = engine.prefix_cache
    if cache is None:
        return 0, 0
    hit = cache.lookup(row.sequence, limit=len(row.sequence) - 1)  # a token is fed: its logits come with it
    if hit is None:
        return 0, 0
    engine.target_session.write_row(slot, hit.target, hit.length)
    row.stats.cached_tokens = hit.length
    draft = 0
    if row.draft == MODEL and hit.draft is not None:
        draft = min(hit.draft_length, len(row.sequence) - 1)
        if draft:
            engine.draft_session.write_row(slot, hit.draft, draft)
    return hit.length, draft


def keep_prefix(engine: Any, slot: int, row: BatchRow) -> None:
    """A finished row (in ``slot``, or alone) leaves its sequence's keys and values to the prefix cache."""
    cache = engine.prefix_cache
    if cache is None or row.output is None:
        return
    if row.alone:
        target, held = row.session.kv(), row.session.length
        drafter = getattr(row.drafter, "inner", row.drafter) if row.prediction is not None else row.drafter
        model = drafter.session if row.draft == MODEL else None
        draft, drafted = (model.kv(), contiguous_length(model)) if model is not None else (None, 0)  # (a window's head)
    else:
        target, held = engine.target_session.read_row(slot), engine.target_session.lengths[slot]
        model = row.draft == MODEL
        draft = engine.draft_session.read_row(slot) if model else None
        drafted = engine.draft_session.lengths[slot] if model else 0
    if target is None:
        return
    ids = row.sequence[: min(held, len(row.sequence))]  # (a stop string may have cut tokens the caches hold)
    cache.store(ids, target, draft, min(drafted, len(ids)))
