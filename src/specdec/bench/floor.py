"""The weight-bandwidth floor: the least time a decoding step can take when every weight is read once.

At batch 1 a step of a transformer reads all its weights and does little arithmetic per byte, so
its time is bounded below by weight bytes / memory bandwidth. The bandwidth is measured here, as a
device-to-device copy (which reads and writes every byte), not taken from a data sheet. Each
model's measured single-token step is printed next to its floor: the ratio says how far the step
is from memory-bound (launch overhead, small kernels, attention).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.bench.formatting import MS_PER_S, fmt
from specdec.bench.timing import StepCosts
from specdec.devices import Stopwatch
from specdec.models import LanguageModel

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


def weight_floor(target: LanguageModel, drafts: list[LanguageModel], costs: StepCosts | None) -> dict[str, Any]:
    """Floor per model (weight bytes / measured bandwidth) beside its measured one-token step."""
    bandwidth = copy_bandwidth(target.device)
    measured: dict[str, float] = {}
    if costs:
        measured[target.name] = costs.target_k1_s
        for entry in costs.drafts.values():
            measured.update(zip(entry.models, entry.k1_s))
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


def floor_markdown(floor: dict[str, Any]) -> str:
    lines = [f"Weight-bandwidth floor (measured copy bandwidth {floor['bandwidth_bytes_per_s'] / GB:.0f} GB/s)", "",
             "| model | weights (GB) | floor (ms) | measured 1-token step (ms) | step / floor |", "|---|---|---|---|---|"]
    for r in floor["models"]:
        step = fmt(None if r["step_s"] is None else r["step_s"] * MS_PER_S, ".2f")
        lines.append(f"| {r['model']} | {r['weight_bytes'] / GB:.2f} | {r['floor_s'] * MS_PER_S:.2f} | {step} | "
                     f"{fmt(r['step_over_floor'], '.2f')} |")
    return "\n".join(lines)
