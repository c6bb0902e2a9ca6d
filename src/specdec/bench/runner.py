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
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specdec.bench.aggregation import compare, grid_rows, speedups, summarize
from specdec.bench.arguments import validate
from specdec.bench.drafts import ModelPool, build_draft, check_models, corpus_ids, needs_corpus, spec_models
from specdec.drafters import plan_draft
from specdec.bench.floor import weight_floor
from specdec.bench.formatting import short
from specdec.bench.grid import Cell, Grid, build_cells, grid_from_args, select_methods, skipped_assisted
from specdec.bench.machine import dtype_name, load_average, machine_info
from specdec.bench.methods import Settings, Trial, hf_runner, llama_cpp_runner, load_llama_cpp, specdec_runner, target_gguf
from specdec.bench.metrics import check_metric_libraries, score
from specdec.bench.tasks import Task, encode_item, has_chat_template, load_task, ngram_corpus
from specdec.bench.timing import measure_costs, primary_step_costs
from specdec.decoding import prepare_steps
from specdec.devices import describe, resolve_device
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, same_vocabulary

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


def run(args: argparse.Namespace, *, target: LanguageModel | None = None, draft: Any = None,
        pool: ModelPool | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the benchmark described by ``args`` and return the JSON-able result.

    target / draft / pool: models already loaded (tests inject tiny ones). ``draft`` (a model, or a
    drafter name) stands for the primary draft ``args.draft``; ``pool`` maps other draft names to
    models. By default everything is loaded from the names with ``args.dtype``.
    """
    validate(args)
    # a target object given by the caller is what llama.cpp would have to match: its own name decides
    methods = select_methods(args.methods, args.target if target is None else str(target.name))
    device = resolve_device(args.device)
    if args.quantize and device.type != "cpu":
        raise SpecDecError("--quantize (dynamic int8) runs on CPU only; drop it for --device cuda")
    pool = pool if pool is not None else ModelPool(args.dtype, device=device, random_weights=args.random_weights,
                                                   compile=args.compile)
    draft_override = None
    if isinstance(draft, str):
        draft_override = draft
    elif draft is not None:
        pool.models[args.draft] = draft
    grid = grid_from_args(args, draft_override)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    task = task_from_args(args)
    check_metric_libraries(task.metrics)
    if args.out:  # this run's log starts empty, before anything (a model's load or conversion) can fail
        (Path(args.out).expanduser() / RUNS_LOG).unlink(missing_ok=True)
    check_models(pool, None if target is not None else (args.target, args.quantize),
                 grid.drafts + [a for a in (grid.assisted or []) if a not in grid.drafts] if draft is None else [])
    target = target if target is not None else pool.get(args.target, args.quantize)
    uses_drafts = "specdec-spec" in methods or "hf-assisted" in methods
    corpus_text, corpus_source = ngram_corpus(args.ngram_corpus, task)
    ids_corpus = corpus_ids(corpus_text, target) if uses_drafts and needs_corpus(grid.drafts) else None
    drafts = {spec: build_draft(spec, pool, ids_corpus) for spec in grid.drafts} if uses_drafts else {}
    cells = build_cells(methods, grid, args.gamma)
    prompt_ids = [encode_item(target, item) for item in task.items]
    if prompt_ids:  # every step width the runs use, captured (and compiled) before any run is timed
        prepare_steps(target, list(drafts.values()), sorted(set(grid.gammas) | {args.gamma}),
                      max(map(len, prompt_ids)) + args.max_new_tokens + 1)
    if "llama-cpp" in methods and pool.llama_cpp is None:
        n_ctx = max(map(len, prompt_ids), default=0) + args.max_new_tokens + LLAMA_CONTEXT_MARGIN
        pool.llama_cpp = load_llama_cpp(target_gguf(args.target), max(n_ctx, LLAMA_MIN_CONTEXT),
                                        torch.get_num_threads(), args.seed)

    # Everything alive now (models, tokenizers, modules) moves out of the collector's reach, so the
    # gc.collect() before each timed call is cheap and no collection of it lands inside a timing.
    gc.collect()
    gc.freeze()
    try:
        return _measure(args, task, prompt_ids, target, drafts, pool, cells, grid, methods, corpus_source, progress)
    finally:
        gc.unfreeze()


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
        elif cell.draft == "prompt-lookup":
            runners[cell.label] = hf_runner(target, s, prompt_lookup=True)
        else:
            name, quant = plan_draft(cell.draft).levels[0]
            assistant = pool.get(name, quant)
            # another tokenizer: transformers' universal assisted generation (it converts through text)
            other = None if same_vocabulary(target, assistant) else assistant.tokenizer
            runners[cell.label] = hf_runner(target, s, assistant=assistant.hf_model, assistant_tokenizer=other)
    return runners


def _measure(args: argparse.Namespace, task: Task, prompt_ids: list[list[int]], target: LanguageModel,
             drafts: dict[str, Any], pool: ModelPool, cells: list[Cell], grid: Grid, methods: list[str],
             corpus_source: str, progress: bool) -> dict[str, Any]:
    load_before = load_average()
    n_warm = min(args.warmup, len(prompt_ids))
    per_temperature = (n_warm + len(prompt_ids) * args.repeats) * len(cells)
    bar = tqdm(total=per_temperature * len(grid.temperatures), desc="bench", unit="run", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    blocks: dict[str, dict[str, Any]] = {}
    for temperature in grid.temperatures:
        runners = _runners(cells, target, drafts, pool, temperature, args.max_new_tokens, args.gamma, args.seed)
        warm = _runners(cells, target, drafts, pool, temperature, min(args.max_new_tokens, WARMUP_TOKENS), args.gamma,
                        args.seed)
        blocks[short(temperature)] = _measure_temperature(args, task, prompt_ids, target, cells, runners, warm,
                                                          temperature, bar)
    bar.close()
    skipped = skipped_assisted(methods, grid)

    models = {spec: spec_models(spec, pool) for spec in grid.drafts} if drafts else {}
    costs = measure_costs(target, models, prompt_ids[0], sorted(set(grid.gammas) | {args.gamma})) if prompt_ids else None
    rows = []
    for temperature in grid.temperatures:
        rows.extend(grid_rows(task, temperature, blocks[short(temperature)], cells, costs))
    first = blocks[short(grid.temperatures[0])]
    primary = grid.drafts[0] if grid.drafts else args.draft
    primary_obj = drafts.get(primary)
    dtype = dtype_name(target.dtype)
    return {
        "benchmark": "specdec bench",
        "config": {
            "target": target.name,
            "draft": primary_obj.name if isinstance(primary_obj, LanguageModel) else primary,
            "gamma": args.gamma,
            "n_prompts": len(prompt_ids),
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
            "ngram_corpus": corpus_source if needs_corpus(grid.drafts) else None,
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
        },
        "device": describe(target.device),
        "weights": "random (the presets' architectures; timings only)" if getattr(args, "random_weights", False)
        else "real",
        "floor": weight_floor(target, [m for levels in models.values() for m in levels], costs),
        "machine": {**machine_info(dtype), "load_average_before": load_before,
                    "load_average_after": load_average() if load_before is not None else None},
        # The first temperature's results in the single-configuration layout:
        "methods": first["methods"],
        "speedups": first["speedups"],
        "equality": first["equality"],
        "runs": first["runs"],
        "step_costs": primary_step_costs(costs, primary, args.gamma),
        "costs": costs,
        "by_temperature": blocks,
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


def _measure_temperature(args: argparse.Namespace, task: Task, prompt_ids: list[list[int]], target: LanguageModel,
                         cells: list[Cell], runners: dict[str, Any], warm: dict[str, Any], temperature: float,
                         bar: tqdm) -> dict[str, Any]:
    names = [c.label for c in cells]
    for i in range(min(args.warmup, len(prompt_ids))):
        for name in names:
            bar.set_postfix_str(f"T={temperature:g} warmup {name}")
            warm[name](prompt_ids[i])
            bar.update()
    trials: dict[str, list[Trial]] = {name: [] for name in names}
    first_trials: dict[str, list[Trial]] = {name: [] for name in names}
    labels: list[str] = []
    records: list[dict[str, Any]] = []
    turn = 0
    for item, ids in zip(task.items, prompt_ids):
        for r in range(args.repeats):
            order = names[turn % len(names):] + names[: turn % len(names)]  # rotate the order every run
            turn += 1
            record: dict[str, Any] = {"prompt": item.id, "repeat": r, "prompt_tokens": len(ids), "order": order,
                                      "load_average": load_average()}
            for name in order:
                bar.set_postfix_str(f"T={temperature:g} {item.id} {name}")
                trial = runners[name](ids)
                trials[name].append(trial)
                if r == 0:
                    first_trials[name].append(trial)
                record[name] = {"new_tokens": len(trial.tokens), "seconds": trial.seconds,
                                "cpu_utilization": trial.cpu_seconds / trial.seconds if trial.seconds > 0 else None,
                                "tokens_per_second": len(trial.tokens) / trial.seconds if trial.seconds > 0 else None}
                if trial.stats is not None:
                    record[name].update(target_calls=trial.stats.target_calls, alpha=trial.stats.alpha,
                                        mean_accepted_length=trial.stats.mean_accepted_length)
                bar.update()
            labels.append(f"{item.id}#{r}")
            records.append(record)
            _log_record(args.out, temperature, record)

    summaries = {name: summarize(trials[name]) for name in names}
    outputs = {name: [target.decode(t.tokens) for t in first_trials[name]] for name in names}
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
            "identical_to_plain": identical, "quality": quality, "outputs": outputs, "runs": records}
