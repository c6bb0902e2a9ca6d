"""Copy from the context (paper Section 3.6): a parameter-free draft for text that repeats itself."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Draft, DrafterBase
from specdec.errors import SpecDecError


def find_continuation(context: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Match the last n tokens of ``context`` earlier in it and return up to k tokens that followed.

    Tries n = max_ngram down to min_ngram and uses the most recent earlier occurrence.

    >>> find_continuation([1, 2, 3, 4, 1, 2], k=2)
    [3, 4]
    >>> find_continuation([5, 6, 7, 5, 6, 8, 5, 6], k=3)   # the most recent match of [5, 6] wins
    [8, 5, 6]
    >>> find_continuation([1, 2, 3], k=2)                  # nothing repeats
    []
    """
    if k <= 0:
        return []
    seq = torch.as_tensor(list(context), dtype=torch.long)  # [L]
    length = seq.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = seq[: length - 1].unfold(0, n, 1)  # [L - n, n]: every n-gram that ends before the last token
        hits = (windows == seq[length - n:]).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return seq[start: start + k].tolist()
    return []


class PromptLookupDrafter(DrafterBase):
    """Proposes the tokens that followed the most recent earlier occurrence of the current suffix.

    Without probabilities: each proposed token counts as a one-hot q, accepted with probability p(x).
    For a seq2seq target the search covers the encoder input too (copying from the source document).
    """

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not (1 <= min_ngram <= max_ngram):
            raise SpecDecError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        context = [*self.context.source_ids, *sequence] if self.context.source_ids else sequence
        tokens = find_continuation(context, k, self.max_ngram, self.min_ngram)
        return Draft.from_ids(tokens, self.context.device)
