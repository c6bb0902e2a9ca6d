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

from typing import Any, Sequence

import torch

from specdec.devices import RoundClock
from specdec.drafters.base import Draft, DraftContext, Drafter, DrafterStats, StepWidths, merge_widths
from specdec.drafters.model import ModelDrafter
from specdec.models import LanguageModel
from specdec.stats import LevelStats


class SpeculativeDrafter(ModelDrafter):
    """Level-1 drafter: ``model`` proposes tokens by speculative decoding with ``inner`` as its draft.

    inner_gamma: tokens ``inner`` proposes per verification by ``model``.
    Each proposal runs rounds of :func:`specdec.rounds.speculative_round`, the generation's own round one
    level down; ``level`` (:class:`~specdec.stats.LevelStats`) counts them (calls of ``model``, drafted and
    accepted tokens of ``inner``, alpha between the two, time in each). Each round reads back once.
    """

    def __init__(self, model: LanguageModel, inner: Drafter, inner_gamma: int = 4):
        super().__init__(model)
        self.inner = inner
        self.inner_gamma = inner_gamma
        self.name = f"{model.name}<-{inner.name}"
        self.level = LevelStats(level=self.name)

    def start(self, context: DraftContext, session: Any = None) -> None:
        super().start(context, session)  # M_1's session, as for a plain model draft
        # The inner drafter sees the same random source, standardization and device copy of the sequence
        # (this level writes what it emits there, at the positions it drafts for), with M_1's width.
        self.inner.start(context)
        self.level = LevelStats(level=self.name)
        self.clock = RoundClock(context.device)

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        from specdec.rounds import speculative_round  # here: specdec.rounds imports the drafters package

        if k <= 0:
            return Draft.empty(self.context.device)
        ctx = self.context
        t_start = self.clock.mark()
        tokens: list[int] = []  # host copies (each round's read-back) of what M_1 emitted
        emitted: list[torch.Tensor] = []  # the same tokens on the device: [n + 1] per round
        qs: list[torch.Tensor] = []
        prefix = list(sequence)
        pending = self.unseen(prefix)  # [m] what M_1's cache lacks (device ids, read from the context's copy)
        if not isinstance(pending, torch.Tensor):  # no device copy of the sequence: host ids, one upload
            pending = torch.tensor(pending, dtype=torch.long, device=ctx.device)
        while len(tokens) < k:
            kk = k - len(tokens) - 1  # leave room for M_1's own residual/bonus token
            r = speculative_round(self.session, self.inner, prefix, min(self.inner_gamma, kk), pending,
                                  ctx.sampling, ctx.generator, self.clock, width=ctx.vocab_size,
                                  constraint=ctx.constraint)  # M_1's rows masked as the target's will be
            self.level.record_round(r)
            if r.result.p is not None:
                qs.extend(r.result.p[: r.n + 1])  # each emitted token was drawn from M_1's row at its position
            if ctx.sequence_ids is not None:  # the positions the level below reads (the loop overwrites them later)
                ctx.sequence_ids[len(prefix): len(prefix) + r.n + 1] = r.result.tokens[: r.n + 1]
            tokens.extend(r.new)
            prefix.extend(r.new)
            emitted.append(r.result.tokens[: r.n + 1])
            pending = r.result.tokens[r.n: r.n + 1]  # [1] M_1's own token: the one its cache lacks
            if r.refused or any(t in ctx.eos_token_ids for t in r.new):
                break  # nothing after an end-of-sequence token (or a complete grammar) can be accepted
        tokens = tokens[:k]
        self._proposed = (len(sequence), len(tokens))
        self.level.new_tokens += len(tokens)
        self.level.time_total += self.clock.seconds(t_start, self.clock.mark())
        q = torch.stack(qs[: len(tokens)]) if qs else None
        return Draft(torch.cat(emitted)[: len(tokens)], q) if tokens else Draft.empty(ctx.device)  # [k], never uploaded

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
        return DrafterStats([self.level.to_dict(), *below.levels], below.time_convert)

    def close(self) -> None:
        super().close()
        self.inner.close()

    def step_widths(self, gamma: int) -> StepWidths:
        """A level that verifies the level below it runs its pending tokens (the levels above add theirs) plus
        at most gamma - 1 inner drafts: gamma + 1 covers it, narrower steps padded into it. The level below
        is prepared for the same gamma (its pending tokens can be more than two)."""
        return merge_widths({self.model: {1, 2, gamma + 1}}, self.inner.step_widths(gamma))
