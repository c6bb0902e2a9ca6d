"""Copying first in a batch: a model-drafted row whose output repeats its context drafts by copying this round.

A lone row drafts with the whole served draft, copying first in front of the 0.5B under prompt lookup
(:mod:`specdec.batch.alone`); the rows of a batch draft with its model alone, or nothing where the batch's measured
costs say plain rounds pay more (:mod:`specdec.batch.speculation`). Each round, a model-drafted row whose last tokens
occur earlier in its sequence (:func:`~specdec.drafters.copying.find_copy`) proposes what followed them there instead
of the model's draft: the k of :func:`~specdec.drafters.copying.best_copy` (Theorem 8 with a free draft) over the
batch's measured pass times, N the tokens the round's pass feeds without the copy (this row's one among them), at the
row's copies' own acceptance, their first token's and each later one's, learnt from what its rounds wrote past each
copy found, proposed or passed over (``row.copying``, a :class:`~specdec.drafters.copying.CopyAcceptance`: the
one-sequence engine's rule). It copies only where that beats the model's draft: more tokens expected than the model's
gamma gives at its alpha. Only where the
batch's sequences are packed into a pass (:attr:`~specdec.models.sessions.batch_session.BatchSession.packed`): a copy
costs its own tokens there, padded it would make every row as wide. A copy is a one-hot draft (q None), verified as any
other: the output is exact at every temperature. Only with ``speculation="measured"`` (with ``"rows"`` a seeded
sampled row draws what it draws alone, so its drafts stay its own).
"""

from __future__ import annotations

from typing import Any

from specdec.analysis import expected_tokens
from specdec.batch.row import MODEL, PAD, BatchRow
from specdec.batch.speculation import BATCH_MARGIN
from specdec.drafters.base import Draft
from specdec.drafters.copying import MAX_COPY, CopyAcceptance, best_copy, find_copy


def copy_reach(policy: Any, alpha: float, fed: int, top: int, first: float | None = None) -> int:
    """The k in 0..top that maximizes (S - 1 + copy_tokens(first, alpha, k)) / T(fed + k) (S = fed; ``first`` the
    first copied token's acceptance, None: alpha, E(alpha, k)), from the batch's measured pass times
    (``policy.target_time``), where that rate beats the pass without the copy, S / T(fed), by BATCH_MARGIN (else 0:
    at 8 rows of completions copies accepted 56% of the time made 0.95x plain rows' tokens a second without it); 0
    before two pass sizes are measured."""
    times = policy.target_time
    if len(times) < 2 or top <= 0:
        return 0
    k, rate = best_copy(alpha, top, times.at, fed, first=first)
    plain = times.at(fed)
    return k if plain and rate >= (1 + BATCH_MARGIN) * fed / plain else 0


def propose_copies(engine: Any, rows: list[BatchRow], ks: list[int],
                   skip: dict[int, Any]) -> tuple[list[int], dict[int, Draft]]:
    """(the round's gammas with 0 for the rows that copy, {row index: its copy}) for the model-drafted rows not in
    ``skip`` (those drafting from their prediction)."""
    copies: dict[int, Draft] = {}
    policy = engine.gamma_policy
    if engine.speculation != "measured" or not policy.packed or policy.vetoes(len(rows)):
        return ks, copies  # (padded, a long copy would make every row of the pass as wide; where drafting rounds gave
        # less than plain ones at this many rows, none; a lone row in the batch copies too: alone.stays_in_batch)
    fed = sum(k + 1 for k in ks)
    for i, row in enumerate(rows):
        if row.draft != MODEL or i in skip:
            continue
        room = row.limit - (len(row.sequence) - row.start_len) - 1  # n accepted + 1 target token must fit
        top = min(MAX_COPY, PAD - 1, room)
        if row.copying is None:
            row.copying = CopyAcceptance(policy.decay)
        acceptance = row.copying
        acceptance.check(row.sequence)  # (how far the copy found last time, proposed or passed over, held)
        found = find_copy(row.sequence, top)
        if not found:
            continue
        acceptance.remember(len(row.sequence), found)
        k = min(copy_reach(policy, acceptance.later.value, fed, len(found), acceptance.first.value), len(found))
        if k <= 0 or acceptance.tokens(k) <= (
                expected_tokens(min(row.alpha.value, 1 - 1e-6), ks[i]) if ks[i] > 0 else 1.0):
            continue
        copies[i] = Draft.from_ids(found[:k], row.target.device)
        fed += k  # (the next row's copy is weighed against the pass this one widened)
    return [0 if i in copies else k for i, k in enumerate(ks)], copies
