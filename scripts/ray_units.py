"""Tasks or actors for a sweep on Ray: what a worker's first unit costs (it loads the models) against the
units after it (the models stay in the worker's cache), next to the same units run serially here.

    python scripts/ray_units.py --out docs/results/ray_units        # the default pair, 6 alpha units, 2 CPUs

An actor per worker loads once and takes units from a queue; a Ray task without a cache would load the
models in every unit. specdec's units are Ray tasks whose worker process keeps the models (Ray reuses
worker processes), so they load once per worker like actors, and a lost worker loses only its unit. The
script measures the load a cache saves per unit. Timing is not CI's business: run it with the machine to
yourself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specdec import alpha
from specdec.sweeps import execute
from specdec.sweeps.on_ray import connect


def timed_unit():
    """A unit runner that also reports its worker, its seconds and whether the worker had the models."""

    def run(unit):
        import os
        import time as _time

        from specdec import alpha as _alpha
        from specdec.sweeps.units import has_loaded

        had = has_loaded(unit)
        t0 = _time.perf_counter()
        records = _alpha.run_unit(unit)
        return records + [{"record": "worker", "pid": os.getpid(), "had_models": had,
                           "seconds": _time.perf_counter() - t0}]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--out", default=None, help="write ray_units.json here")
    parser.add_argument("alpha_args", nargs="*", help="specdec alpha options (after --)")
    args = parser.parse_args()
    sub = argparse.ArgumentParser()
    alpha.add_arguments(sub)
    options = sub.parse_args(args.alpha_args or [
        "--task", "humaneval", "--n-prompts", "6", "--max-new-tokens", "32", "--temperatures", "0",
        "--drafts", "qwen2.5-coder-0.5b", "prompt-lookup", "--threads", "1"])
    units = alpha.plan(options, options.n_prompts)

    connect("local", num_cpus=args.cpus)
    t0 = time.perf_counter()
    parts = execute(units, alpha.run_unit, ray="local", remote=timed_unit(), progress=True)
    ray_wall = time.perf_counter() - t0
    workers = [r for part in parts for r in part if r["record"] == "worker"]

    t0 = time.perf_counter()
    serial_parts = execute(units, alpha.run_unit, progress=True)  # this process: it loads once too
    serial_wall = time.perf_counter() - t0
    strip = [[r for r in part if r["record"] != "worker"] for part in parts]
    first = [w["seconds"] for w in workers if not w["had_models"]]
    later = [w["seconds"] for w in workers if w["had_models"]]
    load = statistics.mean(first) - statistics.mean(later) if first and later else None
    doc = {"units": len(units), "workers": len({w["pid"] for w in workers}), "cpus": args.cpus,
           "threads_per_unit": options.threads, "ray_wall_s": ray_wall, "serial_wall_s": serial_wall,
           "first_unit_s": first, "later_unit_s": later, "load_per_worker_s": load,
           "uncached_tasks_extra_s": None if load is None else load * len(later),
           "records_equal_serial": strip == serial_parts, "per_unit": workers}
    print(f"{len(units)} units on {doc['workers']} Ray workers ({args.cpus} CPUs, {options.threads} thread each): "
          f"{ray_wall:.1f} s; serially in this process: {serial_wall:.1f} s")
    if load is not None:
        print(f"a worker's first unit {statistics.mean(first):.1f} s, its later units {statistics.mean(later):.1f} s: "
              f"loading the models costs {load:.1f} s, which tasks without the cache would pay in every unit "
              f"(+{load * len(later):.0f} s of worker time here)")
    print(f"records equal to the serial run's: {doc['records_equal_serial']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "ray_units.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
