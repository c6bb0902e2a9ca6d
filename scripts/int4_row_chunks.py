"""The AVX2 int4 code's row chunks two ways, alternated pass by pass in one process: up to 8 rows in one call of the
group kernel, wider passes in calls of 6 (the default, csrc/gemm_avx2.cpp) against 5 rows a call with 4 rows in two
passes over each weight line (before). The same bits either way (tests/test_int4_kernel.py); this measures what the
chunks are worth on this CPU. It needs a CPU whose kernels run their AVX2 code.

    python scripts/int4_row_chunks.py                       # the int4 GEMM on the 1.5B's layer shapes, then the CPU default target
    python scripts/int4_row_chunks.py --ks 4,6 --pairs 60 --json out.json

Printed per pass width k: the medians each way and the median of the pairs' time ratios (chunks of 6 / of 5). The
GEMM rows run the four projections of a decoder layer of the 1.5B (q/k/v, o, gate/up, down) over 8 copies of their
weights, so each call reads its weights from memory as a model's pass does; the model rows are cached passes over k
tokens after ``--context`` positions.
"""

from __future__ import annotations

import argparse
import json

import specdec  # first: it picks OpenMP's wait policy before torch loads the runtime (specdec/__init__.py)
import torch  # noqa: E402
from specdec.bench.timing import alternated  # noqa: E402
from specdec.config import DEFAULT_TARGET  # noqa: E402
from specdec.models.kernels import cpu, extension  # noqa: E402
from specdec.models.quantized.int4 import Int4Weight  # noqa: E402

#: The 1.5B's projections (out, in): q/k/v fused, o, gate/up fused, down.
SHAPES = ((2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960))


def pairs(run, n: int) -> dict:
    """``run()`` ``n`` times each way, chunks of 6 and of 5, the order alternating within each pair."""
    r = alternated(run, extension.loaded().set_row_chunks4_avx2, (True, False), n)
    return {"six_ms": 1000 * r["a_s"], "five_ms": 1000 * r["b_s"], "median_pair_ratio": r["median_pair_ratio"]}


def gemm_rows(ks: list[int], n: int) -> list[dict]:
    torch.manual_seed(0)
    layers = [[Int4Weight.quantize(torch.randn(o, i) * 0.02) for o, i in SHAPES] for _ in range(8)]
    rows = []
    for k in ks:
        xs = {i: torch.randn(k, i) for _, i in SHAPES}

        def run():
            for weights in layers:
                for w in weights:
                    w.rows(xs[w.in_features])

        rows.append({"what": "int4 GEMM, 8 layers of the 1.5B", "k": k, **pairs(run, n)})
        print_row(rows[-1])
    return rows


def model_rows(ks: list[int], n: int, context: int) -> list[dict]:
    model = specdec.load(DEFAULT_TARGET)
    rows = []
    for k in ks:
        ids = list(range(1000, 1000 + context + k))
        session, start = model.start(ids, len(ids) + 1)
        session.prefill(start[:-k])

        def run():
            session.extend(start[-k:], k)
            session.rollback(len(start) - k)

        rows.append({"what": f"{model.name}, cached pass", "k": k, **pairs(run, n)})
        session.close()
        print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    print(f"{r['what']:<45} k={r['k']:>3}: chunks of 6 {r['six_ms']:8.2f} ms, of 5 {r['five_ms']:8.2f} ms, "
          f"pair ratio {r['median_pair_ratio']:.3f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="1,3,4,5,6,7,8,12,16,32,48")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--skip-model", action="store_true", help="only the GEMM rows")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if extension.kernel_isa() != "avx2":
        raise SystemExit(f"this CPU's kernels run their {extension.kernel_isa()} code, not AVX2: nothing to compare "
                         "(ATEN_CPU_CAPABILITY=avx2 runs the AVX2 code on an AVX-512 CPU)")
    ks = [int(v) for v in args.ks.split(",")]
    rows = gemm_rows(ks, args.pairs)
    if not args.skip_model:
        rows += model_rows(ks, args.pairs, args.context)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu.cpu_model(), "kind": cpu.cpu_kind(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
