"""Running a bench: load once, warm every configuration up, time every configuration on every prompt.

For every temperature, each configuration first runs a few prompts untimed (``--warmup``, at most
:data:`WARMUP_TOKENS` tokens), then every configuration runs on every prompt in turn, the order rotated
from run to run so that drift (heat, caches, other work) hits all of them alike. Every configuration
gets the same prompt token ids and the same max_new_tokens; only the generation call is timed.
The step costs (:mod:`specdec.bench.timing`) and the weight floor are measured once, after the runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specdec.bench.aggregation import compare, grid_rows, speedups, summarize
from specdec.bench.arguments import validate
from specdec.sweeps.options import number_list
from specdec.bench.batch_axis import batch_cells, batch_rows, run_batch
from specdec.sweeps.pool import ModelPool, build_draft, check_models, corpus_ids, needs_corpus, spec_models
from specdec.drafters import plan_draft
from specdec.bench.formatting import short
from specdec.bench.grid import Cell, Grid, build_cells, grid_from_args, select_methods, skipped_assisted
from specdec.sweeps.machine import dtype_name, load_average, machine_info, machines_of, weight_floor, where_measured
from specdec.bench.methods import Settings, Trial, hf_runner, llama_cpp_runner, load_llama_cpp, specdec_runner
from specdec.models.llama_cpp import target_gguf
from specdec.tasks.metrics import check_metric_libraries, score
from specdec.tasks import Task, encode_item, has_chat_template, load_task, ngram_corpus
from specdec.bench.timing import StepCosts, measure_costs, primary_step_costs
from specdec.decoding import prepare_steps
from specdec.devices import describe, resolve_device
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, same_vocabulary
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats
from specdec.sweeps import Unit, execute, plain_options, shards
from specdec.sweeps.on_ray import TIMING_CAVEAT
from specdec.sweeps.units import flatten, loaded_for

WARMUP_TOKENS = 16  # warmup runs are untimed; a few tokens reach every code path
#: llama.cpp's context: the longest prompt + max_new_tokens + this margin, and at least LLAMA_MIN_CONTEXT.
LLAMA_CONTEXT_MARGIN = 16
LLAMA_MIN_CONTEXT = 512
#: The token-equality checks at temperature 0: (key, method, the method it must equal).
EQUALITY_CHECKS = (("specdec_spec_vs_plain", "specdec-spec", "specdec-plain"),
                   ("hf_plain_vs_specdec_plain", "hf-plain", "specdec-plain"),
                   ("hf_assisted_vs_hf_plain", "hf-assisted", "hf-plain"))


def task_from_args(args: argparse.Namespace) -> Task:
    if args.prompts_file:
        if args.task != "humaneval":
            raise SpecDecError("give either --prompts-file or --task, not both")
        return load_task(f"jsonl:{args.prompts_file}", args.n_prompts)
    return load_task(args.task, args.n_prompts)


@dataclass
class _Loaded:
    """What every unit of one bench run shares: the task's prompts, the models, the drafts, the cells."""

    task: Task
    prompt_ids: list[list[int]]
    target: LanguageModel
    drafts: dict[str, Any]
    pool: ModelPool
    cells: list[Cell]
    grid: Grid
    methods: list[str]
    corpus_source: str
    warmed: set[float] = field(default_factory=set)  # temperatures whose configurations ran their warmup here


def _load(args: argparse.Namespace, target: LanguageModel | None = None, draft: Any = None,
          pool: ModelPool | None = None, *, prepare: bool = True) -> _Loaded:
    """Load the task, the models and the drafts; ``prepare``: capture every step width and load llama.cpp
    (what the timed runs need; a Ray driver only plans and aggregates)."""
    # a target object given by the caller is what llama.cpp would have to match: its own name decides
    methods = select_methods(args.methods, args.target if target is None else str(target.name))
    device = resolve_device(args.device)
    if args.quantize and device.type != "cpu":
        raise SpecDecError("--quantize (dynamic int8) runs on CPU only; drop it for --device cuda")
    pool = pool if pool is not None else ModelPool(args.dtype, device=device, random_weights=args.random_weights,
                                                   compile=args.compile)
    if draft is not None:  # a model standing for the primary draft
        pool.models[args.draft] = draft
    grid = grid_from_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    task = task_from_args(args)
    check_metric_libraries(task.metrics)
    check_models(pool, None if target is not None else (args.target, args.quantize),
                 grid.drafts + [a for a in (grid.assisted or []) if a not in grid.drafts] if draft is None else [])
    target = target if target is not None else pool.get(args.target, args.quantize)
    uses_drafts = "specdec-spec" in methods or "hf-assisted" in methods
    corpus_text, corpus_source = ngram_corpus(args.ngram_corpus, task)
    ids_corpus = corpus_ids(corpus_text, target) if uses_drafts and needs_corpus(grid.drafts) else None
    drafts = {spec: build_draft(spec, pool, ids_corpus) for spec in grid.drafts} if uses_drafts else {}
    cells = build_cells(methods, grid, args.gamma)
    prompt_ids = [encode_item(target, item) for item in task.items]
    if prepare and prompt_ids:  # every step width the runs use, captured (and compiled) before any run is timed
        prepare_steps(target, list(drafts.values()), sorted(set(grid.gammas) | {args.gamma}),
                      max(map(len, prompt_ids)) + args.max_new_tokens + 1,
                      [SamplingParams(temperature=t) for t in grid.temperatures])
    n_ctx = max(max(map(len, prompt_ids), default=0) + args.max_new_tokens + LLAMA_CONTEXT_MARGIN, LLAMA_MIN_CONTEXT)
    if prepare and "llama-cpp" in methods and pool.llama_cpp is None:
        pool.llama_cpp = load_llama_cpp(target_gguf(args.target), n_ctx, torch.get_num_threads(), args.seed)
    if prepare and "llama-cpp-lookup" in methods and pool.llama_cpp_lookup is None:
        pool.llama_cpp_lookup = load_llama_cpp(target_gguf(args.target), n_ctx, torch.get_num_threads(), args.seed,
                                               lookup=True)
    return _Loaded(task, prompt_ids, target, drafts, pool, cells, grid, methods, corpus_source)


def plan(args: argparse.Namespace, grid: Grid, n_prompts: int) -> list[Unit]:
    """The units of a bench run: every temperature x every shard of ``--shard-size`` prompts (default: all
    prompts, one unit per temperature), then the step costs."""
    options = plain_options(args)
    units = [Unit("bench", "prompts", options, t, shard) for t in grid.temperatures
             for shard in shards(n_prompts, args.shard_size)]
    if getattr(args, "batch_sizes", None) and n_prompts:  # the batch axis: every B of one temperature in one unit
        units += [Unit("bench", "batch", options, t, tuple(range(n_prompts))) for t in grid.temperatures]
    return units + [Unit("bench", "costs", options)] if n_prompts else units


def _run(loaded: _Loaded, args: argparse.Namespace, unit: Unit, progress: bool = False) -> list[dict[str, Any]]:
    if unit.kind == "costs":
        return [_costs_record(loaded, args)]
    # Everything alive now (models, tokenizers, modules) moves out of the collector's reach, so the
    # gc.collect() before each timed call is cheap and no collection of it lands inside a timing.
    gc.collect()
    gc.freeze()
    try:
        return (_measure_batch if unit.kind == "batch" else _measure_shard)(loaded, args, unit, progress)
    finally:
        gc.unfreeze()


def run_unit(unit: Unit) -> list[dict[str, Any]]:
    """One unit from its options alone (what a Ray worker runs): the models load once per process."""
    return _run(loaded_for(unit, _load), argparse.Namespace(**unit.options), unit)


def run(args: argparse.Namespace, *, target: LanguageModel | None = None, draft: Any = None,
        pool: ModelPool | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the benchmark described by ``args`` and return the JSON-able result.

    target / draft / pool: models already loaded (tests inject tiny ones). ``draft`` (a model, or a
    drafter name) stands for the primary draft ``args.draft``; ``pool`` maps other draft names to
    models. By default everything is loaded from the names with ``args.dtype``. With ``args.ray`` the
    units run as Ray tasks, each worker loading the models from the names.
    """
    validate(args)
    if isinstance(draft, str):  # a drafter name for the primary draft: part of the options every unit reads
        args.drafts, draft = [draft], None
    ray = getattr(args, "ray", None)
    if ray is not None and (target is not None or pool is not None or draft is not None):
        raise SpecDecError("--ray loads the models by name in every worker: give names, not loaded models")
    if ray is not None and args.threads is None:
        args.threads = 1
    if args.out:  # this run's log starts empty, before anything (a model's load or conversion) can fail
        (Path(args.out).expanduser() / RUNS_LOG).unlink(missing_ok=True)
    loaded = _load(args, target, draft, pool, prepare=ray is None)
    load_before = load_average()
    units = plan(args, loaded.grid, len(loaded.prompt_ids))
    records = getattr(args, "records", None) or (str(Path(args.out).expanduser() / "units") if args.out and ray else None)

    def logged(unit: Unit, got: list[dict[str, Any]]) -> None:  # a Ray run logs each unit as it arrives
        for record in got:
            if record.get("record") == "prompt":
                _log_record(args.out, record["temperature"], _public(record))

    parts = execute(units, lambda unit: _run(loaded, args, unit, progress), ray=ray, num_cpus=args.threads or 1,
                    records=records, progress=progress and ray is not None, on_unit=logged if ray else None)
    return _document(args, loaded, flatten(parts), load_before, ray)


def _runners(cells: list[Cell], target: LanguageModel, drafts: dict[str, Any], pool: ModelPool, temperature: float,
             max_new_tokens: int, gamma: int, seed: int) -> dict[str, Any]:
    runners = {}
    for cell in cells:
        s = Settings(cell.gamma or gamma, temperature, max_new_tokens, seed, cell.schedule, cell.lenience,
                     cell.verification)
        if cell.method == "specdec-plain":
            runners[cell.label] = specdec_runner(target, None, s)
        elif cell.method == "specdec-spec":
            runners[cell.label] = specdec_runner(target, drafts[cell.draft], s)
        elif cell.method == "hf-plain":
            runners[cell.label] = hf_runner(target, s)
        elif cell.method == "llama-cpp":
            runners[cell.label] = llama_cpp_runner(pool.llama_cpp, set(target.eos_token_ids), s)
        elif cell.method == "llama-cpp-lookup":
            runners[cell.label] = llama_cpp_runner(pool.llama_cpp_lookup, set(target.eos_token_ids), s)
        elif cell.draft == "prompt-lookup":
            runners[cell.label] = hf_runner(target, s, prompt_lookup=True)
        else:
            name, quant = plan_draft(cell.draft).levels[0]
            assistant = pool.get(name, quant)
            # another tokenizer: transformers' universal assisted generation (it converts through text)
            other = None if same_vocabulary(target, assistant) else assistant.tokenizer
            runners[cell.label] = hf_runner(target, s, assistant=assistant.hf_model, assistant_tokenizer=other)
    return runners


def _costs_record(loaded: _Loaded, args: argparse.Namespace) -> dict[str, Any]:
    """The step costs and the weight floor, measured once per run (after its runs, when serial)."""
    models = {spec: spec_models(spec, loaded.pool) for spec in loaded.grid.drafts} if loaded.drafts else {}
    costs = measure_costs(loaded.target, models, loaded.prompt_ids[0], sorted(set(loaded.grid.gammas) | {args.gamma}))
    measured = {loaded.target.name: costs.target_k1_s}
    for entry in costs.drafts.values():
        measured.update(zip(entry.models, entry.k1_s))
    floor = weight_floor(loaded.target, [m for levels in models.values() for m in levels], measured)
    return {"record": "costs", "costs": costs.to_dict(), "floor": floor}


def _document(args: argparse.Namespace, loaded: _Loaded, records: list[dict[str, Any]], load_before: Any,
              ray: str | None) -> dict[str, Any]:
    """The JSON-able result from every unit's records."""
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
            "repeats": args.repeats,
            "warmup": args.warmup,
            "warmup_tokens": min(args.max_new_tokens, WARMUP_TOKENS),
            "seed": args.seed,
            "methods": [c.label for c in cells],
            "hf_assisted": {"num_assistant_tokens": args.gamma, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0,
                            "set_on": "the assistant's generation_config (where transformers reads them)"}
            if any(c.method == "hf-assisted" for c in cells) else None,
            "units": len(plan(args, grid, n_prompts)),
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


RUNS_LOG = "runs.jsonl"  # in --out: one line per prompt and repeat, written as each one ends


def _log_record(out_dir: str | None, temperature: float, record: dict[str, Any]) -> None:
    """Append one prompt's timings to ``<out>/runs.jsonl`` at once, so that a run stopped by a time limit
    (a GPU lease's, a CI job's) still leaves what it measured."""
    if not out_dir:
        return
    path = Path(out_dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    with open(path / RUNS_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps({"temperature": temperature, **record}) + "\n")


def _public(record: dict[str, Any]) -> dict[str, Any]:
    """A prompt's record as runs.jsonl and the document show it: its timings, without tokens and texts."""
    return {k: v for k, v in record.items() if k not in ("record", "index", "trials")}


def _measure_shard(loaded: _Loaded, args: argparse.Namespace, unit: Unit, progress: bool) -> list[dict[str, Any]]:
    """Warm every configuration up on the shard's first prompts, then time every configuration on every
    prompt of the shard in turn. One record per prompt and repeat: its timings, and every configuration's
    tokens, stats and (first repeat) text."""
    temperature, shard = unit.temperature, unit.prompts
    cells, target = loaded.cells, loaded.target
    runners = _runners(cells, target, loaded.drafts, loaded.pool, temperature, args.max_new_tokens, args.gamma,
                       args.seed)
    warm = _runners(cells, target, loaded.drafts, loaded.pool, temperature, min(args.max_new_tokens, WARMUP_TOKENS),
                    args.gamma, args.seed)
    names = [c.label for c in cells]
    # a process warms every configuration up once per temperature: its later units (shards) start warm
    n_warm = 0 if temperature in loaded.warmed else min(args.warmup, len(shard))
    loaded.warmed.add(temperature)
    bar = tqdm(total=(n_warm + len(shard) * args.repeats) * len(cells), desc=f"bench T={temperature:g}", unit="run",
               file=sys.stderr, disable=not progress, dynamic_ncols=True)
    for i in shard[:n_warm]:
        for name in names:
            bar.set_postfix_str(f"warmup {name}")
            warm[name](loaded.prompt_ids[i])
            bar.update()
    records: list[dict[str, Any]] = []
    turn = shard[0] * args.repeats if shard else 0  # the rotation continues across shards
    for i in shard:
        item, ids = loaded.task.items[i], loaded.prompt_ids[i]
        for r in range(args.repeats):
            order = names[turn % len(names):] + names[: turn % len(names)]  # rotate the order every run
            turn += 1
            record: dict[str, Any] = {"record": "prompt", "temperature": temperature, "index": i, "prompt": item.id,
                                      "repeat": r, "prompt_tokens": len(ids), "order": order,
                                      "load_average": load_average(), "machine": where_measured(), "trials": {}}
            for name in order:
                bar.set_postfix_str(f"{item.id} {name}")
                trial = runners[name](ids)
                record[name] = {"new_tokens": len(trial.tokens), "seconds": trial.seconds,
                                "cpu_utilization": trial.cpu_seconds / trial.seconds if trial.seconds > 0 else None,
                                "tokens_per_second": len(trial.tokens) / trial.seconds if trial.seconds > 0 else None}
                if trial.stats is not None:
                    record[name].update(target_calls=trial.stats.target_calls, alpha=trial.stats.alpha,
                                        mean_accepted_length=trial.stats.mean_accepted_length)
                record["trials"][name] = {"tokens": list(trial.tokens), "seconds": trial.seconds,
                                          "cpu_seconds": trial.cpu_seconds,
                                          "stats": asdict(trial.stats) if trial.stats is not None else None,
                                          "text": target.decode(trial.tokens) if r == 0 else None}
                bar.update()
            records.append(record)
            if getattr(args, "ray", None) is None:  # here: logged at once (a Ray run logs as units arrive)
                _log_record(args.out, temperature, _public(record))
    bar.close()
    return records


def _measure_batch(loaded: _Loaded, args: argparse.Namespace, unit: Unit, progress: bool) -> list[dict[str, Any]]:
    """Every B of ``--batch-sizes`` x every batch configuration over all the prompts, after a warmup at that B."""
    prompts = [loaded.prompt_ids[i] for i in unit.prompts]
    records = []
    for batch in number_list(args.batch_sizes, int, "--batch-sizes"):
        for cell in batch_cells(loaded.cells):
            draft = loaded.drafts.get(cell.draft) if cell.draft else None
            if args.warmup:
                run_batch(loaded.target, draft, cell, prompts[:batch], batch, unit.temperature,
                          min(args.max_new_tokens, WARMUP_TOKENS), args.seed)
            records.append(run_batch(loaded.target, draft, cell, prompts, batch, unit.temperature,
                                     args.max_new_tokens, args.seed))
    return records


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
            "runs": [_public(r) for r in records]}
