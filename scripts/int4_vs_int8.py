"""The int4 GEMM against the int8 one on the same shape: the int4-mixed 1.5B's MLP down projection (8,960 x 1,536) is
int8 (from Q6_K) in some layers and int4 (Q4_K) in others. Prints the fastest of ``--reps`` alternated calls of each
per number of rows (docs/int4.md, "Against int8 on the same tiles").

    python scripts/int4_vs_int8.py --rows 1,8,16,32,48,64
"""

from __future__ import annotations

import argparse
import time

import specdec  # first: it picks OpenMP's wait policy before torch loads the runtime
import torch  # noqa: E402
from specdec.config import DEFAULT_TARGET  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8,16,32,48,64")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    layers = specdec.load(DEFAULT_TARGET).hf_model.model.layers
    found = {type(layer.mlp.down_proj).__name__: layer.mlp.down_proj for layer in layers}
    if not {"Int8Linear", "Int4Linear"} <= set(found):
        raise SystemExit(f"the default target's down projections are {sorted(found)}: both kinds are needed")
    torch.manual_seed(0)
    print("| rows | int8 ms | int4 ms | int4 / int8 |\n|---|---|---|---|")
    with torch.inference_mode():
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(1, m, found["Int8Linear"].in_features)  # [1, m, 8960]
            best = {"Int8Linear": float("inf"), "Int4Linear": float("inf")}
            for _ in range(args.reps):
                for name in best:
                    t0 = time.perf_counter()
                    found[name](x)
                    best[name] = min(best[name], time.perf_counter() - t0)
            print(f"| {m} | {best['Int8Linear'] * 1000:.2f} | {best['Int4Linear'] * 1000:.2f} | "
                  f"{best['Int4Linear'] / best['Int8Linear']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
