"""From timed trials to results: each method's totals, the comparisons between methods, and the flat rows.

Conventions: tokens/s of a method = all its new tokens / all its timed seconds (over every prompt
and repeat). Speedup of A vs B = tokens/s of A / tokens/s of B, both measured in the same run.
Alpha, acceptance rate and mean accepted length (bonus token included) follow :mod:`specdec.stats`.
The rows (paper Table 2 / Table 4 form) carry the Theorem 8 check of :mod:`specdec.analysis.theorem8`.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdec.analysis import theorem8
from specdec.analysis.values import ratio
from specdec.bench.grid import Cell
from specdec.bench.methods import Trial
from specdec.bench.timing import StepCosts
from specdec.tasks import Task

#: The methods every other one is compared with (tokens/s ratios), when they ran.
REFERENCES = ("specdec-plain", "hf-plain", "hf-assisted")


def summarize(trials: Sequence[Trial]) -> dict[str, Any]:
    """One method's totals over its trials; the specdec ones add acceptance and the time split."""
    tokens = sum(len(t.tokens) for t in trials)
    seconds = sum(t.seconds for t in trials)
    per_prompt = sorted(len(t.tokens) / t.seconds for t in trials if t.seconds > 0)
    result: dict[str, Any] = {
        "runs": len(trials),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": ratio(tokens, seconds),
        "median_prompt_tokens_per_second": per_prompt[len(per_prompt) // 2] if per_prompt else None,
        # CPU seconds of this process / wall seconds, over the timed calls: about the thread count
        # when the benchmark had the cores to itself, lower when other work shared them
        "cpu_utilization": ratio(sum(t.cpu_seconds for t in trials), seconds),
    }
    stats = [t.stats for t in trials if t.stats is not None]
    if len(stats) != len(trials) or not stats:
        return result
    target_calls = sum(s.target_calls for s in stats)
    draft_calls = sum(s.draft_calls for s in stats)
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    beta_count = sum(s.beta_count for s in stats)
    width = max((len(s.drafted_per_position) for s in stats), default=0)
    drafted_pos = [sum(s.drafted_per_position[i] for s in stats if i < len(s.drafted_per_position)) for i in range(width)]
    accepted_pos = [sum(s.accepted_per_position[i] for s in stats if i < len(s.accepted_per_position)) for i in range(width)]
    time_draft = sum(s.time_draft for s in stats)
    time_convert = sum(getattr(s, "time_convert", 0.0) for s in stats)
    time_target = sum(s.time_target for s in stats)
    time_prefill = sum(getattr(s, "time_prefill", 0.0) for s in stats)  # the target's
    time_draft_start = sum(getattr(s, "time_draft_start", 0.0) for s in stats)  # part of time_draft: its prefill
    time_loop = sum(s.time_total for s in stats)  # from the KV session's start to the last token
    time_setup = max(0.0, seconds - time_loop)  # inside generate() but before the loop: model/drafter setup
    # loop bookkeeping, acceptance, Python
    time_other = max(0.0, time_loop - time_draft - time_target - time_prefill)
    target_step = ratio(time_target, target_calls)
    draft_step = ratio(time_draft, draft_calls)
    result.update({
        "target_calls": target_calls,
        "draft_calls": draft_calls,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": ratio(accepted, drafted),
        "alpha": ratio(sum(s.beta_sum for s in stats), beta_count),
        "mean_accepted_length": ratio(tokens, target_calls),
        "acceptance_per_position": [a / d if d else None for a, d in zip(accepted_pos, drafted_pos)],
        "time_draft_s": time_draft,
        "time_convert_s": time_convert,
        "time_target_s": time_target,
        "time_prefill_s": time_prefill,
        "time_draft_start_s": time_draft_start,
        "time_other_s": time_other,
        "time_setup_s": time_setup,
        "setup_per_call_s": ratio(time_setup, len(stats)),
        "tokens_per_second_loop_only": ratio(tokens, time_loop),
        "time_split": {k: ratio(v, seconds) for k, v in (("prefill", time_prefill), ("draft", time_draft),
                                                          ("target", time_target), ("other", time_other),
                                                          ("setup", time_setup))},
        "target_step_s": target_step,  # per target call of the rounds (the target's prefill is time_prefill_s)
        "draft_step_s": draft_step,  # per draft forward pass, the draft's prefill included
        "other_per_step_s": ratio(time_other, target_calls),
        # Estimate of c from the loop's own timers: the draft's average includes its prefill of each prompt (the
        # target's is apart, time_prefill_s), and the target's steps score gamma + 1 tokens while the draft's score 1.
        "c_estimate": ratio(draft_step, target_step) if draft_step is not None and target_step else None,
    })
    if any(s.levels for s in stats):
        result["levels"] = summarize_levels([s.levels for s in stats])
    return result


def summarize_levels(runs: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Hierarchical drafting: each level's totals over the runs (level 1 verifies level 2, ...)."""
    out: list[dict[str, Any]] = []
    for index in range(max(len(levels) for levels in runs)):
        mine = [levels[index] for levels in runs if index < len(levels)]
        if not mine:
            continue
        calls = sum(m["calls"] for m in mine)
        drafted = sum(m["drafted"] for m in mine)
        accepted = sum(m["accepted"] for m in mine)
        betas = [(m["alpha"], m["drafted"]) for m in mine if m.get("alpha") is not None]
        out.append({
            "level": mine[0]["level"],
            "calls": calls,  # forward passes of this level's model (its verification steps)
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": ratio(accepted, drafted),
            # alpha between this level's model and the level below it, weighted by drafted tokens
            "alpha": ratio(sum(a * d for a, d in betas), sum(d for _, d in betas)) if betas else None,
            "tokens_per_call": ratio(sum(m["new_tokens"] for m in mine), calls),
            "time_verify_s": sum(m["time_verify_s"] for m in mine),
            "time_inner_draft_s": sum(m["time_inner_draft_s"] for m in mine),
        })
    return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(trials_a: Sequence[Trial], trials_b: Sequence[Trial], labels: Sequence[str]) -> dict[str, Any]:
    """How many runs produced exactly the same tokens; where the others first diverge."""
    mismatches = []
    for label, a, b in zip(labels, trials_a, trials_b):
        at = first_difference(a.tokens, b.tokens)
        if at is not None:
            mismatches.append({"run": label, "first_difference": at, "lengths": [len(a.tokens), len(b.tokens)]})
    n = min(len(trials_a), len(trials_b))
    return {"runs": n, "equal": n - len(mismatches), "all_equal": not mismatches, "mismatches": mismatches}


def speedups(methods: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for name, m in methods.items():
        out[name] = {}
        for ref in REFERENCES:
            if ref in methods and m["tokens_per_second"] and methods[ref]["tokens_per_second"]:
                out[name][f"vs_{ref}"] = m["tokens_per_second"] / methods[ref]["tokens_per_second"]
            else:
                out[name][f"vs_{ref}"] = None
    return out


def retokenized_c(c_step: float, passes_per_token: float, convert_per_token: float) -> float:
    """Theorem 8's c for a draft with another tokenizer: the cost of proposing one TARGET token, in
    target steps. Such a draft runs ``passes_per_token`` of its own forward passes (each ``c_step``
    target steps) per target token it proposes (its tokens are shorter or longer than the target's), and
    converts text and tokens for ``convert_per_token`` target steps more."""
    return c_step * passes_per_token + convert_per_token


def grid_rows(task: Task, temperature: float, block: dict[str, Any], cells: list[Cell],
          costs: StepCosts | None) -> list[dict[str, Any]]:
    """The flat rows of one temperature (Table 2 / Table 4 form), Theorem 8 beside each speculative one."""
    methods, ups = block["methods"], block["speedups"]
    plain = methods.get("specdec-plain")
    rows = []
    for cell in cells:
        m = methods[cell.label]
        same = block["identical_to_plain"].get(cell.label)
        row: dict[str, Any] = {
            "task": task.name, "temperature": temperature, "label": cell.label, "method": cell.method,
            "draft": cell.draft, "gamma": cell.gamma, "schedule": cell.schedule if cell.draft else None,
            "lenience": cell.lenience if cell.draft else None, "exact": cell.lenience == 1.0,
            "verification": cell.verification if cell.draft else None,
            "runs": m["runs"], "new_tokens": m["new_tokens"], "seconds": m["seconds"],
            "tokens_per_second": m["tokens_per_second"],
            "speedup_vs_specdec_plain": ups[cell.label].get("vs_specdec-plain"),
            "speedup_vs_hf_plain": ups[cell.label].get("vs_hf-plain"),
            "cpu_utilization": m.get("cpu_utilization"),
            "quality": m.get("quality"),
            "identical_to_plain": None if same is None else f"{same['equal']}/{same['runs']}",
        }
        if cell.method == "specdec-spec":
            row.update(alpha=m.get("alpha"), mean_accepted_length=m.get("mean_accepted_length"),
                       acceptance_rate=m.get("acceptance_rate"), time_split=m.get("time_split"),
                       levels=m.get("levels"))
            entry = costs.drafts.get(cell.draft) if costs else None
            t1 = costs.target_k1_s if costs else None
            c_direct = entry.c_direct if entry else None
            c_loop = (m["time_draft_s"] / m["drafted"]) / t1 if m.get("drafted") and t1 else None
            c, c_source = (c_direct, "direct") if c_direct is not None else (c_loop, "loop")
            if m.get("time_convert_s") and c_direct is not None and m.get("drafted") and t1:
                c = retokenized_c(c_direct, m["draft_calls"] / m["drafted"], m["time_convert_s"] / m["drafted"] / t1)
                c_source = "direct x draft passes per target token + conversion"
                row["draft_passes_per_target_token"] = m["draft_calls"] / m["drafted"]
            drafted_per_call = m["drafted"] / m["target_calls"] if m.get("target_calls") else 0.0
            if cell.schedule == "constant":
                gamma, gamma_note = cell.gamma, "gamma"
            else:
                gamma, gamma_note = max(1, round(drafted_per_call)), "mean drafted per call, rounded"
            ratio = costs.verify_cost_ratio(gamma) if costs else None
            check = theorem8.compare(alpha=m.get("alpha"), gamma=gamma, c=c, plain=plain, spec=m,
                                   verify_cost_ratio=ratio) if plain else None
            row.update(c=c, c_direct=c_direct, c_loop=c_loop, c_source=c_source,
                       gamma_for_prediction=gamma, gamma_for_prediction_is=gamma_note,
                       expected_tokens=check and check.get("expected_tokens"),
                       predicted_speedup=check and check.get("predicted"),
                       measured_over_predicted=check and check.get("ratio"),
                       within_15pct=check and check.get("within_tolerance"),
                       theorem8=check, check=theorem8.explain(check) if check else None)
        rows.append(row)
    return rows
