"""The drafter protocol: what speculative decoding needs from a draft (the paper's M_q).

A drafter proposes up to k tokens that continue a sequence, optionally with the distribution q it
sampled each one from, and then hears how many of them the target accepted. A drafter that gives
no probabilities (prompt lookup, for example) counts as a one-hot q on each proposed token: the
target then accepts token x with probability p(x).

Drafters may also offer ``distribution`` and ``observe`` (see :class:`DrafterBase`), which exact
speculative beam search uses; they are optional, so they are not part of the :class:`Drafter` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, Sequence, runtime_checkable

import torch

from specdec.sampling import SamplingParams


@dataclass
class Draft:
    """A proposal. tokens: [k] long (k may be 0); q: [k, V] float32 probabilities, or None (one-hot).

    Both live on the generation's device; a model draft's tokens never visit the host.
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "Draft":
        return Draft(torch.empty(0, dtype=torch.long, device=device), None)

    @staticmethod
    def from_ids(ids: Sequence[int], device: torch.device | str, q: torch.Tensor | None = None) -> "Draft":
        """A draft of host token ids (parameter-free drafters), moved to ``device``."""
        return Draft(torch.tensor(list(ids), dtype=torch.long).to(device, non_blocking=True), q)

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

    @cached_property
    def host_generator(self) -> torch.Generator:
        """The random source of drafters that compute on the host (n-gram tables): ``generator`` itself
        when it is a CPU generator; on a GPU a CPU generator seeded from it, so that sampling a host
        distribution needs no trip to the device and back."""
        if self.generator.device.type == "cpu":
            return self.generator
        return torch.Generator().manual_seed(self.generator.initial_seed())


@runtime_checkable
class Drafter(Protocol):
    name: str
    forward_passes: int  # model forward passes made so far (0 for parameter-free drafts)

    def start(self, context: DraftContext) -> None:
        """Forget the previous generation and prepare for a new one."""

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        """Up to k tokens that continue ``sequence`` (the whole decoder sequence so far)."""

    def update(self, n_accepted: int) -> None:
        """Feedback after verification: how many of the last proposal's tokens were accepted."""


class DrafterBase:
    """Default bookkeeping for drafters: stores the context, counts nothing, ignores feedback.

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

    def distribution(self, sequence: Sequence[int]) -> torch.Tensor | None:
        return None

    def observe(self, sequence: Sequence[int]) -> None:
        return None
