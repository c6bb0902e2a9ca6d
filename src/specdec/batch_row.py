"""One sequence of a batch (:mod:`specdec.batching`): what the batch engine keeps per row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import DrafterBase
from specdec.models import LanguageModel
from specdec.stats import GenerationStats
from specdec.text import StopScan

MODEL = "model"  # a row's draft: the engine's draft model


@dataclass(eq=False)
class BatchRow:
    """One sequence of the batch: what :func:`specdec.decoding.append_tokens` and ``finish_output`` read (the same fields
    as a single generation), plus its draft and its place in the batch."""

    target: LanguageModel
    prompt_ids: list[int]
    config: GenerationConfig
    draft: Any  # None (plain), MODEL, or a parameter-free Drafter of its own
    drafter: Any  # what finish_output asks for stats(): the row's drafter (None for a plain row)
    schedule: Any
    sequence: list[int]
    ids: torch.Tensor  # [max positions] the sequence on the device
    start_len: int
    limit: int
    generator: torch.Generator
    eos: set[int]
    stats: GenerationStats
    on_tokens: Callable[[list[int], list[bool]], None] | None
    on_round: Callable[[Any], None] | None
    t_start: float
    from_draft: list[bool] = field(default_factory=list)
    stop_scan: StopScan | None = None
    stop_text: str | None = None
    proposed: tuple[int, int] | None = None  # (sequence length, k) of the model draft's last proposal
    output: Any = None  # the GenerationOutput once done
    error: BaseException | None = None  # what ended it early (a callback raised: the client left, ...)
    carried: torch.Tensor | None = None  # [1, V] its last position's logits from its prefill (its first round only)
    cancelled: str | None = None
    finish: Any = None  # the server's: the response payload of a finished row
    constraint: Any = None  # structured output: the row's specdec.constraints.Constraint

    @property
    def done(self) -> bool:
        return self.output is not None or self.error is not None


class ModelRowDrafter(DrafterBase):
    """What a row drafted by the engine's model reports (the batched draft session is the engine's)."""

    def __init__(self, name: str):
        self.name = name
