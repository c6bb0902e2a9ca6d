"""The decoder step's norms two ways, alternated pass by pass in one process: in one pass a row (csrc/rms_norm.h, the
default where its bits equal ATen's) against ATen's ops (pow, mean, add, rsqrt, mul, mul and the residual adds). The
same bits either way (tests/test_decoder_step.py); this measures what the fused form is worth on this CPU.

    python scripts/decoder_norms.py                          # the default draft (the int4 0.5B, its cut head) and the CPU default target
    python scripts/decoder_norms.py --ks 1,3 --pairs 60 --json out.json

For each model and pass width k, a cached pass over k tokens after ``--context`` positions runs ``--pairs`` times each
way, the order alternating within each pair; printed: the medians and the median of the pairs' time ratios
(fused / ATen).
"""

from __future__ import annotations

import argparse
import json

import specdec  # first: it picks OpenMP's wait policy before torch loads the runtime (specdec/__init__.py)
from specdec.bench.timing import alternated  # noqa: E402
from specdec.config import DEFAULT_TARGET, default_draft  # noqa: E402
from specdec.drafters import plan_draft  # noqa: E402
from specdec.models.kernels import cpu  # noqa: E402
from specdec.models.native import decoder_step  # noqa: E402


def draft_model():
    """The default draft's model (the top level of its plan), loaded as the CLI loads it."""
    plan = plan_draft(default_draft()).load(None)
    return next(level.name for level in plan.levels if hasattr(level.name, "hf_model"))


def pairs(model, k: int, context: int, n: int) -> dict:
    runner = decoder_step.decoder_step(model.hf_model)
    lanes = runner.norm_lanes()
    if not lanes:
        raise SystemExit(f"{model.name}: the fused norm does not reproduce ATen's bits here (norm_lanes 0): nothing to compare")
    ids = list(range(1000, 1000 + context + k))
    session, start = model.start(ids, len(ids) + 1)
    session.prefill(start[:-k])

    def one() -> None:  # (the rollback is position bookkeeping: timed with the pass)
        session.extend(start[-k:], k)
        session.rollback(len(start) - k)

    r = alternated(one, runner.set_norm_lanes, (lanes, 0), n)
    session.close()
    return {"model": model.name, "k": k, "lanes": lanes, "fused_ms": 1000 * r["a_s"], "aten_ms": 1000 * r["b_s"],
            "median_pair_ratio": r["median_pair_ratio"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="1,3")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for model in (draft_model(), specdec.load(DEFAULT_TARGET)):
        for k in (int(v) for v in args.ks.split(",")):
            rows.append(pairs(model, k, args.context, args.pairs))
            r = rows[-1]
            print(f"{r['model']:<40} k={k}: fused {r['fused_ms']:.2f} ms, ATen's ops {r['aten_ms']:.2f} ms, "
                  f"pair ratio {r['median_pair_ratio']:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu.cpu_model(), "kind": cpu.cpu_kind(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
