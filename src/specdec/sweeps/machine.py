"""The machine a measurement ran on: processor, versions, threads, and how busy it was."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from typing import Any

import torch


def cpu_model() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def dtype_name(dtype: Any) -> str:
    """A torch dtype as reports name it: ``bfloat16``, ``float32``."""
    return str(dtype).replace("torch.", "")


def machine_info(dtype: str) -> dict[str, Any]:
    import transformers

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # what OpenMP read when torch loaded it
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "dtype": dtype,
    }


def load_average() -> float | None:
    """The 1-minute load average (None where the system has none): well above the thread count means
    other work shared the CPU."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None
