"""How far is an int8 copy of a model from the original, and how fast is it? Per-channel vs per-tensor.

    python scripts/quantization_distance.py                      # Qwen2.5-Coder 1.5B, 20 HumanEval problems
    python scripts/quantization_distance.py --model qwen2.5-coder-0.5b --json out.json

Closeness is measured teacher-forced on fixed text (each HumanEval prompt followed by its canonical
solution), one forward pass per model and problem, over the solution's positions:

- top-1 agreement: the share of positions where both models' argmax agree (greedy alpha per position);
- alpha at t = 1: the mean of sum_x min(p(x), q(x)) (Theorem 5's beta with p = original, q = int8 copy);
- KL(p || q) in nats.

Speed: one decoding step of 1 token and of 5 tokens (the verification of gamma = 4) on top of a
256-token cache, median of repeated runs, the models interleaved so that they share the machine's state.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from datetime import datetime, timezone

import torch

import specdec
from specdec.analysis import logit_distance
from specdec.tasks import humaneval_path
from specdec.models.quantized.quantize import METHODS


def closeness(p_model, q_model, texts: list[tuple[str, str]]) -> dict:
    agree = positions = 0
    betas: list[float] = []
    kls: list[float] = []
    for prompt, solution in texts:
        n_prompt = len(p_model.encode(prompt))
        ids = p_model.encode(prompt + solution)
        with torch.inference_mode():
            lp = p_model.start(ids)[0].logits_of(ids, len(ids)).float()[n_prompt - 1: -1]  # [solution, V]
            lq = q_model.start(ids)[0].logits_of(ids, len(ids)).float()[n_prompt - 1: -1]
        d = logit_distance(lp, lq)
        agree += int(d.agree.sum())
        positions += lp.shape[0]
        betas.extend(d.beta.tolist())
        kls.extend(d.kl.tolist())
    return {"top1_agreement": agree / positions, "alpha_t1": statistics.fmean(betas), "kl": statistics.fmean(kls),
            "positions": positions}


def step_times(models: dict, context: int, repeats: int) -> dict:
    ids = list(range(1000, 1000 + context))
    times: dict[str, dict[int, list[float]]] = {name: {1: [], 5: []} for name in models}
    sessions = {}
    with torch.inference_mode():
        for name, model in models.items():
            session = model.start(ids)[0]
            session.logits_of(ids, 1)  # prefill
            sessions[name] = session
        for _ in range(repeats):
            for name, session in sessions.items():
                for width in (1, 5):
                    t0 = time.perf_counter()
                    session.logits_of(ids + list(range(2000, 2000 + width)), width)  # rolls back, then `width` tokens
                    times[name][width].append(time.perf_counter() - t0)
    return {name: {f"{w}_token_ms": 1000 * statistics.median(v) for w, v in by_width.items()}
            for name, by_width in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", default="bf16", help="the original's dtype (the int8 copies compute in fp32)")
    parser.add_argument("--n-problems", type=int, default=20)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args()

    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()][: args.n_problems]
    texts = [(p["prompt"], p["canonical_solution"]) for p in problems]
    original = specdec.load(args.model, dtype=args.dtype)
    copies = {method: specdec.load(args.model, dtype=args.dtype, quantize=method) for method in METHODS}
    rows = {method: {"granularity": METHODS[method], **closeness(original, model, texts)} for method, model in copies.items()}
    speed = step_times({args.dtype: original, **copies}, args.context, args.repeats)
    for method in rows:
        rows[method].update(speed[method])
    result = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "settings": vars(args),
              "original": {"dtype": args.dtype, **speed[args.dtype]}, "int8": rows}
    print(f"{args.model}: int8 copies vs the {args.dtype} original, {len(texts)} HumanEval canonical solutions "
          f"({next(iter(rows.values()))['positions']} positions), steps on a {args.context}-token cache")
    print("| weights | top-1 agreement | alpha at t=1 | KL(p||q) | 1-token step ms | 5-token step ms |\n|---|---|---|---|---|---|")
    o = speed[args.dtype]
    print(f"| {args.dtype} original | 1 | 1 | 0 | {o['1_token_ms']:.0f} | {o['5_token_ms']:.0f} |")
    for method, r in rows.items():
        print(f"| {method} ({r['granularity']}) | {r['top1_agreement']:.3f} | {r['alpha_t1']:.3f} | {r['kl']:.4f} | "
              f"{r['1_token_ms']:.0f} | {r['5_token_ms']:.0f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
