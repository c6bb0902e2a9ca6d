"""What a bench run writes: the markdown tables, the CSV of its rows, and the files of ``--out``.

:func:`table` is the single-configuration summary (method | tokens/s | speedups | alpha); :func:`grid_markdown`
the grid in the paper's Table 2 (speed and quality) and Table 4 (Theorem 8 vs measured) forms, with the
peers, the +-15% checks and the measured step costs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Sequence

from specdec.sweeps.machine import GB
from specdec.analysis.values import MISSING, MS_PER_S, fmt, ms, ratio, short


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
            f"| {name} | {fmt(m['tokens_per_second'], '.2f')} | {fmt(u['vs_specdec-plain'], '.2f')}x "
            f"| {fmt(u['vs_hf-plain'], '.2f')}x | {fmt(u['vs_hf-assisted'], '.2f')}x "
            f"| {fmt(m.get('alpha'), '.3f')} | {fmt(m.get('mean_accepted_length'), '.2f')} |"
        )
    cfg = result["config"]
    notes = [
        "",
        f"{cfg['n_prompts']} prompts x {cfg['repeats']} repeat(s), {cfg['max_new_tokens']} max new tokens, "
        f"gamma {cfg['gamma']}, temperature {cfg['temperature']}, {cfg['dtype']}, "
        f"{result['machine']['torch_threads']} torch threads; target {cfg['target']}"
        + (f" quantized {cfg['target_quantize']} (block-invariant: every method's output is the int8 model's own)" if cfg.get("target_quantize") else "")
        + f", draft {cfg['draft']}",
    ]
    notes.append("CPU utilization (process CPU s / wall s; about " + str(result["machine"]["torch_threads"])
                 + " = cores to itself): " + ", ".join(f"{n} {fmt(m['cpu_utilization'], '.2f')}" for n, m in methods.items()))
    load = result["machine"].get("load_average_before"), result["machine"].get("load_average_after")
    if None not in load:
        notes.append(f"1-minute load average before/after: {load[0]:.2f} / {load[1]:.2f} "
                     f"(much above {result['machine']['torch_threads']} means other work shared the CPU)")
    spec = methods.get("specdec-spec")
    if spec and "time_split" in spec:
        split = spec["time_split"]
        notes.append(
            f"specdec-spec time: the target's prefill {split.get('prefill') or 0:.0%}, draft {split['draft']:.0%} (its "
            f"prefill {ratio(spec.get('time_draft_start_s') or 0.0, spec['seconds']) or 0:.0%}), target "
            f"{split['target']:.0%}, other {split['other']:.0%}, "
            f"setup before the loop {split['setup']:.0%} ({spec['setup_per_call_s']:.3f} s a call); "
            f"acceptance rate {fmt(spec['acceptance_rate'], '.3f')}; per position "
            + " ".join(fmt(a, ".2f") for a in spec["acceptance_per_position"])
        )
        notes.append(
            f"c estimate (draft step / target step from the loop timers) {fmt(spec['c_estimate'], '.3f')}; "
            f"target step {fmt(spec['target_step_s'], '.3f')} s, draft step {fmt(spec['draft_step_s'], '.3f')} s, "
            f"other per step {fmt(spec['other_per_step_s'], '.4f')} s"
        )
    for name, m in methods.items():
        if "tokens_per_second_loop_only" in m:
            notes.append(f"{name}: {fmt(m['tokens_per_second_loop_only'], '.2f')} tokens/s counting only the decoding "
                         f"loop; other (loop overhead) per target call {fmt(m['other_per_step_s'], '.4f')} s")
    costs = result.get("step_costs")
    if costs:
        k = costs["verify_tokens"]
        notes.append(
            f"direct step costs (median): target 1 token {ms(costs['target_k1_s'])} ms, {k} tokens "
            f"{ms(costs[f'target_k{k}_s'])} ms ({costs['verify_cost_ratio']:.2f}x)"
            + (f"; draft 1 token {ms(costs['draft_k1_s'])} ms, c = {costs['c_direct']:.3f}" if "c_direct" in costs else "")
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
    "mean_accepted_length", "acceptance_rate", "c", "c_source", "c_direct", "c_loop", "draft_passes_per_target_token",
    "gamma_for_prediction",
    "expected_tokens", "predicted_speedup", "measured_over_predicted", "within_15pct", "tokens_factor", "cost_factor",
    "identical_to_plain", "cpu_utilization",
)

QUALITY_NAMES = {"bleu": "BLEU", "chrf": "chrF", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}


def quality_text(quality: dict[str, float] | None) -> str:
    if not quality:
        return MISSING
    return ", ".join(f"{QUALITY_NAMES.get(k, k)} {v:.1f}" for k, v in quality.items())


def _schedule(row: dict[str, Any]) -> str:
    text = row.get("schedule") or MISSING
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
        f"{', ' + cfg['target_quantize'] if cfg.get('target_quantize') else ''}), {cfg['n_prompts']} prompts "
        f"x {cfg['repeats']} repeat(s), at most {cfg['max_new_tokens']} new tokens. Quality: {cfg['quality_note']}.",
    ]
    if spec:
        lines += ["", "Speed and quality (paper Table 2 form; speedup = tokens/s vs specdec-plain, same prompts, same run):", "",
                  "| task | M_q | temp | gamma | schedule | alpha | mean accepted length | tokens/s | speedup | "
                  "quality (plain) | quality (speculative) | tokens == plain |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in spec:
            lines.append(
                f"| {r['task']} | {r['draft']} | {short(r['temperature'])} | {r['gamma']} | {_schedule(r)} | "
                f"{fmt(r.get('alpha'), '.3f')} | {fmt(r.get('mean_accepted_length'), '.2f')} | "
                f"{fmt(r['tokens_per_second'], '.2f')} | {fmt(r['speedup_vs_specdec_plain'], '.2f')}x | "
                f"{quality_text(plain_quality.get(r['temperature']))} | {quality_text(r.get('quality'))} | "
                f"{r.get('identical_to_plain') or MISSING} |")
        lines += ["", "Theorem 8 beside the measurement (paper Table 4 form; c measured directly for model drafts, "
                  "from the loop timers otherwise):", "",
                  "| task | M_q | temp | gamma | schedule | alpha | c | EXP (Theorem 8) | EMP (measured) | EMP / EXP | ±15% |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in spec:
            ok = r.get("within_15pct")
            lines.append(
                f"| {r['task']} | {r['draft']} | {short(r['temperature'])} | {r['gamma_for_prediction']}"
                f"{'' if r['schedule'] == 'constant' else '*'} | {_schedule(r)} | {fmt(r.get('alpha'), '.3f')} | "
                f"{fmt(r.get('c'), '.3f')} ({r.get('c_source')}) | {fmt(r.get('predicted_speedup'), '.2f')}x | "
                f"{fmt(r['speedup_vs_specdec_plain'], '.2f')}x | {fmt(r.get('measured_over_predicted'), '.2f')} | "
                f"{MISSING if ok is None else ('yes' if ok else 'NO')} |")
        if any(r["schedule"] != "constant" for r in spec):
            lines.append("\n\\* varying schedule: the prediction uses the mean number of tokens drafted per target call, rounded.")
    lines += ["", "Peers (same prompts, same run):", "",
              "| temp | method | tokens/s | vs specdec-plain | vs hf-plain | quality | tokens == specdec-plain |",
              "|---|---|---|---|---|---|---|"]
    for r in peers:
        lines.append(f"| {short(r['temperature'])} | {r['label']} | {fmt(r['tokens_per_second'], '.2f')} | "
                     f"{fmt(r['speedup_vs_specdec_plain'], '.2f')}x | {fmt(r['speedup_vs_hf_plain'], '.2f')}x | "
                     f"{quality_text(r.get('quality'))} | {r.get('identical_to_plain') or MISSING} |")
    checks = [r for r in spec if r.get("check")]
    if checks:
        lines += ["", "Theorem 8 checks (±15%); where one fails, measured/predicted = tokens factor x cost factor:", ""]
        for r in checks:
            lines.append(f"- {r['label']}, temperature {short(r['temperature'])}: {r['check']}")
    hierarchies = [r for r in spec if r.get("levels")]
    if hierarchies:
        lines += ["", "Hierarchies, per level (level 1 = the draft model verifying the level below it):", ""]
        for r in hierarchies:
            split = r.get("time_split") or {}
            levels = "; ".join(
                f"{lv['level']}: alpha {fmt(lv['alpha'], '.3f')}, {lv['calls']} calls, "
                f"{fmt(lv['tokens_per_call'], '.2f')} tokens/call, verify {lv['time_verify_s']:.2f} s, "
                f"inner draft {lv['time_inner_draft_s']:.2f} s" for lv in r["levels"])
            lines.append(f"- {r['label']}, temperature {short(r['temperature'])}: {levels}; time split of the run: "
                         + ", ".join(f"{k} {v:.0%}" for k, v in split.items() if v is not None))
    costs = result.get("costs")
    if costs:
        parts = [f"target 1 token {ms(costs['target_k1_s'])} ms"]
        for g, k in costs["verify_tokens"].items():
            parts.append(f"{k} tokens {ms(costs['target_s'][str(k)])} ms ({costs['verify_cost_ratio'][g]:.2f}x)")
        for spec_name, entry in costs["drafts"].items():
            if entry["models"]:
                parts.append(f"draft {spec_name}: " + ", ".join(
                    f"{m} {ms(t)} ms (c {c:.3f})" for m, t, c in zip(entry["models"], entry["k1_s"], entry["c_levels"])))
        lines += ["", "Direct step costs (median of single cached forward passes): " + "; ".join(parts)]
    lines += machine_lines(result)
    for name, why in result.get("skipped", {}).items():
        lines.append(f"Skipped {name}: {why}")
    return "\n".join(lines)


def machine_lines(result: dict[str, Any]) -> list[str]:
    """The machine of a bench document, and the machines that measured its prompts where they differ from it
    (a resumed or Ray sweep's units)."""
    machine = result.get("machine", {})
    if not machine:
        return []
    load = (machine.get("load_average_before"), machine.get("load_average_after"))
    lines = [f"Machine: {machine_name(machine)}"
             + f" ({machine.get('cpu_count')} CPUs, {machine.get('torch_threads')} torch threads), "
             f"torch {machine.get('torch')}, transformers {machine.get('transformers')}, {machine.get('date')}"
             + (f"; 1-minute load average before/after {load[0]:.2f}/{load[1]:.2f}" if None not in load else "")]
    if machine.get("kernels"):
        from specdec.models.kernels.int8_matmul import describe_code

        lines.append(f"Kernel code: {describe_code(machine['kernels'])}")
    how = (result.get("config") or {}).get("llama_cpp")
    if how:
        lines.append(f"llama.cpp: llama-cpp-python {how['llama_cpp_python']}, a build "
                     + ("with" if how["amx_in_build"] else "without") + " ggml's AMX kernel, extra buffer types "
                     + ("(repacked layouts) on" if how["extra_buffer_types"] else "off")
                     + " (SPECDEC_LLAMA_EXTRA_BUFFERS; docs/BENCHMARKING.md)")
    measured_on = machine.get("units_measured_on") or []
    if len(measured_on) > 1 or any(elsewhere(m, machine) for m in measured_on):
        lines.append("The prompts were measured on: " + "; ".join(measured_where(m) for m in measured_on)
                     + ". Speedups compare runs of one prompt, which one machine measured.")
    return lines


def machine_name(m: dict[str, Any]) -> str:
    """A machine record's processor and kind, with its GPU first where it had one: "GPU NVIDIA H200; CPU Intel
    Xeon, AMX, ...". A CUDA run's speed is the GPU's."""
    cpu = f"{m.get('cpu')}" + (f", {m['cpu_kind']}" if m.get("cpu_kind") else "")
    return f"GPU {m['gpu']}; CPU {cpu}" if m.get("gpu") else cpu


def elsewhere(measured: dict[str, Any], machine: dict[str, Any]) -> bool:
    """Whether records (an entry of ``units_measured_on``) came from another machine or code than ``machine``."""
    return any(measured.get(k) != machine.get(k) for k in ("cpu", "cpu_kind", "gpu", "code"))


def measured_where(m: dict[str, Any]) -> str:
    """An entry of ``units_measured_on`` in words."""
    return (f"{m['cpu']} ({m.get('cpu_kind') or 'kind not recorded'}){', GPU ' + m['gpu'] if m.get('gpu') else ''}, "
            f"specdec {m.get('code') or 'version not recorded'}, "
            f"{m['records']} runs" + (f", {m['first'][:10]} to {m['last'][:10]}" if m.get("first") else ""))


def batch_markdown(result: dict[str, Any]) -> str:
    """The batch axis (``--batch-sizes``): tokens/s per B, speculative over plain at the same B beside
    Theorem 8 per B, and where speculation stops paying ("" when the run had no batch axis)."""
    if not result.get("batch"):
        return ""
    lines = []
    for t, block in result["batch"].items():
        lines += [f"Batch axis, temperature {t}: every prompt through the batch engine, at most B rows at once",
                  "", "| B | method | tokens/s | alpha | c_B | v_B = T(B(gamma+1))/T(B) | EXP (Theorem 8, B rows) | "
                  "EMP (vs plain, same B) | tokens == plain | drafted a call |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(block["rows"], key=lambda r: (r["batch"], r["draft"] is not None, r["label"])):
            lines.append(f"| {r['batch']} | {r['label']} | {fmt(r['tokens_per_second'], '.2f')} | "
                         f"{fmt(r.get('alpha'), '.2f')} | {fmt(r.get('c_batch'), '.3f')} | "
                         f"{fmt(r.get('verify_cost_ratio_batch'), '.2f')} | {fmt(r.get('predicted_speedup'), '.2f')} | "
                         f"{fmt(r.get('speedup_vs_plain'), '.2f')} | {r.get('identical_to_plain') or MISSING} | "
                         f"{fmt(r.get('drafted_per_call'), '.2f')} |")
        lines.append("")
        for label, b in block["stops_paying_at"].items():
            lines.append(f"- {label}: " + (f"speculation stops paying at B = {b}" if b is not None
                                          else "speculation pays at every B measured"))
        lines += [f"- skipped {k}: {why}" for k, why in block["skipped"].items()] + [""]
    return "\n".join(lines).rstrip()


def write_csv(rows: Sequence[dict[str, Any]], path: Any) -> None:
    """The rows as CSV: the fixed columns, then one column per quality metric (quality_<metric>)."""
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


def write_outputs(result: dict[str, Any], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    """bench.json, bench.csv (the rows) and bench.md (the tables) in ``out_dir``."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "csv": out / f"{stem}.csv", "md": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    write_csv(result["rows"], paths["csv"])
    paths["md"].write_text(grid_markdown(result) + "\n\n" + batch_markdown(result) + "\n", encoding="utf-8")
    return paths


def publish(result: dict[str, Any], json_path: str | None = None, out_dir: str | None = None) -> None:
    """Write the JSON document to ``json_path`` and the files of ``out_dir`` (when given), then print the
    tables and the JSON document (last on stdout)."""
    document = json.dumps(result, indent=2)
    if json_path:
        Path(json_path).expanduser().write_text(document + "\n", encoding="utf-8")
    if out_dir:
        write_outputs(result, out_dir)
    print(table(result))
    print()
    print(grid_markdown(result))
    print()
    if result.get("batch"):
        print(batch_markdown(result))
        print()
    print(f"device: {result['device']}; weights: {result['weights']}")
    print(floor_markdown(result["floor"]))
    print()
    print(document, flush=True)


def floor_markdown(floor: dict[str, Any]) -> str:
    lines = [f"Weight-bandwidth floor (measured copy bandwidth {floor['bandwidth_bytes_per_s'] / GB:.0f} GB/s)", "",
             "| model | weights (GB) | floor (ms) | measured 1-token step (ms) | step / floor |", "|---|---|---|---|---|"]
    for r in floor["models"]:
        step = fmt(None if r["step_s"] is None else r["step_s"] * MS_PER_S, ".2f")
        lines.append(f"| {r['model']} | {r['weight_bytes'] / GB:.2f} | {r['floor_s'] * MS_PER_S:.2f} | {step} | "
                     f"{fmt(r['step_over_floor'], '.2f')} |")
    return "\n".join(lines)
