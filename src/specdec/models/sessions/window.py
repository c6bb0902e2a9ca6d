"""A draft model's session that holds the start of a sequence and its last stretch, not the middle.

A draft only proposes; the target verifies, so what the draft's cache holds changes how often it is right, never the
output. Feeding a small draft the whole prompt before it drafts can cost more than drafting saves: a chat request on a
2-core CPU (docs/serving.md) asks ~180 prompt tokens for a ~65-token answer, and the 0.5B fed those at ~4.4 ms a
token spends about what its drafts save. Fed only the positions its cache already holds (the system prompt a prefix
cache kept) and the last :data:`WINDOW` tokens, it starts after ~0.15 s, and agrees with the 1.5B's greedy answer
nearly as often (16 HumanEval chat requests, AVX2 EPYC, 2026-12-07: 0.77 of the answer's tokens with a 32-token
window against 0.85 with the whole prompt, 0.73 with none of it).

:class:`WindowSession` keeps that as position bookkeeping over an ordinary session: it holds the sequence's first
``head`` positions, then positions ``head + skipped`` on, and speaks in sequence positions (its ``length``, what
``rollback`` takes), so the drafters and the rounds run on it unchanged. The draft model reads the kept tail right
after the head (its positions close up); rolling back into the skipped stretch drops the window: the session holds
the head again and its next catch-up feeds the rest of the sequence.

Only the contiguous head (:func:`contiguous_length`) may be written where positions are taken as the sequence's own
(a prefix cache, a batch's draft row).
"""

from __future__ import annotations

import os
from typing import Any

#: Tokens of a sequence's end a windowed draft is fed when it starts (``SPECDEC_DRAFT_WINDOW``; 0: never windowed,
#: for measuring). 32: 16 requests above agreed 0.755 / 0.77 / 0.79 / 0.83 at 16 / 32 / 64 / 128 tokens; at 4.4 ms a
#: token fed, 32 more tokens (0.14 s) buy ~2% more tokens a round, ~0.06 s on a 65-token answer.
WINDOW = int(os.environ.get("SPECDEC_DRAFT_WINDOW", "32"))
#: The share of the whole prompt's saving a window's drafts are counted to save when its start is weighed: at gamma 2,
#: 0.77 of tokens agreeing against 0.85 gives E = 2.36 against 2.56 tokens a round, and a round costing ~1.95 steps
#: (2 drafted at ~0.35 of a step, a 3-token verification ~1.25 steps) saves 0.21 of a step a token against 0.31.
WINDOW_SAVING = 0.68


class WindowSession:
    """``session`` (holding the sequence's first ``session.length`` positions: the head) that will next be fed the
    sequence from position ``head + skipped`` on."""

    def __init__(self, session: Any, skipped: int):
        if skipped <= 0:
            raise ValueError(f"a window skips at least one position, not {skipped}")
        self.inner = session
        self.head = session.length
        self.skipped = skipped

    @property
    def length(self) -> int:
        """Sequence positions covered: the head, the skipped stretch and the tail held after it."""
        return self.inner.length + self.skipped

    @property
    def tokens(self) -> None:
        return None  # (no host copy: the inner session's ids are not the sequence's)

    def rollback(self, length: int) -> None:
        """Keep sequence positions [0, length): inside the tail as bookkeeping, into the skipped stretch (or the head)
        by dropping the window."""
        if length < 0:
            raise ValueError(f"cannot roll back to a negative length {length}")
        if length >= self.head + self.skipped:
            self.inner.rollback(length - self.skipped)
        elif length < self.length:
            self.inner.rollback(min(length, self.head))
            self.skipped = 0

    def __getattr__(self, name: str) -> Any:  # extend, prefill, forward_passes, kv, close, ...: the inner session's
        return getattr(self.inner, name)


def contiguous_length(session: Any) -> int:
    """The positions ``session`` holds as the sequence's own from position 0 (a window's head; else its length)."""
    if isinstance(session, WindowSession) and session.skipped:
        return session.head
    return session.length
