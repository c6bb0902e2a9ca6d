"""One sequence of a batch (:mod:`specdec.batch.engine`): what the batch engine keeps per row."""

from __future__ import annotations

from dataclasses import dataclass
import os
from typing import Any, Sequence

from specdec.config import GenerationConfig
from specdec.drafters.base import DraftContext, DrafterBase
from specdec.run_state import RunState

MODEL = "model"  # a row's draft: the engine's draft model
PAD = 64  # positions every cache row holds past max_positions: the widest padded pass (a batch's widest row)


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
    # while it is the batch's only row it runs through the one-sequence engine (specdec.batch.alone), with a session
    # of its own (RunState.session; None in the batch)
    parked: Any = None  # the schedule it drafts by in the other mode (the batch's, or its own alone)
    prediction: Any = None  # Predicted Outputs: its PredictionDrafter (specdec.batch.prediction), or None
    # its prompt going in chunk by chunk (specdec.batch.fill): the positions the target and its model draft hold
    filled: int = 0
    draft_filled: int = 0
    fill_draft: bool = False  # whether its model draft is fed the prompt as it goes in
    alpha: Any = None  # its model draft's AlphaEstimate (the batch's gamma reads it: specdec.batch.speculation)
    copying: Any = None  # its copies' CopyAcceptance, from its first copy found (specdec.batch.copying)

    @property
    def alone(self) -> bool:
        return self.session is not None

    @property
    def done(self) -> bool:
        return self.output is not None or self.error is not None


class ModelRowDrafter(DrafterBase):
    """What a row drafted by the engine's model reports (the batched draft session is the engine's)."""

    def __init__(self, name: str):
        self.name = name


def make_row(engine: Any, prompt_ids: Sequence[int], config: GenerationConfig, draft: Any, on_tokens: Any,
             on_round: Any) -> BatchRow:
    """A request's row for ``engine`` (:meth:`specdec.batch.engine.BatchEngine.add`), checked: its prompt, its budget
    within the batch's positions, its draft (MODEL: the engine's draft model; None: plain; a parameter-free drafter
    name or object), its schedule, stop strings, constraint and prediction."""
    from specdec.constraints import Constraint
    from specdec.decoding import prediction_ids
    from specdec.devices import Stopwatch, new_generator
    from specdec.drafters.forced import ForcedDrafter, with_forced
    from specdec.drafters.plan import DRAFTER_NAMES, DraftKind, plan_draft
    from specdec.drafters.prediction import PredictionDrafter
    from specdec.errors import SpecDecError
    from specdec.models.causal import new_token_limit
    from specdec.schedules import AlphaEstimate, make_schedule
    from specdec.stats import GenerationStats
    from specdec.text import StopScan

    if config.num_beams > 1:
        raise SpecDecError("beam search is not batched; run it with specdec.generate")
    if config.gamma + 1 > PAD or config.gamma_bound + 1 > PAD:
        raise SpecDecError(f"gamma up to {PAD - 1} in a batch; got {config.gamma_bound}")
    target = engine.target
    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        raise SpecDecError("the prompt is empty; give some text to continue")
    limit = new_token_limit(len(prompt_ids), config.max_new_tokens, target.max_context, target.name)
    if len(prompt_ids) + limit + 1 > engine.max_positions:
        raise SpecDecError(f"the prompt ({len(prompt_ids)} tokens) and max_new_tokens ({limit}) need "
                           f"{len(prompt_ids) + limit + 1} positions; the batch holds {engine.max_positions} per "
                           "row: shorten them, or raise max_positions (specdec serve --max-positions)")
    if draft == MODEL and engine.draft_model is None:
        draft = None
    drafter = None
    if isinstance(draft, str) and draft != MODEL:
        if plan_draft(draft).kind is not DraftKind.DRAFTER:
            raise SpecDecError(f"a row of a batch drafts with the engine's draft model or one parameter-free "
                               f"drafter ({', '.join(DRAFTER_NAMES)}), got {draft!r}")
        draft = DRAFTER_NAMES[draft]()
    if isinstance(draft, ForcedDrafter) and config.constraint is None:
        raise SpecDecError("the 'grammar' draft proposes the tokens a constraint forces: give the row json_schema=, "
                           "regex= or grammar= (the server: response_format), or another draft")
    if draft not in (MODEL, None) and config.constraint is not None and config.forced_drafts:
        draft = with_forced(draft)  # the grammar's forced tokens first (a model-drafted row: not yet)
    if draft == MODEL:
        drafter = ModelRowDrafter(engine.draft_model.name)
    elif draft is not None:
        drafter = draft
    seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(4), "little")
    device = target.device
    from specdec.decoding import device_ids

    schedule = (engine.gamma_policy.row() if config.gamma_schedule == "adaptive"
                else make_schedule(config.gamma_schedule, config.gamma, config.gamma_bound))
    row = BatchRow(target=target, prompt_ids=prompt_ids, config=config, draft=draft, drafter=drafter,
                   schedule=schedule, sequence=list(prompt_ids), ids=device_ids(prompt_ids, len(prompt_ids) + limit + 1, device),
                   start_len=len(prompt_ids), limit=limit, generator=new_generator(device, seed), eos=target.eos_token_ids,
                   stats=GenerationStats(prompt_tokens=len(prompt_ids), seed=seed), on_tokens=on_tokens,
                   on_round=on_round, t_start=Stopwatch(device)(),
                   alpha=AlphaEstimate(engine.gamma_policy.pooled.value, engine.gamma_policy.decay))
    if config.stop:
        row.stop_scan = StopScan(target.decode, config.stop, target.piece_bytes)
    if config.constraint is not None:
        row.constraint = Constraint(config.constraint, target, len(prompt_ids), device)
    predicted = prediction_ids(target, config)
    if predicted:  # Predicted Outputs: in front of the row's draft (specdec.batch.prediction)
        row.prediction = PredictionDrafter(predicted)
    return row


def row_context(row: BatchRow) -> DraftContext:
    """What a row's own drafter is told when it starts (as :func:`specdec.generate` tells its drafter)."""
    config = row.config
    stop_below = config.confidence if config.gamma_schedule == "confidence" else None
    return DraftContext(row.prompt_ids, config.sampling, row.generator, row.target.vocab_size, frozenset(row.eos), (),
                        stop_below, row.target.device, len(row.ids), row.ids, row.constraint)
