"""Unigram and bigram drafts (paper Section 3.6 and Table 3): negligible-cost table lookups.

Counts come from a corpus you give (a text tokenized with the target's tokenizer: a fixed model) or,
by default, from the prompt, with the generated tokens added to the counts as decoding goes on. The counts are
turned into logits log(count) and standardized like the target's logits, so temperature, top-k and
top-p act on q exactly as on p.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Sequence

import torch

from specdec.drafters.base import Draft, DraftContext, DrafterBase
from specdec.sampling import sample, standardize

BACKOFF = 0.1  # weight of the unigram in distribution()'s interpolation with the bigram


class NGramDrafter(DrafterBase):
    """An n-gram model with n = 1 (unigram) or n = 2 (bigram, backing off to the unigram).

    >>> d = NGramDrafter(order=2, corpus_ids=[7, 8, 7, 8, 7, 9])
    >>> d.counts_after(7)   # after 7: twice 8, once 9
    {8: 2, 9: 1}
    """

    def __init__(self, order: int = 2, corpus_ids: Iterable[int] | None = None):
        if order not in (1, 2):
            raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order}")
        self.order = order
        self.name = "unigram" if order == 1 else "bigram"
        self.corpus_ids = list(corpus_ids) if corpus_ids is not None else None
        self._fit(self.corpus_ids or [])

    @classmethod
    def from_text(cls, text: str, tokenizer, order: int = 2) -> "NGramDrafter":
        return cls(order, tokenizer(text, add_special_tokens=False)["input_ids"])

    def _fit(self, ids: Sequence[int]) -> None:
        self.unigram: Counter[int] = Counter()
        self.bigram: defaultdict[int, Counter[int]] = defaultdict(Counter)
        self._observe(ids)

    def _observe(self, ids: Sequence[int], previous: int | None = None) -> None:
        for token in ids:
            self.unigram[token] += 1
            if previous is not None:
                self.bigram[previous][token] += 1
            previous = token

    def counts_after(self, token: int) -> dict[int, int]:
        return dict(sorted(self.bigram[token].items())) if token in self.bigram else {}

    def start(self, context: DraftContext) -> None:
        super().start(context)
        # A corpus gives a fixed model; without one, counts come from the prompt and grow with the
        # generated tokens.
        self._fit(self.corpus_ids if self.corpus_ids is not None else list(context.prompt_ids))
        self._last_len = len(context.prompt_ids)

    def _logits(self, previous: int) -> torch.Tensor:
        """log(count) [V] of the tokens after ``previous`` (the bigram, else the unigram), on the host."""
        counts = self.bigram.get(previous) if self.order == 2 else None
        if not counts:
            counts = self.unigram
        logits = torch.full((self.context.vocab_size,), float("-inf"))  # [V]
        if counts:
            ids = torch.tensor(list(counts.keys()), dtype=torch.long)
            logits[ids] = torch.tensor(list(counts.values()), dtype=torch.float32).log()
        else:  # nothing observed yet: uniform
            logits.zero_()
        return logits

    def observe(self, sequence: Sequence[int]) -> None:
        """Learn from the tokens ``sequence`` added since the last call (or proposal); without a corpus only."""
        if self.corpus_ids is None and len(sequence) > self._last_len:
            self._observe(sequence[self._last_len:], previous=sequence[self._last_len - 1] if self._last_len else None)
        self._last_len = len(sequence)

    def distribution(self, sequence: Sequence[int]) -> torch.Tensor:
        """The smoothed q [V] of the token after ``sequence``, without learning from it.

        This is the q speculative beam search ranks the draft's candidates with
        (:mod:`specdec.beam`): the bigram's counts after the last token interpolated with the unigram's
        (weight BACKOFF), each normalised. A bigram seen once has a single successor, and a beam of
        width u needs u candidates: the unigram ranks the rest instead of leaving them to chance.
        ``propose`` samples from the unsmoothed back-off q instead (the bigram, else the unigram).
        """
        ctx = self.context
        unigram = self._normalised(self.unigram)
        bigram = self._normalised(self.counts_after(sequence[-1])) if self.order == 2 and sequence else None
        if bigram is None or unigram is None:
            q = bigram if unigram is None else unigram
            return q if q is not None else torch.full((ctx.vocab_size,), 1.0 / ctx.vocab_size, device=ctx.device)
        return (1.0 - BACKOFF) * bigram + BACKOFF * unigram

    def _normalised(self, counts: dict[int, int]) -> torch.Tensor | None:
        """counts as probabilities [V] on the generation's device; None when there are none."""
        if not counts:
            return None
        device = self.context.device
        q = torch.zeros(self.context.vocab_size, device=device)
        ids = torch.tensor(list(counts.keys()), dtype=torch.long, device=device)
        q[ids] = torch.tensor(list(counts.values()), dtype=torch.float32, device=device)
        return q / q.sum()

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return Draft.empty(self.context.device)
        self.observe(sequence)  # learn from the tokens added since the last proposal
        ctx = self.context
        tokens, qs = [], []
        previous = sequence[-1]
        # The table lives on the host, and so does this loop: on a GPU the proposal goes over in one copy.
        for _ in range(k):
            q = standardize(self._logits(previous), ctx.sampling)  # [V], host
            if ctx.stop_below is not None and q.max() < ctx.stop_below:
                break
            x = int(q.argmax()) if ctx.sampling.greedy else int(sample(q, ctx.host_generator))
            tokens.append(x)
            qs.append(q)
            previous = x
        if not tokens:
            return Draft.empty(ctx.device)
        return Draft.from_ids(tokens, ctx.device, torch.stack(qs).to(ctx.device))
