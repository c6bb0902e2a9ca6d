"""Running a sweep's units: in this process one after the other, or as Ray tasks (:mod:`specdec.sweeps.on_ray`),
each finished unit's records kept once in the store (:class:`~specdec.sweeps.units.RecordStore`), so that a
sweep cut short resumes where it stopped."""

from __future__ import annotations

import json
import os
import sys
from typing import Callable, Sequence

from tqdm import tqdm

from specdec.sweeps.on_ray import run_on_ray
from specdec.sweeps.units import RecordStore, Records, Unit, run_unit


def execute(units: Sequence[Unit], run: Callable[[Unit], Records], *, ray: str | None = None,
            num_cpus: int = 1, records: str | os.PathLike | None = None, progress: bool = True,
            on_unit: Callable[[Unit, Records], None] | None = None,
            remote: Callable[[Unit], Records] | None = None) -> list[Records]:
    """Every unit's records, in the units' order.

    run: runs a unit in this process (models already loaded). ray: None runs the units here one after
    the other; an address (``local`` for a cluster on this machine, ``auto``, ``ray://host:port``) runs
    them as Ray tasks of ``num_cpus`` CPUs each, with ``remote`` (default :func:`run_unit`, which loads
    the models from the options) in the workers. Units already in the ``records`` folder are read, not
    run. on_unit(unit, records) is called as each unit's records arrive (in arrival order).
    """
    store = RecordStore(records)
    results: dict[str, Records] = {}
    todo = []
    for unit in units:
        if store.done(unit):
            results[unit.id] = store.read(unit)
        else:
            todo.append(unit)
    bar = tqdm(total=len(units), initial=len(units) - len(todo), desc=units[0].command if units else "sweep",
               unit="unit", file=sys.stderr, disable=not progress, dynamic_ncols=True)

    def arrived(unit: Unit, got: Records) -> None:
        got = json.loads(json.dumps(got))  # the same plain values whether they come from here, Ray or the store
        store.write(unit, got)
        results[unit.id] = store.read(unit) if store.done(unit) else got
        if on_unit is not None:
            on_unit(unit, results[unit.id])
        bar.update()

    try:
        if ray is None:
            for unit in todo:
                bar.set_postfix_str(unit.id)
                arrived(unit, run(unit))
        else:
            run_on_ray(todo, remote or run_unit, address=ray, num_cpus=num_cpus, arrived=arrived)
    finally:
        bar.close()
    return [results[unit.id] for unit in units]
