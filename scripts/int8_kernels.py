"""The int8 kernels under Int8Linear, layer by layer: microseconds per call for 1..16 activation rows.

    python scripts/int8_kernels.py                        # the 1.5B's layer shapes, 2 threads
    python scripts/int8_kernels.py --json docs/results/int8_kernels/amx.json
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI python scripts/int8_kernels.py   # oneDNN as on a CPU without AMX
    python scripts/int8_kernels.py --int4 --avx2-too      # also the int4 GEMM; both beside their AVX2 code

Each kernel runs as Int8Linear runs it (specdec.models.kernels.int8_matmul): specdec's ``specdec`` extension (rows
quantized inside it), fbgemm's ``linear_dynamic`` on rows with the pinned columns, oneDNN's
``qlinear_pointwise`` on rows quantized by specdec, each including the row scaling. The weights of ``--layers`` distinct layers of one shape are cycled, so each call streams its
weight from memory as a decoding pass does (one layer's weight stays in cache and flatters every kernel).
bf16 ``F.linear`` (oneDNN, AMX where present) on the same shapes is the float reference. The kernels
alternate call by call; the median of ``--reps`` rounds is printed. ``--int4`` adds the extension's int4 GEMM
(:class:`specdec.models.quantized.int4.Int4Linear`, a weight quantized into the Q4_K form); ``--avx2-too``, on a CPU with
AVX-512 VNNI, also times the ``specdec`` and ``int4`` rows on the extension's AVX2 code (``.../avx2``: the same bits,
the code an AVX2-only CPU runs; the process's choice is restored after each call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import specdec  # noqa: F401  (OpenMP's wait policy before torch loads it)
import torch

from specdec.models.kernels import int8_matmul

from specdec.models.kernels import extension
from specdec.models.quantized.quantize import Int8Linear
from specdec.sweeps.machine import cpu_kind

# (in, out) of the Qwen2.5-Coder 1.5B's int8 layers as Int8Linear runs them (q/k/v and gate/up fused)
SHAPES = {"qkv": (1536, 2048), "o": (1536, 1536), "gate_up": (1536, 17920), "down": (8960, 1536)}


def layers(kernel: str, shape: tuple[int, int], count: int) -> list[Int8Linear]:
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(shape[1], shape[0], generator=g) * 0.02 for _ in range(count)]
    if kernel == "int4":
        from specdec.models.quantized.int4 import Int4Linear, Int4Weight

        return [Int4Linear(Int4Weight.quantize(w)) for w in weights]
    int8_matmul._chosen = kernel  # (measurement only: a process normally keeps one kernel)
    return [Int8Linear.from_float(w) for w in weights]


def on_avx2(f):
    """``f`` run on the extension's AVX2 code (the process's choice restored after)."""

    def run():
        with extension.avx2_code():
            return f()

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,4,5,8,16")
    parser.add_argument("--layers", type=int, default=8, help="distinct layers per shape, cycled")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--kernels", default=None,
                        help="comma list of the int8 kernels to time (default: every one available here, but "
                             "onednn only where the CPU has AMX: without it oneDNN may run its reference matmul)")
    parser.add_argument("--int4", action="store_true", help="also the extension's int4 GEMM")
    parser.add_argument("--avx2-too", action="store_true",
                        help="also the vnni / int4 rows on the extension's AVX2 code (a CPU with AVX-512 VNNI)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    rows = [int(r) for r in args.rows.split(",")]
    kernels = int8_matmul.available()
    if args.kernels:
        unknown = sorted(set(args.kernels.split(",")) - set(kernels))
        if unknown:
            parser.error(f"--kernels: {', '.join(unknown)} not available here (available: {', '.join(kernels)})")
        kernels = [k for k in kernels if k in args.kernels.split(",")]
    elif "onednn" in kernels and not cpu_kind().startswith("AMX"):
        kernels.remove("onednn")
        print("(onednn left out: no AMX here, where oneDNN's int8 matmul may be its reference code, 100-1,000x "
              "slower; --kernels onednn,... times it)")
    if args.int4 and "specdec" in kernels:
        kernels.insert(kernels.index("specdec") + 1, "int4")
    avx2 = [k for k in kernels if k in ("specdec", "int4")] if args.avx2_too and extension.kernel_isa() == "avx512" else []
    if args.avx2_too and not avx2:
        print("--avx2-too: needs a CPU with AVX-512 VNNI (elsewhere the extension runs its AVX2 code already)")
    result = {"cpu_kind": cpu_kind(), "threads": args.threads, "kernels": kernels + [f"{k}/avx2" for k in avx2],
              "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"), "us_per_call": {}}
    print(f"CPU kind {result['cpu_kind']}, {args.threads} threads, ONEDNN_MAX_CPU_ISA="
          f"{result['onednn_max_cpu_isa'] or '(unset)'}; us per call, weights from memory")
    print("| layer | kernel | " + " | ".join(f"M={m}" for m in rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    totals: dict[str, list[float]] = {}
    for name, shape in SHAPES.items():
        made = {k: layers(k, shape, args.layers) for k in kernels}
        g = torch.Generator().manual_seed(1)
        weights_bf16 = [torch.randn(shape[1], shape[0], generator=g).bfloat16() * 0.02 for _ in range(args.layers)]
        calls = {}
        for m in rows:
            x = torch.randn(m, shape[0], generator=g)
            for k in kernels:
                calls[(k, m)] = (lambda ls, x: lambda: [layer(x) for layer in ls])(made[k], x)
            for k in avx2:
                calls[(f"{k}/avx2", m)] = on_avx2(calls[(k, m)])
            xb = x.bfloat16()
            calls[("bf16", m)] = (lambda xb: lambda: [torch.nn.functional.linear(xb, w) for w in weights_bf16])(xb)
        times = {key: [] for key in calls}
        for f in calls.values():
            f()  # warm-up (oneDNN builds a primitive per shape)
        for _ in range(args.reps):
            for key, f in calls.items():
                t = time.perf_counter()
                f()
                times[key].append((time.perf_counter() - t) / args.layers * 1e6)
        for k in kernels + [f"{k}/avx2" for k in avx2] + ["bf16"]:
            med = [statistics.median(times[(k, m)]) for m in rows]
            result["us_per_call"].setdefault(name, {})[k] = dict(zip(map(str, rows), med))
            totals.setdefault(k, [0.0] * len(rows))
            totals[k] = [a + b for a, b in zip(totals[k], med)]
            print(f"| {name} {shape[0]}x{shape[1]} | {k} | " + " | ".join(f"{v:.0f}" for v in med) + " |", flush=True)
    print("\nOne decoder layer of the 1.5B (the four calls), us, and its cost at M rows over M = 1:")
    for k, tot in totals.items():
        print(f"  {k:7s} " + "  ".join(f"M={m}: {v:.0f} ({v / tot[0]:.2f}x)" for m, v in zip(rows, tot)))
    result["layer_total_us"] = {k: dict(zip(map(str, rows), tot)) for k, tot in totals.items()}
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
