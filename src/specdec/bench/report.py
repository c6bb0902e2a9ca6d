"""Aggregating timed trials into per-method results, comparisons, and a markdown table.

Conventions: tokens/s of a method = all its new tokens / all its timed seconds (over every prompt
and repeat). Speedup of A vs B = tokens/s of A / tokens/s of B, both measured in the same run.
Alpha, acceptance rate and mean accepted length (bonus token included) follow :mod:`specdec.stats`.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from typing import Any, Sequence

import torch

from specdec.bench.methods import Trial

REFERENCES = ("specdec-plain", "hf-plain", "hf-assisted")


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(trials: Sequence[Trial]) -> dict[str, Any]:
    """One method's totals over its trials; the specdec ones add acceptance and the time split."""
    tokens = sum(len(t.tokens) for t in trials)
    seconds = sum(t.seconds for t in trials)
    per_prompt = sorted(len(t.tokens) / t.seconds for t in trials if t.seconds > 0)
    result: dict[str, Any] = {
        "runs": len(trials),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": _ratio(tokens, seconds),
        "median_prompt_tokens_per_second": per_prompt[len(per_prompt) // 2] if per_prompt else None,
        # CPU seconds of this process / wall seconds, over the timed calls: about the thread count
        # when the benchmark had the cores to itself, lower when other work shared them
        "cpu_utilization": _ratio(sum(t.cpu_seconds for t in trials), seconds),
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
    time_target = sum(s.time_target for s in stats)
    time_loop = sum(s.time_total for s in stats)  # from the KV session's start to the last token
    time_setup = max(0.0, seconds - time_loop)  # inside generate() but before the loop: model/drafter setup
    time_other = max(0.0, time_loop - time_draft - time_target)  # loop bookkeeping, acceptance, Python
    target_step = _ratio(time_target, target_calls)
    draft_step = _ratio(time_draft, draft_calls)
    result.update({
        "target_calls": target_calls,
        "draft_calls": draft_calls,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": _ratio(accepted, drafted),
        "alpha": _ratio(sum(s.beta_sum for s in stats), beta_count),
        "mean_accepted_length": _ratio(tokens, target_calls),
        "acceptance_per_position": [a / d if d else None for a, d in zip(accepted_pos, drafted_pos)],
        "time_draft_s": time_draft,
        "time_target_s": time_target,
        "time_other_s": time_other,
        "time_setup_s": time_setup,
        "setup_per_call_s": _ratio(time_setup, len(stats)),
        "tokens_per_second_loop_only": _ratio(tokens, time_loop),
        "time_split": {k: _ratio(v, seconds) for k, v in (("draft", time_draft), ("target", time_target),
                                                          ("other", time_other), ("setup", time_setup))},
        "target_step_s": target_step,  # per target call, the prefill included
        "draft_step_s": draft_step,  # per draft forward pass, the draft's prefill included
        "other_per_step_s": _ratio(time_other, target_calls),
        # Estimate of c from the loop's own timers: both averages include one prefill per prompt, and
        # the target's steps score gamma + 1 tokens while the draft's score 1.
        "c_estimate": _ratio(draft_step, target_step) if draft_step is not None and target_step else None,
    })
    return result


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


def machine_info(dtype: str) -> dict[str, Any]:
    import transformers

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "dtype": dtype,
    }


def _fmt(x: Any, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def table(result: dict[str, Any]) -> str:
    """Markdown: method | tokens/s | speedups | alpha | mean accepted length, then the notes that matter."""
    methods = result["methods"]
    ups = result["speedups"]
    lines = [
        "| method | tokens/s | speedup vs specdec-plain | vs hf-plain | vs hf-assisted | alpha | mean accepted length |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        u = ups[name]
        lines.append(
            f"| {name} | {_fmt(m['tokens_per_second'], '.2f')} | {_fmt(u['vs_specdec-plain'], '.2f')}x "
            f"| {_fmt(u['vs_hf-plain'], '.2f')}x | {_fmt(u['vs_hf-assisted'], '.2f')}x "
            f"| {_fmt(m.get('alpha'), '.3f')} | {_fmt(m.get('mean_accepted_length'), '.2f')} |"
        )
    cfg = result["config"]
    notes = [
        "",
        f"{cfg['n_prompts']} prompts x {cfg['repeats']} repeat(s), {cfg['max_new_tokens']} max new tokens, "
        f"gamma {cfg['gamma']}, temperature {cfg['temperature']}, {cfg['dtype']}, "
        f"{result['machine']['torch_threads']} torch threads; target {cfg['target']}, draft {cfg['draft']}",
    ]
    notes.append("CPU utilization (process CPU s / wall s; about " + str(result["machine"]["torch_threads"])
                 + " = cores to itself): " + ", ".join(f"{n} {_fmt(m['cpu_utilization'], '.2f')}" for n, m in methods.items()))
    load = result["machine"].get("load_average_before"), result["machine"].get("load_average_after")
    if None not in load:
        notes.append(f"1-minute load average before/after: {load[0]:.2f} / {load[1]:.2f} "
                     f"(much above {result['machine']['torch_threads']} means other work shared the CPU)")
    spec = methods.get("specdec-spec")
    if spec and "time_split" in spec:
        split = spec["time_split"]
        notes.append(
            f"specdec-spec time: draft {split['draft']:.0%}, target {split['target']:.0%}, other {split['other']:.0%}, "
            f"setup before the loop {split['setup']:.0%} ({spec['setup_per_call_s']:.3f} s a call); "
            f"acceptance rate {_fmt(spec['acceptance_rate'], '.3f')}; per position "
            + " ".join(_fmt(a, ".2f") for a in spec["acceptance_per_position"])
        )
        notes.append(
            f"c estimate (draft step / target step from the loop timers) {_fmt(spec['c_estimate'], '.3f')}; "
            f"target step {_fmt(spec['target_step_s'], '.3f')} s, draft step {_fmt(spec['draft_step_s'], '.3f')} s, "
            f"other per step {_fmt(spec['other_per_step_s'], '.4f')} s"
        )
    for name, m in methods.items():
        if "tokens_per_second_loop_only" in m:
            notes.append(f"{name}: {_fmt(m['tokens_per_second_loop_only'], '.2f')} tokens/s counting only the decoding "
                         f"loop; other (loop overhead) per target call {_fmt(m['other_per_step_s'], '.4f')} s")
    costs = result.get("step_costs")
    if costs:
        k = costs["verify_tokens"]
        notes.append(
            f"direct step costs (median): target 1 token {costs['target_k1_s'] * 1e3:.0f} ms, {k} tokens "
            f"{costs[f'target_k{k}_s'] * 1e3:.0f} ms ({costs['verify_cost_ratio']:.2f}x)"
            + (f"; draft 1 token {costs['draft_k1_s'] * 1e3:.0f} ms, c = {costs['c_direct']:.3f}" if "c_direct" in costs else "")
        )
    for key, label in (("specdec_spec_vs_plain", "specdec-spec tokens == specdec-plain"),
                       ("hf_plain_vs_specdec_plain", "hf-plain tokens == specdec-plain"),
                       ("hf_assisted_vs_hf_plain", "hf-assisted tokens == hf-plain")):
        c = result["equality"].get(key)
        if c is not None:
            notes.append(f"{label}: {c['equal']}/{c['runs']} runs")
    for name, why in result.get("skipped", {}).items():
        notes.append(f"skipped {name}: {why}")
    return "\n".join(lines + notes)
