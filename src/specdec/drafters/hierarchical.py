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

import time
from typing import Sequence

import torch

from specdec.acceptance import acceptance_probability, greedy_verification, speculative_sampling
from specdec.drafters.base import Draft, DraftContext, Drafter
from specdec.drafters.model import ModelDrafter, fit_width
from specdec.models import LanguageModel
from specdec.sampling import standardize
from specdec.stats import GenerationStats


class SpeculativeDrafter(ModelDrafter):
    """Level-1 drafter: ``model`` proposes tokens by speculative decoding with ``inner`` as its draft.

    inner_gamma: tokens ``inner`` proposes per verification by ``model``.
    ``stats`` counts this level's own verification steps (calls of ``model``, drafted/accepted tokens
    of ``inner``, alpha between ``model`` and ``inner``, time in ``inner`` and in ``model``).
    """

    def __init__(self, model: LanguageModel, inner: Drafter, inner_gamma: int = 4):
        super().__init__(model)
        self.inner = inner
        self.inner_gamma = inner_gamma
        self.name = f"{model.name}<-{inner.name}"
        self.stats = GenerationStats()

    def start(self, context: DraftContext) -> None:
        super().start(context)  # M_1's session, as for a plain model draft
        # The inner drafter sees the same random source and standardization, with M_1's width.
        self.inner.start(context)
        self.stats = GenerationStats()

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        ctx = self.context
        greedy = ctx.sampling.greedy
        t_start = time.perf_counter()
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        while len(tokens) < k:
            prefix = list(sequence) + tokens
            kk = k - len(tokens) - 1  # leave room for M_1's own residual/bonus token
            t0 = time.perf_counter()
            if kk > 0:
                before = self.inner.forward_passes
                inner = self.inner.propose(prefix, min(self.inner_gamma, kk))
                self.stats.draft_calls += self.inner.forward_passes - before
            else:
                inner = Draft.empty()
            t1 = time.perf_counter()
            g = len(inner)
            logits = fit_width(self.session.forward(prefix + inner.tokens.tolist(), g + 1), ctx.vocab_size)  # [g+1, V]
            self.stats.time_draft += t1 - t0
            self.stats.time_target += time.perf_counter() - t1
            if greedy:
                argmax = logits.argmax(-1)  # [g + 1]
                new, n = greedy_verification(argmax, inner.tokens)
                m = min(n + 1, g)
                betas = (argmax[:m] == inner.tokens[:m]).float().tolist()
            else:
                p1 = standardize(logits, ctx.sampling)  # [g + 1, V]: M_1's distribution at each position
                new, n = speculative_sampling(p1, inner.q, inner.tokens, ctx.generator)
                m = min(n + 1, g)
                betas = acceptance_probability(p1[:m], None if inner.q is None else inner.q[:m], inner.tokens[:m]).tolist()
                qs.extend(p1[: n + 1])  # each emitted token was drawn from M_1's row at its position
            self.stats.record_step(g, n, betas)
            self.inner.update(n)
            tokens.extend(new.tolist())
            if any(t in ctx.eos_token_ids for t in new.tolist()):
                break  # nothing after an end-of-sequence token can be accepted
        tokens = tokens[:k]
        self.stats.new_tokens += len(tokens)
        self.stats.time_total += time.perf_counter() - t_start
        q = torch.stack(qs[: len(tokens)]) if qs else None
        return Draft(torch.tensor(tokens, dtype=torch.long), q)

    def level_stats(self) -> list[dict]:
        """Statistics of this level, then of the levels below it."""
        mine = {"level": self.name, **self.stats.to_dict()}
        below = self.inner.level_stats() if hasattr(self.inner, "level_stats") else []
        return [mine, *below]
