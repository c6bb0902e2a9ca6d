"""Drafts for the exact mode: log q for every node of a tree level, from a model or a drafter."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from specdec.beam.batch_kv import BatchKV
from specdec.drafters.model import fit_width
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, check_same_vocabulary
from specdec.sampling import SamplingParams


class ModelDraft:
    """A draft model running batched beam search on its own :class:`BatchKV`.

    Level k's sequences extend level k - 1's: the cache gathers their parents' rows and feeds one
    token. The next round's roots (the target's running beams) continue from the rows sharing their
    longest prefix, and only the rest is fed.
    """

    def __init__(self, model: LanguageModel, vocab_size: int, capacity: int):
        self.model, self.vocab_size = model, vocab_size
        self.kv = BatchKV(model, capacity)
        self.calls = 0

    def start(self, prompt: torch.Tensor) -> None:
        self.kv.forward(prompt[None], 1)
        self.calls += 1

    def log_q(self, seqs: torch.Tensor) -> torch.Tensor:
        """seqs [n, L] -> log q [n, V] of the next token."""
        logits = self.kv.forward(seqs, 1)  # [n, 1, V]
        self.calls += 1
        return F.log_softmax(fit_width(logits[:, -1].float(), self.vocab_size), dim=-1)

    def end_round(self, running: torch.Tensor) -> None:
        return None  # the next round's log_q(roots) reuses what the rows hold


class ProbabilityDraft:
    """A parameter-free drafter with probabilities (n-gram, random, ...).

    q of a tree node is the drafter's ``distribution(sequence)`` when it offers one (an
    :class:`~specdec.drafters.NGramDrafter`: its smoothed q, and querying the nodes does not teach it
    draft tokens), else the q of ``propose(sequence, 1)`` at temperature 1 (its full distribution).
    Once per round the drafter learns from the leading running beam (``observe``).
    """

    def __init__(self, drafter: Any, vocab_size: int, eos: set[int], generator: torch.Generator,
                 device: torch.device):
        from specdec.drafters import DraftContext

        self.drafter, self.vocab_size, self.generator = drafter, vocab_size, generator
        self.eos = frozenset(eos)
        self.device = device
        self._context = DraftContext
        self.calls = 0

    @property
    def _passes(self) -> int:
        return int(getattr(self.drafter, "forward_passes", 0) or 0)

    def start(self, prompt: torch.Tensor) -> None:
        sampling = SamplingParams(temperature=1.0)  # q is then the drafter's full distribution
        self.drafter.start(self._context(prompt.tolist(), sampling, self.generator, self.vocab_size, self.eos,
                                         device=self.device))

    def _q(self, seq: list[int]) -> torch.Tensor:
        """q [V] of the token after seq."""
        distribution = getattr(self.drafter, "distribution", None)
        q = distribution(seq) if distribution is not None else None
        if q is not None:
            return q
        before = self._passes
        draft = self.drafter.propose(seq, 1)
        self.calls += self._passes - before
        if draft.q is None:
            raise SpecDecError(
                f"the draft {getattr(self.drafter, 'name', self.drafter)!r} gives no probabilities, which exact "
                "speculative beam search needs; use a model, 'bigram' or 'unigram' (or beam_mode='report')"
            )
        if len(draft):
            return draft.q[0]
        return torch.full((self.vocab_size,), 1.0 / self.vocab_size, device=self.device)

    def log_q(self, seqs: torch.Tensor) -> torch.Tensor:
        """seqs [n, L] -> log q [n, V] of the next token."""
        return torch.stack([self._q(seq) for seq in seqs.tolist()]).clamp_min(0.0).log()  # [n, V]

    def end_round(self, running: torch.Tensor) -> None:
        observe = getattr(self.drafter, "observe", None)
        if observe is not None:  # learn from the leading running beam's new tokens
            observe(running[0].tolist())


def make_beam_draft(draft: Any, target: LanguageModel, mode: str):
    """Normalise ``draft`` into (kind, object): ("model", LanguageModel) or ("drafter", Drafter)."""
    from specdec.drafters import ModelDrafter, PromptLookupDrafter, make_drafter

    if draft is None:
        return None, None
    if isinstance(draft, LanguageModel):
        model = draft
    elif isinstance(draft, ModelDrafter):
        model = draft.model
    else:
        drafter = make_drafter(draft, target)
        if isinstance(drafter, ModelDrafter):
            model = drafter.model
        else:
            if mode == "exact" and isinstance(drafter, PromptLookupDrafter):
                raise SpecDecError(
                    "prompt lookup gives no probabilities, which exact speculative beam search needs to run the "
                    "draft's own beam search; use a draft model, 'bigram' or 'unigram' (or beam_mode='report')"
                )
            return "drafter", drafter
    if model.is_encoder_decoder:
        raise SpecDecError("beam search supports decoder-only models; the draft is an encoder-decoder model")
    check_same_vocabulary(target, model)
    return "model", model

