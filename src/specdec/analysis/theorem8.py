"""A measured speedup next to the paper's Theorem 8 prediction, and where any difference comes from.

For one speculative configuration measured against ``specdec-plain`` in the same run:

    measured  = (spec tokens / spec seconds) / (plain tokens / plain seconds)
    predicted = E / (gamma c + 1),  E = (1 - alpha^(gamma+1)) / (1 - alpha)      (Theorem 8, Equation 1)

with alpha measured in that run and c, the cost ratio of one draft step to one target step,
measured directly (single cached forward passes) for a model draft, or from the loop's timers for
other drafts. The ratio splits exactly into two measured factors:

    measured / predicted = tokens factor x cost factor
    tokens factor = mean accepted length / E          (betas not i.i.d., fewer than gamma drafted, EOS)
    cost factor   = (gamma c + 1) t_plain / t_call    (verifying gamma + 1 tokens costs more than one plain
                                                        step, the draft is slower than c says, overhead)

where t_plain is the plain run's seconds per token and t_call the speculative run's seconds per
target call. t_call is split further into verification, drafting and the rest, each beside the share
Theorem 8 assumes (t_plain for verification, gamma c t_plain for drafting, nothing else).
"""

from __future__ import annotations

from typing import Any

from specdec.analysis import expected_tokens, walltime_improvement
from specdec.analysis.values import PERCENT, fmt, ratio

TOLERANCE = 0.15  # the acceptance band: measured within +-15% of the prediction


def compare(*, alpha: float | None, gamma: int, c: float | None, plain: dict[str, Any], spec: dict[str, Any],
            verify_cost_ratio: float | None = None) -> dict[str, Any]:
    """Theorem 8 beside the measurement. plain / spec: summaries of :func:`specdec.bench.aggregation.summarize`
    (the spec one with its loop statistics); verify_cost_ratio: direct time of a target pass over
    gamma + 1 new tokens / over 1 (None if not measured)."""
    out: dict[str, Any] = {"alpha": alpha, "gamma": gamma, "c": c}
    t_plain = ratio(plain.get("seconds"), plain.get("new_tokens"))
    measured = ratio(spec.get("tokens_per_second"), plain.get("tokens_per_second"))
    calls = spec.get("target_calls")
    t_call = ratio(spec.get("seconds"), calls)
    out.update(measured=measured, t_plain_token_s=t_plain, t_call_s=t_call,
               mean_accepted_length=spec.get("mean_accepted_length"),
               drafted_per_call=ratio(spec.get("drafted"), calls), verify_cost_ratio_direct=verify_cost_ratio)
    if alpha is None or c is None or gamma < 1:
        out.update(expected_tokens=None, predicted=None, ratio=None, within_tolerance=None)
        return out
    alpha = min(max(alpha, 0.0), 1.0)
    e = expected_tokens(alpha, gamma)
    predicted = walltime_improvement(alpha, gamma, c)
    over = ratio(measured, predicted)
    out.update(expected_tokens=e, predicted=predicted, ratio=over,
               within_tolerance=None if over is None else abs(over - 1.0) <= TOLERANCE)
    mal = spec.get("mean_accepted_length")
    out["tokens_factor"] = ratio(mal, e)
    t_call_predicted = (gamma * c + 1.0) * t_plain if t_plain is not None else None
    out["t_call_predicted_s"] = t_call_predicted
    out["cost_factor"] = ratio(t_call_predicted, t_call)
    if calls:
        other = (spec.get("time_other_s") or 0.0) + (spec.get("time_setup_s") or 0.0)
        out.update(
            verify_per_call_s=spec.get("time_target_s", 0.0) / calls,
            draft_per_call_s=spec.get("time_draft_s", 0.0) / calls,
            draft_start_per_call_s=(spec.get("time_draft_start_s") or 0.0) / calls,  # the draft's prefill
            prefill_per_call_s=(spec.get("time_prefill_s") or 0.0) / calls,  # the target's
            other_per_call_s=other / calls,
            draft_per_call_predicted_s=gamma * c * t_plain if t_plain is not None else None,
        )
        out["verify_factor"] = ratio(out["verify_per_call_s"], t_plain)
    return out


def explain(row: dict[str, Any]) -> str:
    """One line: the check, and when it fails, the measured factors that make up the gap."""
    if row.get("predicted") is None:
        if not row.get("drafted_per_call"):
            return "no prediction: nothing was drafted (no alpha measured)"
        return "no prediction (no alpha or c measured)"
    over = row["ratio"]
    band = f"±{TOLERANCE:.0%}"
    verdict = f"within {band}" if row["within_tolerance"] else f"OUTSIDE {band}"
    text = (f"measured {fmt(row['measured'], '.2f')}x vs Theorem 8 {fmt(row['predicted'], '.2f')}x "
            f"({fmt(None if over is None else (over - 1) * PERCENT, '+.0f')}%): {verdict}")
    if row["within_tolerance"]:
        return text
    parts = [f"tokens factor {fmt(row.get('tokens_factor'), '.2f')} (mean accepted length "
             f"{fmt(row.get('mean_accepted_length'), '.2f')} vs Eq. 1 {fmt(row.get('expected_tokens'), '.2f')}, "
             f"{fmt(row.get('drafted_per_call'), '.2f')} drafted per call for gamma {row['gamma']})"]
    parts.append(
        f"cost factor {fmt(row.get('cost_factor'), '.2f')} (a target call took {fmt(row.get('t_call_s'), '.3f')} s vs "
        f"(gamma c + 1) x plain token {fmt(row.get('t_call_predicted_s'), '.3f')} s: verification "
        f"{fmt(row.get('verify_per_call_s'), '.3f')} s = {fmt(row.get('verify_factor'), '.2f')}x a plain token"
        + (f" (direct: {row['gamma'] + 1} tokens cost {row['verify_cost_ratio_direct']:.2f}x one)"
           if row.get("verify_cost_ratio_direct") else "")
        + f", drafting {fmt(row.get('draft_per_call_s'), '.3f')} s"
        + (f" (its prefill {row['draft_start_per_call_s']:.3f})" if row.get("draft_start_per_call_s") else "")
        + f" (Theorem 8: {fmt(row.get('draft_per_call_predicted_s'), '.3f')} s)"
        + (f", the target's prefill {row['prefill_per_call_s']:.3f} s" if row.get("prefill_per_call_s") else "")
        + f", other {fmt(row.get('other_per_call_s'), '.3f')} s)"
    )
    return text + " — " + "; ".join(parts)
