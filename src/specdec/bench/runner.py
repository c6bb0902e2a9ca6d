"""Running a bench: load once, warm every configuration up, time every configuration on every prompt.

For every temperature, each configuration first runs a few prompts untimed (``--warmup``, at most
:data:`WARMUP_TOKENS` tokens), then every configuration runs on every prompt in turn, the order rotated
from run to run so that drift (heat, caches, other work) hits all of them alike. Every configuration
gets the same prompt token ids and the same max_new_tokens; only the generation call is timed.
The step costs (:mod:`specdec.bench.timing`) and the weight floor are measured once, after the runs.

Here: the plan (units of prompts, then the costs) and the run. The pieces: :mod:`~specdec.bench.loading`
(the task, the models, the drafts and the cells, loaded once), :mod:`~specdec.bench.measuring` (warmup and
timing of a unit, the costs) and :mod:`~specdec.bench.document` (the result from the units' records).
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

from specdec.bench.arguments import validate
from specdec.bench.document import EQUALITY_CHECKS, document
from specdec.bench.grid import Grid
from specdec.bench.loading import LLAMA_CONTEXT_MARGIN, LLAMA_MIN_CONTEXT, Loaded, load_bench, task_from_args
from specdec.bench.measuring import (
    RUNS_LOG, WARMUP_TOKENS, costs_record, log_record, measure_batch, measure_shard, public_record,
)
from specdec.errors import SpecDecError
from specdec.models import LanguageModel
from specdec.sweeps import Unit, execute, plain_options, shards
from specdec.sweeps.machine import load_average
from specdec.sweeps.options import sweep_threads
from specdec.sweeps.pool import ModelPool
from specdec.sweeps.units import flatten, loaded_for

__all__ = ["run", "run_unit", "plan", "task_from_args", "WARMUP_TOKENS", "RUNS_LOG", "EQUALITY_CHECKS",
           "LLAMA_CONTEXT_MARGIN", "LLAMA_MIN_CONTEXT"]


def plan(args: argparse.Namespace, grid: Grid, n_prompts: int) -> list[Unit]:
    """The units of a bench run: every temperature x every shard of ``--shard-size`` prompts (default: all
    prompts, one unit per temperature), then the step costs."""
    options = plain_options(args)
    units = [Unit("bench", "prompts", options, t, shard) for t in grid.temperatures
             for shard in shards(n_prompts, args.shard_size)]
    if getattr(args, "batch_sizes", None) and n_prompts:  # the batch axis: every B of one temperature in one unit
        units += [Unit("bench", "batch", options, t, tuple(range(n_prompts))) for t in grid.temperatures]
    return units + [Unit("bench", "costs", options)] if n_prompts else units


def _run(loaded: Loaded, args: argparse.Namespace, unit: Unit, progress: bool = False) -> list[dict[str, Any]]:
    if unit.kind == "costs":
        return [costs_record(loaded, args)]
    # Everything alive now (models, tokenizers, modules) moves out of the collector's reach, so the
    # gc.collect() before each timed call is cheap and no collection of it lands inside a timing.
    gc.collect()
    gc.freeze()
    try:
        return (measure_batch if unit.kind == "batch" else measure_shard)(loaded, args, unit, progress)
    finally:
        gc.unfreeze()


def run_unit(unit: Unit) -> list[dict[str, Any]]:
    """One unit from its options alone (what a Ray worker runs): the models load once per process."""
    return _run(loaded_for(unit, load_bench), argparse.Namespace(**unit.options), unit)


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
    if ray is not None:
        args.threads = sweep_threads(args.threads)
    if args.out:  # this run's log starts empty, before anything (a model's load or conversion) can fail
        (Path(args.out).expanduser() / RUNS_LOG).unlink(missing_ok=True)
    loaded = load_bench(args, target, draft, pool, prepare=ray is None)
    load_before = load_average()
    units = plan(args, loaded.grid, len(loaded.prompt_ids))
    records = getattr(args, "records", None) or (str(Path(args.out).expanduser() / "units") if args.out and ray else None)

    def logged(unit: Unit, got: list[dict[str, Any]]) -> None:  # a Ray run logs each unit as it arrives
        for record in got:
            if record.get("record") == "prompt":
                log_record(args.out, record["temperature"], public_record(record))

    parts = execute(units, lambda unit: _run(loaded, args, unit, progress), ray=ray, num_cpus=args.threads or 1,
                    records=records, progress=progress and ray is not None, on_unit=logged if ray else None)
    return document(args, loaded, flatten(parts), load_before, ray, len(units))
