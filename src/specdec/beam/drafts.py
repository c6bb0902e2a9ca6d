"""Drafts for the exact mode: log q for every node of a tree level, from a model or a drafter."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from specdec.beam.batch_kv import BatchKV, best_snapshot
from specdec.drafters.model import fit_width
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, check_same_vocabulary
from specdec.sampling import SamplingParams


class ModelDraft:
    """A draft model running batched beam search with its own KV cache (snapshots per tree level)."""

    def __init__(self, model: LanguageModel, vocab_size: int):
        self.model, self.vocab_size = model, vocab_size
        self.kv = BatchKV(model)
        self.snapshots: list[BatchKV] = []
        self.calls = 0

    def start(self, prompt: torch.Tensor) -> None:
        self.kv, _ = self.kv.forward(prompt[None], 1)
        self.calls += 1

    def begin_round(self) -> None:
        self.snapshots = [self.kv]

    def log_q(self, seqs: torch.Tensor) -> torch.Tensor:
        """seqs [n, L] -> log q [n, V] of the next token."""
        kv, logits = best_snapshot(self.snapshots, seqs).forward(seqs, 1)
        self.snapshots.append(kv)
        self.calls += 1
        return F.log_softmax(fit_width(logits[:, -1].float(), self.vocab_size), dim=-1)

    def end_round(self, running: torch.Tensor) -> None:
        # The new running beams extend nodes of the tree: keep the snapshot that holds the most of them.
        self.kv = best_snapshot(self.snapshots, running)
        self.snapshots = []


class ProbabilityDraft:
    """A parameter-free drafter with probabilities (n-gram, random, ...): q from its ``propose``.

    The drafter sees temperature 1, so the q it returns is its full distribution. An
    :class:`~specdec.drafters.NGramDrafter` is read through its counts instead (``counts_after``,
    ``unigram``, see :meth:`_ngram_q`), so that querying tree nodes does not teach it draft tokens; it
    learns from the leading running beam once per round.
    """

    BACKOFF = 0.1

    def __init__(self, drafter: Any, vocab_size: int, eos: set[int], generator: torch.Generator,
                 device: torch.device):
        from specdec.drafters import DraftContext, NGramDrafter

        self.drafter, self.vocab_size, self.generator = drafter, vocab_size, generator
        self.is_ngram = isinstance(drafter, NGramDrafter)
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

    def begin_round(self) -> None:
        return None

    def _normalised(self, counts: dict[int, int]) -> torch.Tensor | None:
        if not counts:
            return None
        q = torch.zeros(self.vocab_size, device=self.device)
        ids = torch.tensor(list(counts.keys()), dtype=torch.long, device=self.device)
        q[ids] = torch.tensor(list(counts.values()), dtype=torch.float32, device=self.device)
        return q / q.sum()

    def _ngram_q(self, previous: int) -> torch.Tensor:
        """The n-gram's q, with the bigram interpolated with the unigram (weight BACKOFF).

        A bigram seen once has a single successor; a beam of width u needs u candidates, and the
        unigram ranks the rest instead of leaving them to chance. Exactness does not depend on q.
        """
        d = self.drafter
        unigram = self._normalised(dict(d.unigram))
        bigram = self._normalised(d.counts_after(previous)) if d.order == 2 else None
        if bigram is None and unigram is None:
            return self._uniform()
        if bigram is None or unigram is None:
            return bigram if unigram is None else unigram
        return (1.0 - self.BACKOFF) * bigram + self.BACKOFF * unigram

    def _uniform(self) -> torch.Tensor:
        return torch.full((self.vocab_size,), 1.0 / self.vocab_size, device=self.device)

    def log_q(self, seqs: torch.Tensor) -> torch.Tensor:
        rows = []
        for seq in seqs.tolist():
            if self.is_ngram:
                rows.append(self._ngram_q(seq[-1]))
                continue
            before = self._passes
            draft = self.drafter.propose(seq, 1)
            self.calls += self._passes - before
            if draft.q is None:
                raise SpecDecError(
                    f"the draft {getattr(self.drafter, 'name', self.drafter)!r} gives no probabilities, which exact "
                    "speculative beam search needs; use a model, 'bigram' or 'unigram' (or beam_mode='report')"
                )
            rows.append(draft.q[0] if len(draft) else self._uniform())
        return torch.stack(rows).clamp_min(0.0).log()  # [n, V]

    def end_round(self, running: torch.Tensor) -> None:
        if self.is_ngram:  # learn from the leading running beam's new tokens
            self.drafter.propose(running[0].tolist(), 1)


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

