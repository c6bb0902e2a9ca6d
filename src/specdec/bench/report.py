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
        calls = sum(m["target_calls"] for m in mine)
        drafted = sum(m["drafted"] for m in mine)
        accepted = sum(m["accepted"] for m in mine)
        betas = [(m["alpha"], m["drafted"]) for m in mine if m.get("alpha") is not None]
        out.append({
            "level": mine[0]["level"],
            "calls": calls,  # forward passes of this level's model (its verification steps)
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": _ratio(accepted, drafted),
            # alpha between this level's model and the level below it, weighted by drafted tokens
            "alpha": _ratio(sum(a * d for a, d in betas), sum(d for _, d in betas)) if betas else None,
            "tokens_per_call": _ratio(sum(m["new_tokens"] for m in mine), calls),
            "time_verify_s": sum(m["time_target_s"] for m in mine),
            "time_inner_draft_s": sum(m["time_draft_s"] for m in mine),
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


def cpu_model() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(dtype: str) -> dict[str, Any]:
    import transformers

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_model(),
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
        f"{result['machine']['torch_threads']} torch threads; target {cfg['target']}"
        + (f" quantized {cfg['target_quantize']} (opt-in; with a draft NOT exact even for the quantized model: see README)" if cfg.get("target_quantize") else "")
        + f", draft {cfg['draft']}",
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


# -- the grid: paper Table 2 / Table 4 forms, peers, checks, CSV ---------------------------------------

CSV_COLUMNS = (
    "task", "temperature", "label", "method", "draft", "gamma", "schedule", "lenience", "exact", "runs", "new_tokens",
    "seconds", "tokens_per_second", "speedup_vs_specdec_plain", "speedup_vs_hf_plain", "alpha",
    "mean_accepted_length", "acceptance_rate", "c", "c_source", "c_direct", "c_loop", "gamma_for_prediction",
    "expected_tokens", "predicted_speedup", "measured_over_predicted", "within_15pct", "tokens_factor", "cost_factor",
    "identical_to_plain", "cpu_utilization",
)

QUALITY_NAMES = {"bleu": "BLEU", "chrf": "chrF", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}


def quality_text(quality: dict[str, float] | None) -> str:
    if not quality:
        return "–"
    return ", ".join(f"{QUALITY_NAMES.get(k, k)} {v:.1f}" for k, v in quality.items())


def _temp(t: float) -> str:
    return format(t, "g")


def _schedule(row: dict[str, Any]) -> str:
    text = row.get("schedule") or "–"
    if row.get("lenience") is not None and row["lenience"] != 1.0:
        text += f", l={row['lenience']:g} (NOT exact)"
    return text


def grid_markdown(result: dict[str, Any]) -> str:
    """The grid as markdown: speed and quality (Table 2 form), Theorem 8 vs measured (Table 4 form),
    the peers, the +-15% checks with the gap explained, and the measured costs."""
    cfg = result["config"]
    rows = result["rows"]
    spec = [r for r in rows if r["method"] == "specdec-spec"]
    peers = [r for r in rows if r["method"] != "specdec-spec"]
    plain_quality = {r["temperature"]: r.get("quality") for r in rows if r["method"] == "specdec-plain"}
    lines = [
        f"Task {cfg['task']}: {cfg['task_source']}. Target {cfg['target']} ({cfg['dtype']}"
        f"{', ' + cfg['target_quantize'] + ' opt-in' if cfg.get('target_quantize') else ''}), {cfg['n_prompts']} prompts "
        f"x {cfg['repeats']} repeat(s), at most {cfg['max_new_tokens']} new tokens. Quality: {cfg['quality_note']}.",
    ]
    if spec:
        lines += ["", "Speed and quality (paper Table 2 form; speedup = tokens/s vs specdec-plain, same prompts, same run):", "",
                  "| task | M_q | temp | gamma | schedule | alpha | mean accepted length | tokens/s | speedup | "
                  "quality (plain) | quality (speculative) | tokens == plain |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in spec:
            lines.append(
                f"| {r['task']} | {r['draft']} | {_temp(r['temperature'])} | {r['gamma']} | {_schedule(r)} | "
                f"{_fmt(r.get('alpha'), '.3f')} | {_fmt(r.get('mean_accepted_length'), '.2f')} | "
                f"{_fmt(r['tokens_per_second'], '.2f')} | {_fmt(r['speedup_vs_specdec_plain'], '.2f')}x | "
                f"{quality_text(plain_quality.get(r['temperature']))} | {quality_text(r.get('quality'))} | "
                f"{r.get('identical_to_plain') or '–'} |")
        lines += ["", "Theorem 8 beside the measurement (paper Table 4 form; c measured directly for model drafts, "
                  "from the loop timers otherwise):", "",
                  "| task | M_q | temp | gamma | schedule | alpha | c | EXP (Theorem 8) | EMP (measured) | EMP / EXP | ±15% |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in spec:
            ok = r.get("within_15pct")
            lines.append(
                f"| {r['task']} | {r['draft']} | {_temp(r['temperature'])} | {r['gamma_for_prediction']}"
                f"{'' if r['schedule'] == 'constant' else '*'} | {_schedule(r)} | {_fmt(r.get('alpha'), '.3f')} | "
                f"{_fmt(r.get('c'), '.3f')} ({r.get('c_source')}) | {_fmt(r.get('predicted_speedup'), '.2f')}x | "
                f"{_fmt(r['speedup_vs_specdec_plain'], '.2f')}x | {_fmt(r.get('measured_over_predicted'), '.2f')} | "
                f"{'–' if ok is None else ('yes' if ok else 'NO')} |")
        if any(r["schedule"] != "constant" for r in spec):
            lines.append("\n\\* varying schedule: the prediction uses the mean number of tokens drafted per target call, rounded.")
    lines += ["", "Peers (same prompts, same run):", "",
              "| temp | method | tokens/s | vs specdec-plain | vs hf-plain | quality | tokens == specdec-plain |",
              "|---|---|---|---|---|---|---|"]
    for r in peers:
        lines.append(f"| {_temp(r['temperature'])} | {r['label']} | {_fmt(r['tokens_per_second'], '.2f')} | "
                     f"{_fmt(r['speedup_vs_specdec_plain'], '.2f')}x | {_fmt(r['speedup_vs_hf_plain'], '.2f')}x | "
                     f"{quality_text(r.get('quality'))} | {r.get('identical_to_plain') or '–'} |")
    checks = [r for r in spec if r.get("check")]
    if checks:
        lines += ["", "Theorem 8 checks (±15%); where one fails, measured/predicted = tokens factor x cost factor:", ""]
        for r in checks:
            lines.append(f"- {r['label']}, temperature {_temp(r['temperature'])}: {r['check']}")
    hierarchies = [r for r in spec if r.get("levels")]
    if hierarchies:
        lines += ["", "Hierarchies, per level (level 1 = the draft model verifying the level below it):", ""]
        for r in hierarchies:
            split = r.get("time_split") or {}
            levels = "; ".join(
                f"{lv['level']}: alpha {_fmt(lv['alpha'], '.3f')}, {lv['calls']} calls, "
                f"{_fmt(lv['tokens_per_call'], '.2f')} tokens/call, verify {lv['time_verify_s']:.2f} s, "
                f"inner draft {lv['time_inner_draft_s']:.2f} s" for lv in r["levels"])
            lines.append(f"- {r['label']}, temperature {_temp(r['temperature'])}: {levels}; time split of the run: "
                         + ", ".join(f"{k} {v:.0%}" for k, v in split.items() if v is not None))
    costs = result.get("costs")
    if costs:
        parts = [f"target 1 token {costs['target_k1_s'] * 1e3:.0f} ms"]
        for g, k in costs["verify_tokens"].items():
            parts.append(f"{k} tokens {costs['target_s'][str(k)] * 1e3:.0f} ms ({costs['verify_cost_ratio'][g]:.2f}x)")
        for spec_name, entry in costs["drafts"].items():
            if entry["models"]:
                parts.append(f"draft {spec_name}: " + ", ".join(
                    f"{m} {t * 1e3:.0f} ms (c {c:.3f})" for m, t, c in zip(entry["models"], entry["k1_s"], entry["c_levels"])))
        lines += ["", "Direct step costs (median of single cached forward passes): " + "; ".join(parts)]
    machine = result.get("machine", {})
    if machine:
        load = (machine.get("load_average_before"), machine.get("load_average_after"))
        lines.append(
            f"Machine: {machine.get('cpu')} ({machine.get('cpu_count')} CPUs, {machine.get('torch_threads')} torch threads), "
            f"torch {machine.get('torch')}, transformers {machine.get('transformers')}, {machine.get('date')}"
            + (f"; 1-minute load average before/after {load[0]:.2f}/{load[1]:.2f}" if None not in load else ""))
    for name, why in result.get("skipped", {}).items():
        lines.append(f"Skipped {name}: {why}")
    return "\n".join(lines)


def write_csv(rows: Sequence[dict[str, Any]], path: Any) -> None:
    """The rows as CSV: the fixed columns, then one column per quality metric (quality_<metric>)."""
    import csv

    metrics: list[str] = []
    for r in rows:
        for k in (r.get("quality") or {}):
            if k not in metrics:
                metrics.append(k)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*CSV_COLUMNS, *(f"quality_{m}" for m in metrics)])
        for r in rows:
            th = r.get("theorem8") or {}
            values = [th.get(c) if c in ("tokens_factor", "cost_factor") else r.get(c) for c in CSV_COLUMNS]
            writer.writerow([*values, *((r.get("quality") or {}).get(m) for m in metrics)])
