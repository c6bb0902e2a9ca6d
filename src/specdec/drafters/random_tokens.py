"""Random tokens (paper Section 3.6): the weakest possible draft, which still never hurts exactness."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Draft, DraftContext, DrafterBase


class RandomDrafter(DrafterBase):
    """Proposes tokens uniformly at random over the tokenizer's real tokens; q is that uniform law.

    A token x is then accepted with probability min(1, p(x) * n_tokens).
    """

    name = "random"

    def __init__(self, n_tokens: int | None = None):
        self.n_tokens = n_tokens

    def start(self, context: DraftContext) -> None:
        super().start(context)
        n = min(self.n_tokens or context.vocab_size, context.vocab_size)
        self._q = torch.zeros(context.vocab_size, device=context.device)  # [V]
        self._q[:n] = 1.0 / n
        self._n = n

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return Draft.empty(self.context.device)
        tokens = torch.randint(0, self._n, (k,), generator=self.context.generator, device=self.context.device)  # [k]
        return Draft(tokens, self._q.expand(k, -1))
