"""Units of work: a sweep is a list of independent units, each one configuration x one shard of prompts.

A unit carries everything it needs to run on its own (the command's options as plain values, its
temperature, the indices of its prompts) and returns plain records (JSON-able dicts). Its id is stable:
the command, a hash of the options and its shard, so a rerun, a retry or another machine running the
same unit writes the same records under the same id. The aggregation reads records only, wherever
they came from (:func:`specdec.sweeps.execution.execute`: in-process, or on Ray with
:mod:`specdec.sweeps.on_ray`).

The store (``--records DIR``) keeps each finished unit's records as ``DIR/<unit id>.jsonl``, written
once (to a temporary file, then renamed): a unit that finished is never run again, so a sweep cut
short resumes where it stopped and a retried unit cannot leave its records twice.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from specdec.errors import SpecDecError

#: The command of a unit -> "module:function" that runs one unit of it from its options (in any process).
UNIT_RUNNERS = {
    "alpha": "specdec.alpha:run_unit",
    "bench": "specdec.bench.runner:run_unit",
}

Records = list[dict[str, Any]]


@dataclass(frozen=True)
class Unit:
    """One independent piece of a sweep.

    command: ``alpha`` or ``bench``; kind: what the unit measures (``prompts``, or ``costs`` for the
    bench's step costs); options: the command's options (``vars(args)``, plain values); temperature:
    the one temperature of the unit (None for costs); prompts: indices into the task's prompts.
    """

    command: str
    kind: str
    options: dict[str, Any]
    temperature: float | None = None
    prompts: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        shard = f"p{self.prompts[0]}-{self.prompts[-1]}" if self.prompts else "all"
        t = "" if self.temperature is None else f"-t{self.temperature:g}"
        return f"{self.command}-{options_hash(self.options)}-{self.kind}{t}-{shard}"


def options_hash(options: dict[str, Any]) -> str:
    """8 hex digits of the options that decide a unit's records (not where the sweep runs or writes)."""
    kept = {k: v for k, v in options.items() if k not in EXECUTION_OPTIONS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:8]


#: Options that say how and where a sweep runs, not what it measures: not part of a unit's id.
EXECUTION_OPTIONS = frozenset({"ray", "records", "out", "json", "shard_size", "command", "func"})


def plain_options(args: Any) -> dict[str, Any]:
    """A namespace's options as JSON-able values, checked (a unit travels to other processes)."""
    options = {k: v for k, v in vars(args).items() if not callable(v)}
    try:
        json.dumps(options)
    except TypeError as e:
        raise SpecDecError(f"a sweep's options must be plain values to travel to its units: {e}") from None
    return options


def shards(n: int, size: int | None) -> list[tuple[int, ...]]:
    """Prompt indices 0..n-1 in consecutive shards of ``size`` (None: one shard of all)."""
    if size is not None and size < 1:
        raise SpecDecError(f"--shard-size must be >= 1, got {size}")
    size = n if size is None else size
    return [tuple(range(i, min(i + size, n))) for i in range(0, n, max(1, size))]


def resolve(command: str) -> Callable[..., Records]:
    """The function that runs one unit of ``command`` (imported where the unit runs)."""
    module, name = UNIT_RUNNERS[command].split(":")
    return getattr(importlib.import_module(module), name)


_LOADED: dict[tuple[str, str], Any] = {}  # per process: (command, options hash) -> what its units share


def loaded_for(unit: Unit, load: Callable[[argparse.Namespace], Any]) -> Any:
    """What ``load`` builds from the unit's options (the task, the models, the drafts), once per process and
    sweep: a Ray worker that runs several units of one sweep loads its models for the first one only. One
    sweep's models are kept at a time."""
    key = (unit.command, options_hash(unit.options))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load(argparse.Namespace(**unit.options))
    return _LOADED[key]


def has_loaded(unit: Unit) -> bool:
    """Whether this process already holds what ``unit``'s sweep loads (:func:`loaded_for`)."""
    return (unit.command, options_hash(unit.options)) in _LOADED


def run_unit(unit: Unit) -> Records:
    """Run one unit from its options alone (what a remote worker calls): its models load once per process."""
    return resolve(unit.command)(unit)


class RecordStore:
    """Each finished unit's records under its id in a folder, written once; no folder: kept in memory."""

    def __init__(self, folder: str | os.PathLike | None):
        self.folder = Path(folder).expanduser() if folder else None

    def _path(self, unit: Unit) -> Path:
        assert self.folder is not None
        return self.folder / f"{unit.id}.jsonl"

    def done(self, unit: Unit) -> bool:
        return self.folder is not None and self._path(unit).exists()

    def read(self, unit: Unit) -> Records:
        with open(self._path(unit), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def write(self, unit: Unit, records: Records) -> None:
        if self.folder is None or self.done(unit):  # written once: a retried unit's second answer is dropped
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(unit)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        os.replace(tmp, path)


def flatten(parts: Iterable[Records]) -> Records:
    return [r for part in parts for r in part]
