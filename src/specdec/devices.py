"""Devices: where models, caches, drafts and the random generator live, and clocks that respect them.

Every tensor of a generation lives on the target's device. Work on a GPU is asynchronous, so a
timer must synchronize the device before it reads the clock, or it measures kernel launches
instead of kernels: :class:`Stopwatch` does that, and every timing in specdec (statistics, the
adaptive schedule, benchmarks) goes through it.
"""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

import torch

from specdec.errors import SpecDecError


def cache_root() -> pathlib.Path:
    """Where specdec keeps what it makes once per machine (converted models, built kernels): ``$SPECDEC_CACHE`` if
    set, else ``~/.cache/specdec``."""
    env = os.environ.get("SPECDEC_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "specdec"

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"`` (or None): CUDA when available, else CPU; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` as given.

    Raises a :class:`SpecDecError` that names the fix for an unknown name or a device this machine lacks.
    """
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device.strip().lower() if isinstance(device, str) else device)
    except (RuntimeError, TypeError):
        raise SpecDecError(f"unknown device {device!r}; use {DEVICE_CHOICES}") from None
    if dev.type not in ("cpu", "cuda"):
        raise SpecDecError(f"device {device!r} is not supported; use {DEVICE_CHOICES}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecDecError(
                f"device {device!r} was asked for, but this torch build or machine has no CUDA GPU "
                f"(torch {torch.__version__}); use --device cpu, or install a CUDA build of torch (README, 'GPUs')"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SpecDecError(
                f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return dev


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter (CPU for a module without parameters)."""
    for param in module.parameters():
        return param.device
    return torch.device("cpu")


def synchronize(device: torch.device | str | None) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def new_generator(device: torch.device, seed: int) -> torch.Generator:
    """The generation's single random source, on the device where sampling happens."""
    return torch.Generator(device=device).manual_seed(seed)


class Stopwatch:
    """Wall-clock time that includes the device's queued work: synchronizes before every reading.

    >>> clock = Stopwatch(torch.device("cpu")); t0 = clock(); t1 = clock(); t1 >= t0
    True
    """

    def __init__(self, device: torch.device | str | None):
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.device = device

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def describe(device: torch.device) -> dict[str, Any]:
    """A few facts about ``device`` for benchmark tables."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"device": str(device), "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "torch": torch.__version__, "cuda": torch.version.cuda}
    return {"device": "cpu", "torch": torch.__version__}


class RoundClock:
    """Time marks inside a decoding round that do not stall the device.

    On CUDA a mark is an event recorded on the stream and read after the round's one read-back
    (which has waited for it), so timing adds no synchronization; on CPU a mark is the clock.
    ``seconds(a, b)`` is the time from mark a to mark b.
    """

    def __init__(self, device: torch.device | str | None):
        self.cuda = device is not None and torch.device(device).type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()  # already complete after a read-back; waits otherwise
            return start.elapsed_time(end) / 1000.0
        return end - start
