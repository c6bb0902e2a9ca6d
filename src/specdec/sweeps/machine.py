"""The machine a measurement ran on: processor, versions, threads, how busy it was, and its memory
bandwidth with the floor that puts under a decoding step.

The weight-bandwidth floor: at batch 1 a step of a transformer reads all its weights and does little
arithmetic per byte, so its time is bounded below by weight bytes / memory bandwidth. The bandwidth is
measured here, as a device-to-device copy (which reads and writes every byte), not taken from a data
sheet. Each model's measured single-token step is shown next to its floor: the ratio says how far the
step is from memory-bound (launch overhead, small kernels, attention).
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
from pathlib import Path
from typing import Any

import torch

from specdec.devices import Stopwatch
from specdec.models import LanguageModel
from specdec.models.kernels.cpu import cpu_kind, cpu_model  # (reports import them from here too)


def gpu_model() -> str | None:
    """The CUDA GPU's name (device 0), or None on a machine without one: a GPU run's speed is the GPU's."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def dtype_name(dtype: Any) -> str:
    """A torch dtype as reports name it: ``bfloat16``, ``float32``."""
    return str(dtype).replace("torch.", "")


def machine_info(dtype: str) -> dict[str, Any]:
    import transformers

    return {
        **where_measured(),  # cpu, cpu kind, gpu (where there is one), code, date
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # what OpenMP read when torch loaded it
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "dtype": dtype,
    }


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """specdec's version and, in a git checkout, its commit ("+changes" when the tree has uncommitted ones)."""
    import subprocess

    from specdec import __version__

    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return __version__
    if commit.returncode != 0:
        return __version__
    return f"{__version__} ({commit.stdout.strip()}{'+changes' if dirty.stdout.strip() else ''})"


def where_measured() -> dict[str, Any]:
    """What a record names about the machine and the code that measured it (records of one sweep may come
    from several: Ray workers, or units of a stored sweep resumed on another day)."""
    from specdec.models.kernels import int8_matmul

    gpu = gpu_model()
    return {"cpu": cpu_model(), "cpu_kind": cpu_kind(), **({"gpu": gpu} if gpu else {}), "code": code_version(),
            "kernels": int8_matmul.code_in_use(),  # the kernel code the process ran (ISA, AMX, int8 kernel, ATen's)
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def machines_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct machines and code versions (cpu, cpu kind, gpu where there was one, code) of ``records``
    (:func:`where_measured`), with how many records each measured and the first and last date; records that
    name none count as not recorded."""
    seen: dict[tuple[Any, Any, Any, Any], dict[str, Any]] = {}
    for record in records:
        where = record.get("machine") or {}
        cpu, kind, gpu, code = key = (where.get("cpu"), where.get("cpu_kind"), where.get("gpu"), where.get("code"))
        entry = seen.setdefault(key, {"cpu": cpu or "not recorded", "cpu_kind": kind, **({"gpu": gpu} if gpu else {}),
                                      "code": code, "records": 0, "first": where.get("date"),
                                      "last": where.get("date")})
        entry["records"] += 1
        if where.get("date"):
            entry["first"] = min(filter(None, (entry["first"], where["date"])))
            entry["last"] = max(filter(None, (entry["last"], where["date"])))
    return list(seen.values())


def load_average() -> float | None:
    """The 1-minute load average (None where the system has none): well above the thread count means
    other work shared the CPU."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


COPY_BYTES = 256 * 2**20  # one copy of 256 MiB: large enough to reach the device's bandwidth
COPY_REPEATS = 5
GB = 1e9  # bytes (tables print weights in GB and bandwidth in GB/s)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second moved by a device-to-device copy (read + write), the best of a few runs."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    clock = Stopwatch(device)
    dst.copy_(src)  # first touch
    best = float("inf")
    for _ in range(COPY_REPEATS):
        t0 = clock()
        dst.copy_(src)
        best = min(best, clock() - t0)
    return 2 * COPY_BYTES / best


def weight_bytes(model: LanguageModel) -> int:
    """Bytes of the model's parameters as they sit in memory (the bytes a step reads)."""
    return sum(p.numel() * p.element_size() for p in model.hf_model.parameters())


def weight_floor(target: LanguageModel, drafts: list[LanguageModel], measured: dict[str, float]) -> dict[str, Any]:
    """Floor per model (weight bytes / measured bandwidth) beside its measured one-token step (``measured``:
    model name -> seconds)."""
    bandwidth = copy_bandwidth(target.device)
    rows = []
    for model in dict.fromkeys([target, *drafts]):
        if model.quantization:  # packed int8 weights are not parameters: no honest byte count here
            continue
        nbytes = weight_bytes(model)
        floor = nbytes / bandwidth
        step = measured.get(model.name)
        rows.append({"model": model.name, "weight_bytes": nbytes, "floor_s": floor, "step_s": step,
                     "step_over_floor": step / floor if step else None})
    return {"bandwidth_bytes_per_s": bandwidth, "how": f"device-to-device copy of {COPY_BYTES >> 20} MiB, "
            f"read + write bytes / best of {COPY_REPEATS}", "models": rows}
