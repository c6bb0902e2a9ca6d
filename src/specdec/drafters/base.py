"""The drafter protocol: what speculative decoding needs from a draft (the paper's M_q).

A drafter proposes up to k tokens that continue a sequence, optionally with the distribution q it
sampled each one from, and then hears how many of them the target accepted. A drafter that gives
no probabilities (prompt lookup, for example) counts as a one-hot q on each proposed token: the
target then accepts token x with probability p(x).

A generation calls, in order: ``start(context)``; per round ``propose(sequence, k)`` then
``update(n)``; at its end ``stats()`` and, always (also after an error or a cancellation), ``close()``.
``step_widths(gamma)`` says before any generation which forward widths the drafter's models will run,
so that captured steps can be prepared ahead. :class:`DrafterBase` gives every method but ``propose``
a default; subclass it (an object with only start / propose / update is completed with those defaults).

Drafters may also offer ``distribution`` and ``observe`` (see :class:`DrafterBase`), which exact
speculative beam search uses; they are optional, so they are not part of the :class:`Drafter` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

import torch

from specdec.sampling import SamplingParams

if TYPE_CHECKING:
    from specdec.models import LanguageModel

# step_widths: for each model a drafter runs, the numbers of tokens its forward passes feed.
StepWidths = dict["LanguageModel", set[int]]


@dataclass
class Draft:
    """A proposal. tokens: [k] long (k may be 0); q: [k, V] float32 probabilities, or None (one-hot).

    Both live on the generation's device; a model draft's tokens never visit the host. source: where the tokens
    came from, where a display tells them apart (``"prediction"``: Predicted Outputs); None otherwise.
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None
    source: str | None = None

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "Draft":
        return Draft(torch.empty(0, dtype=torch.long, device=device), None)

    @staticmethod
    def from_ids(ids: Sequence[int], device: torch.device | str, q: torch.Tensor | None = None) -> "Draft":
        """A draft of host token ids (parameter-free drafters), moved to ``device``."""
        return Draft(torch.tensor(list(ids), dtype=torch.long, device=device), q)  # a plain copy: the ids are host memory

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class DraftContext:
    """What a drafter is told when a generation starts.

    prompt_ids: the tokens of the prompt (for a seq2seq target: the encoder input).
    sampling: the target's standardization; a drafter with probabilities applies the same one to q.
    generator: the generation's random source (the only one: seeding happens once, outside the loop).
    vocab_size: V, the width of the target's distributions; q must have this width.
    eos_token_ids: the target's end-of-sequence ids.
    source_ids: for an encoder-decoder target, the encoder input (prompt lookup copies from it too);
      empty for a decoder-only target, whose prompt is already part of the decoded sequence.
    stop_below: the ``confidence`` schedule: a drafter with probabilities stops proposing as soon as
      its top probability for the next token is below this value (None: never stops early).
    device: where the target runs: proposals (tokens and q) must be on it.
    max_positions: the most positions the generation can reach (sizes a model draft's static cache).
    sequence_ids: [max_positions] long on the device: the decoded sequence by position. When ``propose`` is
      called, positions < len(sequence) hold the sequence; the loop writes each round's tokens in place
      (and a hierarchy's level what it emits while it drafts). A model draft feeds the tokens its cache
      lacks from here instead of uploading host ids (None: no device copy, feed the host ids).
    constraint: the generation's :class:`specdec.constraints.Constraint` (None: unconstrained). A drafter that
      samples from a model masks its logits with it at each drafted position (``restrict``) and pushes each
      token it drafts (``push``); any other drafter may ignore it: the loop drops a drafted token the grammar
      refuses, and everything after it, before verification.
    """

    prompt_ids: Sequence[int]
    sampling: SamplingParams
    generator: torch.Generator
    vocab_size: int
    eos_token_ids: frozenset[int] = frozenset()
    source_ids: Sequence[int] = ()
    stop_below: float | None = None
    device: torch.device = torch.device("cpu")
    max_positions: int | None = None
    sequence_ids: torch.Tensor | None = None
    constraint: Any = None

    @cached_property
    def host_generator(self) -> torch.Generator:
        """The random source of drafters that compute on the host (n-gram tables): ``generator`` itself
        when it is a CPU generator; on a GPU a CPU generator seeded from it, so that sampling a host
        distribution needs no trip to the device and back."""
        if self.generator.device.type == "cpu":
            return self.generator
        return torch.Generator().manual_seed(self.generator.initial_seed())


@dataclass
class DrafterStats:
    """What a drafter reports at the end of a generation (merged into :class:`specdec.GenerationStats`).

    levels: one entry per model level of a hierarchy (``GenerationStats.to_dict()`` of that level's own
      verification steps, with its ``level`` name); empty for a one-level drafter.
    time_convert: seconds spent converting between tokenizers (a draft with another tokenizer, at any level).
    """

    levels: list[dict[str, Any]] = field(default_factory=list)
    time_convert: float = 0.0


@runtime_checkable
class Drafter(Protocol):
    name: str
    forward_passes: int  # model forward passes made so far (0 for parameter-free drafts)

    def start(self, context: DraftContext) -> None:
        """Forget the previous generation and prepare for a new one."""

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        """Up to k tokens that continue ``sequence`` (the whole decoder sequence so far):
        Draft(tokens [k'] long, q [k', V] float32 or None), k' <= k, on ``context.device``."""

    def update(self, n_accepted: int) -> None:
        """Feedback after verification: how many of the last proposal's tokens were accepted."""

    def stats(self) -> DrafterStats:
        """This generation's statistics of the drafter's own levels (called before ``close``)."""

    def close(self) -> None:
        """Give back what the generation holds: every level's model sessions, whose static caches return to
        their models' pools. Called at the end of every generation, also on an error or a cancellation;
        idempotent; ``start`` may follow."""

    def step_widths(self, gamma: int) -> StepWidths:
        """{model: the token counts its forward passes feed} when the target asks for up to ``gamma`` tokens
        per round (the prefill aside); {} for a drafter without a model."""


CORE = ("start", "propose", "update")  # what a drafter must write; DrafterBase (or Completed) gives the rest


def merge_widths(*parts: StepWidths) -> StepWidths:
    """The union of several drafters' (or levels') step widths, model by model."""
    merged: StepWidths = {}
    for part in parts:
        for model, widths in part.items():
            merged.setdefault(model, set()).update(widths)
    return merged


class DrafterBase:
    """Default bookkeeping for drafters: stores the context, counts nothing, ignores feedback, holds
    nothing to close, runs no model.

    Two optional methods, used by exact speculative beam search (:mod:`specdec.beam`), which queries
    many sequences that are not the decoded one (the nodes of its draft tree):

    - ``distribution(sequence)``: q [V] of the token after ``sequence`` without learning from it, or
      None when the drafter has none to offer (the default; beam search then calls ``propose``);
    - ``observe(sequence)``: learn from ``sequence``, now the decoded one, without proposing (default:
      nothing).
    """

    name = "drafter"
    forward_passes = 0
    context: DraftContext

    def start(self, context: DraftContext) -> None:
        self.context = context

    def update(self, n_accepted: int) -> None:
        return None

    def stats(self) -> DrafterStats:
        return DrafterStats()

    def close(self) -> None:
        return None

    def step_widths(self, gamma: int) -> StepWidths:
        return {}

    def distribution(self, sequence: Sequence[int]) -> torch.Tensor | None:
        return None

    def observe(self, sequence: Sequence[int]) -> None:
        return None


class Completed(DrafterBase):
    """A drafter object with only ``start`` / ``propose`` / ``update`` (the protocol of earlier releases, or a
    duck-typed class), completed with DrafterBase's ``stats`` / ``close`` / ``step_widths``: it holds nothing
    to close and runs no model that specdec would prepare steps for."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)

    @property
    def forward_passes(self) -> int:  # type: ignore[override]
        return getattr(self.inner, "forward_passes", 0)

    def start(self, context: DraftContext) -> None:
        super().start(context)
        self.inner.start(context)

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        return self.inner.propose(sequence, k)

    def update(self, n_accepted: int) -> None:
        self.inner.update(n_accepted)

    def distribution(self, sequence: Sequence[int]) -> torch.Tensor | None:
        ask = getattr(self.inner, "distribution", None)  # beam search's optional methods, where it has them
        return ask(sequence) if ask is not None else None

    def observe(self, sequence: Sequence[int]) -> None:
        if (tell := getattr(self.inner, "observe", None)) is not None:
            tell(sequence)


class InFront(DrafterBase):
    """A drafter in front of another (``inner``; None: none): the grammar's forced tokens, a prediction. What it
    does not draft itself, ``inner`` does; its model passes, statistics, sessions and step widths are ``inner``'s."""

    inner: Drafter | None = None

    @property
    def forward_passes(self) -> int:  # type: ignore[override]
        return self.inner.forward_passes if self.inner is not None else 0

    def stats(self) -> DrafterStats:
        return self.inner.stats() if self.inner is not None else DrafterStats()

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    def step_widths(self, gamma: int) -> StepWidths:
        return self.inner.step_widths(gamma) if self.inner is not None else {}
