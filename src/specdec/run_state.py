"""One sequence's state through the rounds, and the rules both engines apply to it.

A generation alone (:mod:`specdec.decoding`, its ``_Run``) and a row of a batch (:mod:`specdec.batch.engine`,
:class:`~specdec.batch.row.BatchRow`) are each a :class:`RunState`: the prompt, the decoded sequence (on the
host and on the device), the budget, the sampling generator, the draft and its gamma schedule, the stats and
the callbacks. :func:`append_tokens` adds a round's tokens to either (the one rule for a sequence's end: EOS,
a stop string, the budget, the context) and :func:`finish_output` turns either into its
:class:`GenerationOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from specdec.config import GenerationConfig
from specdec.devices import Stopwatch
from specdec.drafters.forced import ForcedDrafter
from specdec.drafters.prediction import PredictionDrafter
from specdec.models import LanguageModel
from specdec.stats import GenerationStats
from specdec.text import StopScan

# on_tokens(new_token_ids, from_draft): called as tokens are accepted; from_draft[i] is True when
# token i was proposed by the draft and accepted, False when the target produced it.
TokenCallback = Callable[[list[int], list[bool]], None]


@dataclass(frozen=True)
class RoundEvent:
    """One target call of a generation, for displays that show the algorithm at work (the playground).

    drafted: the draft's gamma proposed tokens (host ids; [] on a plain step);
    accepted: n, how many of them the target accepted (the first rejected one was resampled, the rest dropped);
    tokens / from_draft: what the round added to the text, as :data:`TokenCallback` receives them (cut at EOS
      or a stop string, so it may be shorter than n + 1);
    source: where the drafted tokens came from (:attr:`specdec.drafters.Draft.source`: ``"prediction"``, or None).
    """

    drafted: list[int]
    accepted: int
    tokens: list[int]
    from_draft: list[bool]
    source: str | None = None

    @property
    def rejected(self) -> list[int]:
        """The drafted tokens the target did not accept: the first one was replaced by the target's token."""
        return self.drafted[self.accepted:]


# on_round(event): called after each target call, after on_tokens; reading the drafted ids back costs one
# more device-to-host copy per round, paid only when this callback is given.
RoundCallback = Callable[[RoundEvent], None]


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]  # generated tokens only (EOS included when it ended the generation)
    from_draft: list[bool]  # per generated token: accepted from the draft (True) or produced by the target
    prompt_ids: list[int]
    stats: GenerationStats
    config: GenerationConfig
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "from_draft": self.from_draft,
            "stats": self.stats.to_dict(),
            "config": self.config.to_dict(),
            **({"extra": self.extra} if self.extra else {}),
        }


def _find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string in ``text`` starts (None: none is there)."""
    positions = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(positions) if positions else None


@dataclass(kw_only=True, eq=False)
class RunState:
    """One sequence between its start and its output: what a round reads and writes, the same for a
    generation alone and a batch row (each adds what only its engine needs)."""

    target: LanguageModel
    prompt_ids: list[int]
    config: GenerationConfig
    drafter: Any  # None (plain decoding), or what proposes its drafts and reports stats()
    schedule: Any  # its gamma schedule (specdec.schedules)
    sequence: list[int]  # host copy of the decoded sequence (prompt included for a causal LM)
    ids: torch.Tensor  # [max positions] long: the sequence on the device (written in place each round; drafters read it)
    start_len: int
    limit: int  # new tokens at most (max_new_tokens, or fewer when the context ends first)
    generator: torch.Generator
    eos: set[int]
    stats: GenerationStats
    on_tokens: TokenCallback | None = None
    on_round: RoundCallback | None = None
    t_start: float
    from_draft: list[bool] = field(default_factory=list)
    stop_scan: StopScan | None = None  # with stop strings: finds them in each round's new text only
    stop_text: str | None = None
    carried: torch.Tensor | None = None  # [1, V] the last position's logits from the prefill (first round only)
    constraint: Any = None  # structured output: the sequence's specdec.constraints.Constraint
    # the one-sequence engine's (specdec.decoding: a generation alone, and a batch's lone row, specdec.batch.alone):
    # the target's session of its own, the round clock, the next round launched before this one was read (graphs)
    session: Any = None
    clock: Any = None
    ahead: Any = None


def append_tokens(run: RunState, new: list[int], origins: list[bool]) -> list[int]:
    """Add a round's tokens to the sequence, cut at EOS or a stop string, stream them, decide the end.
    Returns the tokens added. The one rule for a sequence's end: the batch engine's rows use it too."""
    config, sequence = run.config, run.sequence
    origins = origins[: len(new)]  # a round whose target token the grammar refused brings one token fewer
    done = ""
    for j, tok in enumerate(new):
        if tok in run.eos:
            new, origins, done = new[: j + 1], origins[: j + 1], "eos"
            break
    sequence.extend(new)
    run.from_draft.extend(origins)
    before = len(sequence) - len(new)
    if run.stop_scan is not None and run.stop_scan.push(new) and _cut_at_stop(run, before):
        new, done = sequence[before:], "stop"
    if run.on_tokens is not None and new:
        run.on_tokens(new, origins[: len(new)])
    generated = len(sequence) - run.start_len
    if not done and generated >= run.limit:
        done = "max_new_tokens" if generated >= config.max_new_tokens else "context"
    run.stats.stop_reason = done
    return new


def _cut_at_stop(run: RunState, before: int) -> bool:
    """Confirm a stop string on the whole generated text (once per generation, when the round's text
    may hold one) and drop the round's tokens (those from ``before`` on) after the one that completed it.
    Returns False (nothing cut) when the whole text holds no stop string."""
    config, sequence = run.config, run.sequence
    text = run.target.decode(sequence[run.start_len:])
    cut = _find_stop(text, config.stop)
    if cut is None:
        return False
    # Keep the tokens up to the one that completed the stop string; the text ends before it.
    while len(sequence) > before + 1 and _find_stop(run.target.decode(sequence[run.start_len:-1]), config.stop) is not None:
        sequence.pop()
        run.from_draft.pop()
    run.stop_text = text[:cut]
    return True


def finish_output(run: RunState) -> GenerationOutput:
    """The generation's output from its run (a one-sequence run, or a batch row: the same fields)."""
    config, stats, target, drafter = run.config, run.stats, run.target, run.drafter
    token_ids = run.sequence[run.start_len:]
    stats.new_tokens = len(token_ids)
    stats.time_total = Stopwatch(target.device)() - run.t_start
    stats.exact = config.exact
    if not config.exact:
        stats.not_exact_reason = f"lenience {config.lenience:g} < 1: the output does not follow the target's distribution"
    if drafter is not None and target.quantization and not target.block_invariant:
        # A quantized target whose activation scale spans the whole forward pass: its logits for a token
        # depend on how many tokens share that pass (1 in plain decoding, gamma + 1 in verification).
        stats.exact = False
        stats.not_exact_reason = (f"the target is quantized ({target.quantization}) without block invariance: its "
                                  "logits depend on how many tokens a forward pass covers, so verification is not "
                                  "token-identical to its own plain decoding")
    if run.constraint is not None:
        stats.constraint = {**run.constraint.report(), **(drafter.report() if isinstance(drafter, ForcedDrafter) else {})}
        if run.stop_text is not None:  # a stop string cut the text inside the constrained output: not a whole match
            stats.constraint["complete"] = False
    if isinstance(drafter, PredictionDrafter):
        stats.prediction = drafter.report()
    if drafter is not None:
        report = drafter.stats()
        stats.time_convert += report.time_convert
        stats.levels = report.levels
        stats.schedule = run.schedule.report()
    text = run.stop_text if run.stop_text is not None else target.decode(token_ids)
    return GenerationOutput(text, token_ids, run.from_draft[: len(token_ids)], list(run.prompt_ids), stats, config)
