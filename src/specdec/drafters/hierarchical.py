"""Hierarchical speculative decoding: a model draft that is itself accelerated by a cheaper draft.

The report's Algorithm 3 (three models), generalised to any depth: level 0 is the target, level 1 a
draft model M_1, level 2 a cheaper draft M_2 (a smaller model, prompt lookup, a bigram...), and so
on. To propose k tokens, level 1 runs speculative decoding itself, verifying level 2's proposals with
speculative sampling. Every token it emits is an exact sample from M_1's standardized distribution,
and M_1 computed that distribution while verifying, so those rows are exactly the q the target
needs. The target then verifies them as usual: its output follows p exactly, whatever the depth.

    specdec.generate(target, prompt, draft=[draft_model, "prompt-lookup"])
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.acceptance import verify
from specdec.devices import RoundClock
from specdec.drafters.base import Draft, DraftContext, Drafter, DrafterStats, StepWidths, merge_widths
from specdec.drafters.model import ModelDrafter, fit_width
from specdec.models import LanguageModel
from specdec.stats import GenerationStats


class SpeculativeDrafter(ModelDrafter):
    """Level-1 drafter: ``model`` proposes tokens by speculative decoding with ``inner`` as its draft.

    inner_gamma: tokens ``inner`` proposes per verification by ``model``.
    ``round_stats`` counts this level's own verification steps (calls of ``model``, drafted/accepted tokens
    of ``inner``, alpha between ``model`` and ``inner``, time in ``inner`` and in ``model``). Each of
    its rounds reads the number of accepted tokens back from the device (one sync per inner round).
    """

    def __init__(self, model: LanguageModel, inner: Drafter, inner_gamma: int = 4):
        super().__init__(model)
        self.inner = inner
        self.inner_gamma = inner_gamma
        self.name = f"{model.name}<-{inner.name}"
        self.round_stats = GenerationStats()

    def start(self, context: DraftContext) -> None:
        super().start(context)  # M_1's session, as for a plain model draft
        # The inner drafter sees the same random source and standardization, with M_1's width.
        self.inner.start(context)
        self.round_stats = GenerationStats()
        self.clock = RoundClock(context.device)

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return Draft.empty(self.context.device)
        ctx = self.context
        clock = self.clock
        t_start = clock.mark()
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        prefix = list(sequence)
        while len(tokens) < k:
            kk = k - len(tokens) - 1  # leave room for M_1's own residual/bonus token
            t0 = clock.mark()
            if kk > 0:
                before = self.inner.forward_passes
                inner = self.inner.propose(prefix, min(self.inner_gamma, kk))
                self.round_stats.draft_calls += self.inner.forward_passes - before
            else:
                inner = Draft.empty(ctx.device)
            t1 = clock.mark()
            g = len(inner)
            pending = torch.tensor(prefix[self.session.length:], dtype=torch.long).to(ctx.device, non_blocking=True)
            logits = self.session.extend(torch.cat([pending, inner.tokens]), g + 1)  # [g + 1, V]
            result = verify(fit_width(logits, ctx.vocab_size), inner.tokens, inner.q, ctx.sampling, ctx.generator)
            new, n, betas = result.read()
            t2 = clock.mark()
            self.session.rollback(len(prefix) + n)  # M_1 keeps the accepted inner tokens, not its own
            if result.p is not None:
                qs.extend(result.p[: n + 1])  # each emitted token was drawn from M_1's row at its position
            self.round_stats.time_draft += clock.seconds(t0, t1)
            self.round_stats.time_target += clock.seconds(t1, t2)
            self.round_stats.record_step(g, n, betas)
            self.inner.update(n)
            tokens.extend(new)
            prefix.extend(new)
            if any(t in ctx.eos_token_ids for t in new):
                break  # nothing after an end-of-sequence token can be accepted
        tokens = tokens[:k]
        self._proposed = (len(sequence), len(tokens))
        self.round_stats.new_tokens += len(tokens)
        self.round_stats.time_total += clock.seconds(t_start, clock.mark())
        q = torch.stack(qs[: len(tokens)]) if qs else None
        return Draft.from_ids(tokens, ctx.device, q)

    def update(self, n_accepted: int) -> None:
        """Roll back this level, and every level below it to what the level above accepted.

        The levels below were fed this level's whole proposal while it was being drafted; the part
        that the level above rejected must leave their caches too.
        """
        if self._proposed is not None:
            length, _ = self._proposed
            self.truncate_below(length + n_accepted)
        super().update(n_accepted)

    def truncate(self, length: int) -> None:
        super().truncate(length)
        self.truncate_below(length)

    def truncate_below(self, length: int) -> None:
        if isinstance(self.inner, ModelDrafter):
            self.inner.truncate(length)

    def stats(self) -> DrafterStats:
        """This level's statistics, then the levels' below it."""
        below = self.inner.stats()
        return DrafterStats([{"level": self.name, **self.round_stats.to_dict()}, *below.levels], below.time_convert)

    def close(self) -> None:
        super().close()
        self.inner.close()

    def step_widths(self, gamma: int) -> StepWidths:
        """A level that verifies the level below it runs its pending tokens (the levels above add theirs) plus
        at most gamma - 1 inner drafts: gamma + 1 covers it, narrower steps padded into it. The level below
        is prepared for the same gamma (its pending tokens can be more than two)."""
        return merge_widths({self.model: {1, 2, gamma + 1}}, self.inner.step_widths(gamma))
