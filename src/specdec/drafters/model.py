"""A smaller language model as the draft (the paper's main setting)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specdec.drafters.base import Draft, DraftContext, DrafterBase, StepWidths
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
    pad = torch.full((*x.shape[:-1], width - have), float("-inf"), dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=-1)


class SessionDrafter(DrafterBase):
    """A drafter that runs a model through one session per generation (a model draft, one with another
    tokenizer): its forward passes are the session's, and closing gives the session's cache back."""

    session = None

    @property
    def forward_passes(self) -> int:  # type: ignore[override]
        return 0 if self.session is None else self.session.forward_passes

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def draft_token(logits: torch.Tensor, vocab_size: int, sampling: Any, generator: Any,
                stop_below: float | None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """One drafted token from a draft model's logits [V'] (fitted to the target's V): (token [] long on the
    device, q [V] or None when greedy: q is one-hot on the argmax), or None where the confidence schedule
    stops drafting (its max probability below ``stop_below``: a host sync, that schedule only). The one
    rule of :class:`ModelDrafter` and of the batch engine's draft rows."""
    logits = fit_width(logits, vocab_size)
    if sampling.greedy:
        if stop_below is not None and torch.softmax(logits.float(), -1).max() < stop_below:
            return None
        return argmax(logits), None
    q = standardize(logits, sampling)  # [V]
    if stop_below is not None and q.max() < stop_below:
        return None
    return sample(q, generator), q


class ModelDrafter(SessionDrafter):
    """Samples gamma tokens autoregressively from a small model (Algorithm 1, lines 2-5).

    Its KV cache persists across steps. Between proposals it holds a prefix of the decoded sequence
    (all of it but the last one or two tokens); :meth:`update` rolls it back to the accepted part,
    so each step costs k single-token forward passes, the first one also feeding what the draft has
    not seen yet (the target's token, and the last draft token when all were accepted).
    The drafted tokens stay on the device: the next forward pass reads the sampled token directly.
    """

    def __init__(self, model: LanguageModel):
        self.model = model
        self.name = model.name
        self.session = None
        self._proposed: tuple[int, int] | None = None  # (sequence length, k) of the last proposal

    def start(self, context: DraftContext, session: Any = None) -> None:
        """Open this generation's session and cache the prompt but its last token; ``session``: one that holds a
        prefix of the sequence already (a batch row going on alone, :mod:`specdec.batch.alone`): no prefill,
        the first proposal catches up what it lacks."""
        super().start(context)
        self.close()
        if session is None:
            self.session, sequence = self.model.start(context.prompt_ids, context.max_positions)
            self.session.prefill(sequence[:-1])  # the last token is fed by the first proposal
        else:
            self.session = session
        self._proposed = None

    def unseen(self, sequence: Sequence[int]) -> torch.Tensor | list[int]:
        """What the cache lacks of ``sequence``: [m] ids (after a round the verifier's token, and the last
        drafted one when all were accepted; after plain rounds more), read from the context's device copy
        of the sequence, so nothing is uploaded (host ids where there is no device copy)."""
        if self.context.sequence_ids is not None:
            return self.context.sequence_ids[self.session.length: len(sequence)]
        return list(sequence[self.session.length:])

    def catch_up(self, sequence: Sequence[int]) -> torch.Tensor:
        """Feed what the cache lacks of ``sequence``; logits [V] predicting the token after it."""
        return self.session.extend(self.unseen(sequence), 1)[0]

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return Draft.empty(self.context.device)
        ctx = self.context
        tokens: list[torch.Tensor] = []  # [] long each, on the device
        qs: list[torch.Tensor] = []
        logits = self.catch_up(sequence)  # [V]
        constraint = ctx.constraint
        depth = constraint.depth_of(len(sequence)) if constraint is not None else 0
        for i in range(k):
            if constraint is not None:  # q gets the target's mask at the same position (a host sync per token)
                logits = constraint.restrict(fit_width(logits, ctx.vocab_size), depth + i)
                if not bool(torch.isfinite(logits).any()):
                    break  # nothing the grammar allows is in this draft's vocabulary (a cut head)
            drafted = draft_token(logits, ctx.vocab_size, ctx.sampling, ctx.generator, ctx.stop_below)
            if drafted is None:
                break
            x, q = drafted
            if constraint is not None and not constraint.push(depth + i, int(x)):
                break
            if q is not None:
                qs.append(q)
            tokens.append(x)
            if i + 1 < k:
                logits = self.session.extend(x.reshape(1), 1)[0]  # the sampled token, straight from the device
        self._proposed = (len(sequence), len(tokens))
        if not tokens:
            return Draft.empty(ctx.device)
        return Draft(torch.stack(tokens), torch.stack(qs) if qs else None)

    def update(self, n_accepted: int) -> None:
        """Keep the sequence and the accepted draft tokens; the cache never holds the last drafted one."""
        if self._proposed is not None:
            length, k = self._proposed
            self.session.rollback(length + min(n_accepted, max(k - 1, 0)))
            self._proposed = None

    def forget_proposal(self) -> None:
        """A captured round (specdec.round_graph) drafted and rolled the session back itself: nothing to update."""
        self._proposed = None

    def step_widths(self, gamma: int) -> StepWidths:
        """One token per drafted token; the first step of a round also feeds the target's token and, after
        a fully accepted round, the last drafted one (2). A longer catch-up (after plain rounds) runs wider."""
        return {self.model: {1, 2}}

    def truncate(self, length: int) -> None:
        """Forget cached positions from ``length`` on: a level above rejected what they held."""
        self._proposed = None
        if self.session is not None and self.session.length > length:
            self.session.rollback(length)
