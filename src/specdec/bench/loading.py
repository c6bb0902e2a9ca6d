"""Loading a bench run: the task's prompts, the target, the drafts and the configurations (cells) that every
unit of the run shares, and what the timed runs need first (every step width captured, llama.cpp loaded)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.bench.grid import Cell, Grid, build_cells, grid_from_args, select_methods
from specdec.bench.methods import load_llama_cpp
from specdec.decoding import prepare_steps
from specdec.devices import resolve_device
from specdec.errors import SpecDecError
from specdec.models import LanguageModel
from specdec.models.llama_cpp import target_gguf
from specdec.sampling import SamplingParams
from specdec.sweeps.pool import ModelPool, build_draft, check_models, corpus_ids, needs_corpus
from specdec.tasks import Task, encode_item, load_task, ngram_corpus
from specdec.tasks.metrics import check_metric_libraries

#: llama.cpp's context: the longest prompt + max_new_tokens + this margin, and at least LLAMA_MIN_CONTEXT.
LLAMA_CONTEXT_MARGIN = 16
LLAMA_MIN_CONTEXT = 512


def task_from_args(args: argparse.Namespace) -> Task:
    if args.prompts_file:
        if args.task != "humaneval":
            raise SpecDecError("give either --prompts-file or --task, not both")
        return load_task(f"jsonl:{args.prompts_file}", args.n_prompts)
    return load_task(args.task, args.n_prompts)


@dataclass
class Loaded:
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


def load_bench(args: argparse.Namespace, target: LanguageModel | None = None, draft: Any = None,
          pool: ModelPool | None = None, *, prepare: bool = True) -> Loaded:
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
    return Loaded(task, prompt_ids, target, drafts, pool, cells, grid, methods, corpus_source)
