"""A smaller language model as the draft (the paper's main setting)."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Draft, DraftContext, DrafterBase
from specdec.models import LanguageModel
from specdec.sampling import argmax, sample, standardize


def fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Cut or zero-pad the last dimension of logits or probabilities to the target's width V.

    Models of one family can pad their embedding tables differently; the extra ids are never real
    tokens. Padding logits uses -inf so that the padded ids get probability 0.
    """
    have = x.shape[-1]
    if have == width:
        return x
    if have > width:
        return x[..., :width]
    pad = torch.full((*x.shape[:-1], width - have), float("-inf"), dtype=x.dtype)
    return torch.cat([x, pad], dim=-1)


class ModelDrafter(DrafterBase):
    """Samples gamma tokens autoregressively from a small model (Algorithm 1, lines 2-5).

    Its KV cache persists across steps and is rolled back to the accepted prefix, so each step
    costs about k single-token forward passes of the draft.
    """

    def __init__(self, model: LanguageModel):
        self.model = model
        self.name = model.name
        self.session = None

    @property
    def forward_passes(self) -> int:  # type: ignore[override]
        return 0 if self.session is None else self.session.forward_passes

    def start(self, context: DraftContext) -> None:
        super().start(context)
        self.session, _ = self.model.start(context.prompt_ids)

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        ctx = self.context
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(k):
            logits = fit_width(self.session.forward(list(sequence) + tokens, 1)[0], ctx.vocab_size)  # [V]
            if ctx.sampling.greedy:
                if ctx.stop_below is not None and torch.softmax(logits.float(), -1).max() < ctx.stop_below:
                    break
                x = int(argmax(logits))
            else:
                q = standardize(logits, ctx.sampling)  # [V]
                if ctx.stop_below is not None and q.max() < ctx.stop_below:
                    break
                x = int(sample(q, ctx.generator))
                qs.append(q)
            tokens.append(x)
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.stack(qs) if qs else None)
