"""The GEMMs' column groups shared among the threads two ways, alternated pass by pass in one process: an equal
contiguous share each (at::parallel_for's split) against shares a thread takes from once its own is done (the default,
csrc/work_items.h). The same bits either way (tests/test_int4_kernel.py); this measures what it is worth here.

    python scripts/thread_split.py                         # the CPU default target (int4-mixed 1.5B), k = 1..32, a 512-token prefill
    python scripts/thread_split.py --ks 1,4 --pairs 40 --json out.json

For each pass width k the target's cached forward over k tokens runs ``--pairs`` times each way, the order alternating
within each pair (this machine's speed moves within seconds); printed: the medians, the median of the pairs' time
ratios (taking / equal) and the share of pairs the taking split won.
"""

from __future__ import annotations

import argparse
import json

import specdec  # first: it picks OpenMP's wait policy before torch loads the runtime (specdec/__init__.py)
import torch  # noqa: E402
from specdec.bench.timing import alternated  # noqa: E402
from specdec.models.kernels import extension  # noqa: E402

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 40


def pairs(ext, run, n: int) -> dict:
    r = alternated(run, ext.set_dynamic_split, (True, False), n)
    return {"taking_s": r["a_s"], "equal_s": r["b_s"], "median_pair_ratio": r["median_pair_ratio"],
            "taking_won": r["a_won"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--ks", default="1,3,4,5,8,32")
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--prefill", type=int, default=512, help="tokens of the timed prefill (0: none)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    target = specdec.load(args.target)
    ext = extension.loaded()
    ids = target.encode(PROMPT)
    rows = []
    for k in (int(v) for v in args.ks.split(",")):
        session, start = target.start(ids[:200], 200 + k + 1)
        session.prefill(start[:-k])
        tail = start[-k:]

        def one() -> None:
            session.extend(tail, k)
            session.rollback(len(start) - k)

        rows.append({"pass": f"k={k}", **pairs(ext, one, args.pairs if k <= 8 else max(6, args.pairs // 3))})
        session.close()
    if args.prefill:
        def prefill() -> None:
            session, start = target.start(ids[:args.prefill + 1], args.prefill + 8)
            session.prefill(start[:args.prefill])
            session.close()

        rows.append({"pass": f"prefill {args.prefill}", **pairs(ext, prefill, 6)})
    from specdec.models.kernels.cpu import cpu_kind

    threads = torch.get_num_threads()
    print(f"CPU: {cpu_kind()}; {target.preset}, {threads} threads")
    print("| pass | taking (default) | equal shares | median pair ratio | pairs the taking split won |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pass']} | {r['taking_s'] * 1e3:.1f} ms | {r['equal_s'] * 1e3:.1f} ms | {r['median_pair_ratio']:.3f} | "
              f"{r['taking_won']:.0%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_kind(), "target": args.target, "threads": threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
