"""Statistics of one generation: what was drafted, what was accepted, where the time went.

Conventions (stated once, used everywhere):

- a *step* is one target forward pass (one serial call of M_p), which verifies one draft;
- *mean accepted length* = generated tokens / steps, so it INCLUDES the residual or bonus token
  every step emits: plain decoding scores exactly 1.0, gamma accepted drafts score gamma + 1;
- *acceptance rate* = accepted / drafted draft tokens;
- *alpha* (empirical, Corollary 6) = mean over verified positions of beta = sum_x min(p(x), q(x)),
  where the verified positions of a step are the drafted positions up to and including the first
  rejected one. A draft without probabilities counts as one-hot q (beta = p(x)); at temperature 0,
  beta is 1 when the draft token is the target's argmax and 0 otherwise;
- acceptance per draft position i: of the steps that drafted a token at position i, the fraction
  whose token i was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoundTally:
    """Drafted and accepted tokens and beta over a series of rounds: a generation's (the target verifying
    the draft) or a hierarchy level's (a draft model verifying the level below it)."""

    drafted: int = 0
    accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    beta_sum: float = 0.0
    beta_count: int = 0

    def tally(self, drafted: int, accepted: int, betas: list[float]) -> None:
        self.drafted += drafted
        self.accepted += accepted
        while len(self.drafted_per_position) < drafted:
            self.drafted_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(drafted):
            self.drafted_per_position[i] += 1
            if i < accepted:
                self.accepted_per_position[i] += 1
        self.beta_sum += sum(betas)
        self.beta_count += len(betas)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def alpha(self) -> float | None:
        return self.beta_sum / self.beta_count if self.beta_count else None

    def named(self, *names: str) -> dict[str, Any]:
        """{name: its value} for the fields and properties ``names`` (a record's keys named as the attributes)."""
        return {name: getattr(self, name) for name in names}

    def tally_dict(self) -> dict[str, Any]:
        """The tally's part of a record (to_dict): drafted, accepted, their rates, alpha."""
        return {"drafted": self.drafted, "accepted": self.accepted, "acceptance_rate": self.acceptance_rate,
                "acceptance_per_position": self.acceptance_per_position, "alpha": self.alpha}


@dataclass
class GenerationStats(RoundTally):
    new_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, positions whose keys and values came from the prefix cache
    target_calls: int = 0  # serial forward passes of the target (prefill included)
    draft_calls: int = 0  # forward passes of a model draft (0 for parameter-free drafts)
    time_draft: float = 0.0
    time_target: float = 0.0  # the rounds' target passes (the prefill is time_prefill)
    time_prefill: float = 0.0  # the target's prefill of the prompt (one-sequence decoding; elsewhere in time_other)
    time_draft_start: float = 0.0  # part of time_draft: the drafter's start (a model draft's prefill of the prompt)
    time_convert: float = 0.0  # part of time_draft: a draft with another tokenizer, converting text and tokens
    time_total: float = 0.0
    seed: int | None = None
    stop_reason: str = ""
    exact: bool = True  # False when lenience < 1, or a quantized target that is not block-invariant verifies drafts
    not_exact_reason: str | None = None
    levels: list[dict[str, Any]] = field(default_factory=list)  # hierarchical drafting: LevelStats.to_dict() per level
    schedule: dict[str, Any] = field(default_factory=dict)  # the gamma schedule's final state (GammaSchedule.report)
    # with CUDA graphs (specdec.round_graph): rounds replayed as one captured round, and rounds that ran step by
    # step (the first one, whose token comes with the prefill, and any the capture plan does not cover)
    rounds_graphed: int = 0
    rounds_per_step: int = 0
    rounds_chained: int = 0  # graphed rounds launched before the previous one was read (specdec.round_graph)
    # structured output (specdec.constraints): kind, source, complete (the text matches), masks computed and
    # their host time, and the grammar draft's forced tokens proposed / accepted; {} without a constraint
    constraint: dict[str, Any] = field(default_factory=dict)
    # Predicted Outputs (specdec.drafters.prediction): accepted / rejected prediction tokens; {} without one
    prediction: dict[str, Any] = field(default_factory=dict)

    def record_step(self, drafted: int, accepted: int, betas: list[float]) -> None:
        self.target_calls += 1
        self.tally(drafted, accepted, betas)

    def record_round(self, r: Any) -> None:
        """A target call of the generation (:class:`specdec.rounds.Round`)."""
        self.draft_calls += r.draft_calls
        self.time_draft += r.time_draft
        self.time_target += r.time_verify
        self.record_step(r.drafted, r.n, r.betas)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per target call, the residual/bonus token included (plain decoding: 1.0)."""
        return self.new_tokens / self.target_calls if self.target_calls else None

    @property
    def time_other(self) -> float:
        return max(0.0, self.time_total - self.time_draft - self.time_target - self.time_prefill)

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.time_total if self.time_total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.named("new_tokens", "prompt_tokens", "cached_tokens", "target_calls", "draft_calls"),
            **self.tally_dict(),
            "mean_accepted_length": self.mean_accepted_length,
            "time_draft_s": self.time_draft,
            "time_target_s": self.time_target,
            "time_prefill_s": self.time_prefill,
            "time_draft_start_s": self.time_draft_start,
            "time_convert_s": self.time_convert,
            "time_other_s": self.time_other,
            "time_total_s": self.time_total,
            "tokens_per_second": self.tokens_per_second,
            "seed": self.seed,
            "stop_reason": self.stop_reason,
            "exact": self.exact,
            "not_exact_reason": self.not_exact_reason,
            "levels": self.levels,
            "schedule": self.schedule,
            "rounds_graphed": self.rounds_graphed,
            "rounds_per_step": self.rounds_per_step,
            "rounds_chained": self.rounds_chained,
            **({"constraint": self.constraint} if self.constraint else {}),
            **({"prediction": self.prediction} if self.prediction else {}),
        }

    def _draft_parts(self) -> str:
        """' (of the draft's, ...)': its start (a model draft's prefill) and its tokenizer conversions, where any."""
        parts = ([f"{self.time_draft_start:.2f} s its start"] if self.time_draft_start else []) + \
            ([f"{self.time_convert:.3f} s converting between tokenizers"] if self.time_convert else [])
        return f" (of the draft's, {', '.join(parts)})" if parts else ""

    def summary(self) -> str:
        def fmt(x: float | None, spec: str = ".3f") -> str:
            return "n/a" if x is None else format(x, spec)

        lines = [
            f"new tokens {self.new_tokens} in {self.time_total:.2f} s = {fmt(self.tokens_per_second, '.2f')} tokens/s "
            f"(stopped: {self.stop_reason})",
            f"target calls {self.target_calls}, draft calls {self.draft_calls}, "
            f"mean accepted length {fmt(self.mean_accepted_length, '.2f')} (bonus token included)",
            f"drafted {self.drafted}, accepted {self.accepted} (rate {fmt(self.acceptance_rate)}), alpha {fmt(self.alpha)}",
            "acceptance per position: " + " ".join(f"{a:.2f}" for a in self.acceptance_per_position),
            f"time: prefill {self.time_prefill:.2f} s, draft {self.time_draft:.2f} s, target {self.time_target:.2f} s, "
            f"other {self.time_other:.2f} s" + self._draft_parts(),
        ]
        for level in self.levels:
            lines.append(
                f"  level {level['level']}: calls {level['calls']}, drafted {level['drafted']}, "
                f"accepted {level['accepted']}, alpha {fmt(level['alpha'])}, "
                f"time verify {level['time_verify_s']:.2f} s, inner draft {level['time_inner_draft_s']:.2f} s"
            )
        if self.schedule.get("name") == "adaptive" and self.schedule.get("c") is not None:
            sch = self.schedule
            verdict = ("speculation pays (some gamma beats plain decoding in Theorem 8 with c, s and f)" if sch["pays"]
                       else "speculation does not pay (no gamma beats plain decoding in Theorem 8 with c, s and f): "
                            "plain steps, a drafted token now and then")
            lines.append(f"adaptive gamma: alpha {sch['alpha']:.3f}, c {sch['c']:.3f} per drafted token, f "
                         f"{sch.get('f') or 0.0:.3f} per round, verification cost s {sch['s']:.3f} per extra token, "
                         f"last gamma {sch['gamma']}, plain steps {sch['plain_steps']}: {verdict}")
        if self.constraint:
            c = self.constraint
            forced = (f", forced tokens proposed {c['forced_proposed']}, accepted {c['forced_accepted']}"
                      if "forced_proposed" in c else "")
            state = "complete" if c["complete"] else "NOT complete (the generation ended first: raise max_new_tokens)"
            lines.append(f"constraint ({c['kind']}): {state}; {c['masks']} masks in {c['mask_seconds'] * 1e3:.1f} ms"
                         + forced)
        if not self.exact:
            lines.append("NOT EXACT: " + (self.not_exact_reason or "lenience < 1, the output does not follow the "
                                          "target's distribution"))
        return "\n".join(lines)


@dataclass
class LevelStats(RoundTally):
    """A model level of a hierarchy (the report's Algorithm 3): its own rounds, in which its model verifies
    the level below it. ``calls``: its model's verification passes; ``draft_calls``: the level below's
    forward passes; ``new_tokens``: tokens it proposed to the level above."""

    level: str = ""
    calls: int = 0
    draft_calls: int = 0
    new_tokens: int = 0
    time_inner_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0

    def record_round(self, r: Any) -> None:
        """One of this level's rounds (:class:`specdec.rounds.Round`)."""
        self.calls += 1
        self.draft_calls += r.draft_calls
        self.time_inner_draft += r.time_draft
        self.time_verify += r.time_verify
        self.tally(r.drafted, r.n, r.betas)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.named("level", "calls", "draft_calls"),
            **self.tally_dict(),
            "new_tokens": self.new_tokens,
            "tokens_per_call": self.new_tokens / self.calls if self.calls else None,
            "time_verify_s": self.time_verify,
            "time_inner_draft_s": self.time_inner_draft,
            "time_total_s": self.time_total,
        }
