"""Measuring a bench unit: for a shard of prompts, every configuration warmed up, then timed on every
prompt in turn (the order rotated from run to run), each prompt's timings logged to ``runs.jsonl`` as it
ends; for the batch axis, every batch size x every batch configuration; and the step costs and the weight
floor, once per run."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specdec.bench.batch_axis import batch_cells, run_batch
from specdec.bench.grid import Cell
from specdec.bench.loading import Loaded
from specdec.bench.methods import Settings, hf_runner, llama_cpp_runner, specdec_runner
from specdec.bench.timing import measure_costs
from specdec.drafters import plan_draft
from specdec.models import LanguageModel, same_vocabulary
from specdec.sweeps import Unit
from specdec.sweeps.machine import load_average, weight_floor, where_measured
from specdec.sweeps.options import number_list
from specdec.sweeps.pool import ModelPool, spec_models

WARMUP_TOKENS = 16  # warmup runs are untimed; a few tokens reach every code path
RUNS_LOG = "runs.jsonl"  # in --out: one line per prompt and repeat, written as each one ends


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
            level = plan_draft(cell.draft).levels[0]
            name, quant = level.name, level.quantize
            assistant = pool.get(name, quant)
            # another tokenizer: transformers' universal assisted generation (it converts through text)
            other = None if same_vocabulary(target, assistant) else assistant.tokenizer
            runners[cell.label] = hf_runner(target, s, assistant=assistant.hf_model, assistant_tokenizer=other)
    return runners


def costs_record(loaded: Loaded, args: argparse.Namespace) -> dict[str, Any]:
    """The step costs and the weight floor, measured once per run (after its runs, when serial)."""
    models = {spec: spec_models(spec, loaded.pool) for spec in loaded.grid.drafts} if loaded.drafts else {}
    costs = measure_costs(loaded.target, models, loaded.prompt_ids[0], sorted(set(loaded.grid.gammas) | {args.gamma}))
    measured = {loaded.target.name: costs.target_k1_s}
    for entry in costs.drafts.values():
        measured.update(zip(entry.models, entry.k1_s))
    floor = weight_floor(loaded.target, [m for levels in models.values() for m in levels], measured)
    return {"record": "costs", "costs": costs.to_dict(), "floor": floor}


def log_record(out_dir: str | None, temperature: float, record: dict[str, Any]) -> None:
    """Append one prompt's timings to ``<out>/runs.jsonl`` at once, so that a run stopped by a time limit
    (a GPU lease's, a CI job's) still leaves what it measured."""
    if not out_dir:
        return
    path = Path(out_dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    with open(path / RUNS_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps({"temperature": temperature, **record}) + "\n")


def public_record(record: dict[str, Any]) -> dict[str, Any]:
    """A prompt's record as runs.jsonl and the document show it: its timings, without tokens and texts."""
    return {k: v for k, v in record.items() if k not in ("record", "index", "trials")}


def measure_shard(loaded: Loaded, args: argparse.Namespace, unit: Unit, progress: bool) -> list[dict[str, Any]]:
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
                log_record(args.out, temperature, public_record(record))
    bar.close()
    return records


def measure_batch(loaded: Loaded, args: argparse.Namespace, unit: Unit, progress: bool) -> list[dict[str, Any]]:
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
