"""Predicted Outputs in a batch (:mod:`specdec.drafters.prediction`): a row whose output is on its prediction
drafts from it this round, as many tokens as its :meth:`~specdec.drafters.prediction.PredictionDrafter.reach`
says (within the batch's widest pass), in place of its draft; elsewhere its draft drafts as usual."""

from __future__ import annotations

from typing import Any

from specdec.batch.row import PAD, BatchRow


def propose_predictions(rows: list[BatchRow], ks: list[int]) -> tuple[list[int], dict[int, Any]]:
    """(the rounds' gammas with 0 for the rows drafted from their prediction, {row index: its prediction's draft})."""
    predicted: dict[int, Any] = {}
    for i, row in enumerate(rows):
        if row.prediction is None:
            continue
        room = row.limit - (len(row.sequence) - row.start_len) - 1  # n accepted + 1 target token must fit
        k = min(row.prediction.reach(row.sequence, ks[i]), PAD - 1, room)
        draft = row.prediction.propose(row.sequence, k) if k > 0 else None
        if draft is not None and len(draft):
            predicted[i] = draft
    return [0 if i in predicted else k for i, k in enumerate(ks)], predicted
