"""The result document of a bench run: every temperature's block (summaries, speedups, the equality checks
at temperature 0, quality, outputs), the grid's rows, the step costs, the machine and the configuration,
built from the units' plain records alone (wherever they ran)."""

from __future__ import annotations

import argparse
from typing import Any

from specdec.bench.aggregation import compare, grid_rows, speedups, summarize
from specdec.bench.batch_axis import batch_rows
from specdec.analysis.values import short
from specdec.bench.grid import Cell, skipped_assisted
from specdec.bench.loading import Loaded
from specdec.bench.measuring import WARMUP_TOKENS, public_record
from specdec.bench.methods import Trial
from specdec.bench.timing import StepCosts, primary_step_costs
from specdec.devices import describe
from specdec.models import LanguageModel, llama_cpp
from specdec.stats import GenerationStats
from specdec.sweeps.machine import dtype_name, load_average, machine_info, machines_of
from specdec.sweeps.on_ray import TIMING_CAVEAT
from specdec.sweeps.pool import needs_corpus
from specdec.tasks import Task, has_chat_template
from specdec.tasks.metrics import score

#: The token-equality checks at temperature 0: (key, method, the method it must equal).
EQUALITY_CHECKS = (("specdec_spec_vs_plain", "specdec-spec", "specdec-plain"),
                   ("hf_plain_vs_specdec_plain", "hf-plain", "specdec-plain"),
                   ("hf_assisted_vs_hf_plain", "hf-assisted", "hf-plain"))


def document(args: argparse.Namespace, loaded: Loaded, records: list[dict[str, Any]], load_before: Any,
             ray: str | None, units: int) -> dict[str, Any]:
    """The JSON-able result from every unit's records (``units``: how many units the run was planned as)."""
    task, target, grid, cells = loaded.task, loaded.target, loaded.grid, loaded.cells
    blocks: dict[str, dict[str, Any]] = {}
    for temperature in grid.temperatures:
        mine = [r for r in records if r.get("record") == "prompt" and r["temperature"] == temperature]
        blocks[short(temperature)] = _block(task, temperature, sorted(mine, key=lambda r: (r["index"], r["repeat"])),
                                            cells)
    skipped = skipped_assisted(loaded.methods, grid)
    measured = next((r for r in records if r.get("record") == "costs"), None)
    costs = StepCosts.from_dict(measured["costs"]) if measured else None
    rows = []
    for temperature in grid.temperatures:
        rows.extend(grid_rows(task, temperature, blocks[short(temperature)], cells, costs))
    first = blocks[short(grid.temperatures[0])]
    primary = grid.drafts[0] if grid.drafts else args.draft
    primary_obj = loaded.drafts.get(primary)
    dtype = dtype_name(target.dtype)
    n_prompts = len(loaded.prompt_ids)
    return {
        "benchmark": "specdec bench",
        "config": {
            "target": target.name,
            "draft": primary_obj.name if isinstance(primary_obj, LanguageModel) else primary,
            "gamma": args.gamma,
            "n_prompts": n_prompts,
            "prompts": args.prompts_file or task.source,
            "task": task.name,
            "task_source": task.source,
            "chat_template": any(i.chat for i in task.items) and has_chat_template(target),
            "quality_metrics": list(task.metrics),
            "quality_note": task.metric_note,
            "max_new_tokens": args.max_new_tokens,
            "temperature": grid.temperatures[0],
            "temperatures": grid.temperatures,
            "drafts": grid.drafts,
            "gammas": grid.gammas,
            "gamma_schedules": grid.schedules,
            "leniences": grid.leniences,
            "verifications": grid.verifications,
            "ngram_corpus": loaded.corpus_source if needs_corpus(grid.drafts) else None,
            "dtype": dtype,
            "target_quantize": args.quantize,
            # how the llama-cpp methods ran (the build and its weight buffers decide llama.cpp's speed on a CPU)
            "llama_cpp": llama_cpp.configuration()
            if llama_cpp.installed() and any(c.method.startswith("llama-cpp") for c in cells) else None,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "warmup_tokens": min(args.max_new_tokens, WARMUP_TOKENS),
            "seed": args.seed,
            "methods": [c.label for c in cells],
            "hf_assisted": {"num_assistant_tokens": args.gamma, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0,
                            "set_on": "the assistant's generation_config (where transformers reads them)"}
            if any(c.method == "hf-assisted" for c in cells) else None,
            "units": units,
            "ran_on": f"Ray ({ray})" if ray is not None else "this process",
            "timing_note": TIMING_CAVEAT if ray is not None else None,
        },
        "device": describe(target.device),
        "weights": "random (the presets' architectures; timings only)" if getattr(args, "random_weights", False)
        else "real",
        "floor": measured["floor"] if measured else None,
        "machine": {**machine_info(dtype), "load_average_before": load_before,
                    "load_average_after": load_average() if load_before is not None else None,
                    # the machines that measured the prompts (a resumed or Ray sweep's units may come from several)
                    "units_measured_on": machines_of([r for r in records if r.get("record") == "prompt"])},
        # The first temperature's results in the single-configuration layout:
        "methods": first["methods"],
        "speedups": first["speedups"],
        "equality": first["equality"],
        "runs": first["runs"],
        "step_costs": primary_step_costs(costs, primary, args.gamma),
        "costs": costs.to_dict() if costs else None,
        "by_temperature": blocks,
        "batch": {short(t): batch_rows([r for r in records if r.get("record") == "batch" and r["temperature"] == t])
                  for t in grid.temperatures} if getattr(args, "batch_sizes", None) else None,
        "rows": rows,
        "skipped": skipped,
    }


def _trial(entry: dict[str, Any]) -> Trial:
    stats = GenerationStats(**entry["stats"]) if entry["stats"] is not None else None
    return Trial(list(entry["tokens"]), entry["seconds"], stats, entry["cpu_seconds"])


def _block(task: Task, temperature: float, records: list[dict[str, Any]], cells: list[Cell]) -> dict[str, Any]:
    """One temperature's results from its prompt records (in prompt and repeat order)."""
    names = [c.label for c in cells]
    trials = {name: [_trial(r["trials"][name]) for r in records] for name in names}
    first = [r for r in records if r["repeat"] == 0]
    labels = [f"{r['prompt']}#{r['repeat']}" for r in records]
    summaries = {name: summarize(trials[name]) for name in names}
    outputs = {name: [r["trials"][name]["text"] for r in first] for name in names}
    quality: dict[str, dict[str, float] | None] = {}
    for name in names:
        if task.metrics and task.has_references:
            quality[name] = score(task.metrics, [task.clean(text) for text in outputs[name]], task.references)
        else:
            quality[name] = None
        summaries[name]["quality"] = quality[name]
    equality: dict[str, Any] = {}
    identical: dict[str, Any] = {}
    if temperature == 0:
        for key, a, b in EQUALITY_CHECKS:
            if a in trials and b in trials:
                equality[key] = compare(trials[a], trials[b], labels)
        if "specdec-plain" in trials:
            for name in names:
                if name != "specdec-plain":
                    identical[name] = compare(trials[name], trials["specdec-plain"], labels)
    return {"temperature": temperature, "methods": summaries, "speedups": speedups(summaries), "equality": equality,
            "identical_to_plain": identical, "quality": quality, "outputs": outputs,
            "runs": [public_record(r) for r in records]}
