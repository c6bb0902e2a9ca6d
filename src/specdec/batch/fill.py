"""Chunked prefill for the batch engine (:mod:`specdec.batch.engine`): a joining row's prompt goes in at most
``prefill_chunk`` tokens a round while the other rows go on, so a long prompt joining a busy batch stalls them by at
most one chunk, not its whole prefill. With no row running nothing waits on it, so it goes in at once.

The row being filled holds the next free slot (``len(engine.rows)``): the rounds feed slots below it only. Its
chunks are passes over its prompt from where it stands, as a prefix kept from an earlier request is
(:mod:`specdec.batch.prefix`), so with a block-invariant target (and no sliding window) they give a one-pass
prefill's bits; elsewhere the engine prefills a prompt in one pass (``prefill_chunk`` 0).
"""

from __future__ import annotations

from typing import Any

from specdec.batch.alone import feeds_alone
from specdec.batch.prefix import reuse_keeps_bits, reuse_prefix
from specdec.batch.row import MODEL, BatchRow

#: Tokens of a joining prompt fed a round while other rows run (``specdec serve --prefill-chunk``): on 2 cores the
#: 1.5B int4-mixed target takes about 1.3 s for 128 prompt tokens, a few of the running rows' rounds.
DEFAULT_CHUNK = 128


def chunk_size(target: Any, asked: int) -> int:
    """The chunk the engine uses: ``asked`` where chunks keep the bits of a one-pass prefill, else 0 (whole)."""
    return asked if asked > 0 and reuse_keeps_bits(target) else 0


def start_fill(engine: Any, row: BatchRow) -> None:
    """``row`` takes the next free slot: the longest kept prefix written there, the rest to be fed."""
    from specdec.devices import Stopwatch

    slot = len(engine.rows)
    row.t_start = Stopwatch(engine.target.device)()
    reused, reused_draft = reuse_prefix(engine, slot, row)
    engine.target_session.lengths[slot] = reused
    # a model-drafted row's draft catches up later where the batch drafts nothing at this size, where the row goes
    # on alone (its drafter feeds its model when it first drafts: specdec.batch.alone.feeds_alone), or, joining a
    # batch that holds a row, where feeding its prompt to the draft model costs more than drafting in the batch is
    # likely to save it
    # (the rows it runs among: those running, itself and those waiting, which join in the next rounds)
    rows = min(engine.max_batch, len(engine.rows) + 1 + len(engine.waiting))
    row.fill_draft = (row.draft == MODEL and engine.draft_prefills(rows) and not feeds_alone(engine, row)
                      and (rows < 2 or engine.gamma_policy.feed_pays(rows, len(row.sequence) - 1 - reused_draft,
                                                                     row.limit) is not False))
    if row.draft == MODEL:
        engine.draft_session.lengths[slot] = reused_draft
    row.filled, row.draft_filled = reused, reused_draft
    engine.filling = row


def fill(engine: Any, budget: int | None) -> int:
    """Feed the filling row up to ``budget`` more prompt tokens (None: all of them); returns how many it fed. Once
    its whole prompt is in, its last position's logits are ``row.carried`` (the first token, or its first
    draft's verification) and :func:`filled` says so."""
    row, slot = engine.filling, len(engine.rows)
    sequence = row.sequence
    end = len(sequence) if budget is None else min(len(sequence), row.filled + budget)
    fed = end - row.filled
    if fed > 0:
        logits = engine.target_session.prefill(slot, sequence[:end], row.filled)  # [1, V] (None: nothing fed)
        if end == len(sequence):
            row.carried = logits
        row.filled = end
    if row.fill_draft:  # the draft holds the prompt but its last token (fed with the first round's drafts)
        draft_end = min(end, len(sequence) - 1)
        if draft_end > row.draft_filled:
            clock, start = engine.clock, engine.clock.mark()
            engine.draft_session.prefill(slot, sequence[:draft_end], row.draft_filled)
            engine.gamma_policy.observe_feed(draft_end - row.draft_filled, clock.seconds(start, clock.mark()))
            row.draft_filled = draft_end
    if engine.fills is not None and fed:
        engine.fills.append(fed)
    return fed


def filled(engine: Any) -> bool:
    """Whether the filling row's whole prompt is in (it joins the rows now)."""
    row = engine.filling
    return row is not None and row.filled == len(row.sequence) and row.carried is not None


def drop_fill(engine: Any) -> BatchRow:
    """The filling row leaves before it joined (cancelled while its prompt went in): its slot holds nothing."""
    row, slot = engine.filling, len(engine.rows)
    engine.target_session.lengths[slot] = 0
    if engine.draft_session is not None:
        engine.draft_session.lengths[slot] = 0
    engine.filling = None
    return row


def follow_leave(engine: Any) -> None:
    """A row left (the rows are one fewer): the filling row's slot moves down to the new next free slot."""
    if engine.filling is None:
        return
    old, new = len(engine.rows) + 1, len(engine.rows)
    engine.target_session.move(old, new)
    if engine.draft_session is not None:
        engine.draft_session.move(old, new)
