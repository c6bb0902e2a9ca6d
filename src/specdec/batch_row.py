"""One sequence of a batch (:mod:`specdec.batching`): what the batch engine keeps per row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.drafters.base import DrafterBase
from specdec.run_state import RunState

MODEL = "model"  # a row's draft: the engine's draft model


@dataclass(kw_only=True, eq=False)
class BatchRow(RunState):
    """One sequence of the batch: a :class:`~specdec.run_state.RunState` (what ``append_tokens`` and
    ``finish_output`` read, as for a generation alone), plus its draft and its place in the batch."""

    draft: Any  # None (plain), MODEL, or a parameter-free Drafter of its own
    proposed: tuple[int, int] | None = None  # (sequence length, k) of the model draft's last proposal
    output: Any = None  # the GenerationOutput once done
    error: BaseException | None = None  # what ended it early (a callback raised: the client left, ...)
    cancelled: str | None = None
    finish: Any = None  # the server's: the response payload of a finished row

    @property
    def done(self) -> bool:
        return self.output is not None or self.error is not None


class ModelRowDrafter(DrafterBase):
    """What a row drafted by the engine's model reports (the batched draft session is the engine's)."""

    def __init__(self, name: str):
        self.name = name
