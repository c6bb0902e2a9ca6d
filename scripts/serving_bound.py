"""What batching can give a server on this machine: the load test's arithmetic, from measured costs.

With more clients than rows, a server is never idle, and its time is the sum of its work:

- today's server (``--max-batch 1``) spends on each request its prompt's prefill (target and draft) and
  its n tokens of speculative decoding: T_1(n), measured as one ``specdec.generate`` with the server's
  draft and schedule;
- a batched server of B rows spends on each request the target's prefill P (compute-bound, so batching
  does not share it: the rows wait while a joining request prefills) and 1 / B of the steps that
  decode B rows at once: P + n / R_B, with R_B = B / (the time of one plain step over B rows).

So output tokens/s of the batched server over today's is at most T_1(n) / (P + n / R_B) (the batch may also
draft when that pays, which only raises R_B where it does; at 8 rows on this CPU it does not: the bench's
batch axis). It tends to T_1(n) / (n / R_B) for long outputs and is pulled down by the prefill for short
ones. This script measures P, R_B and T_1(n) on HumanEval prompts (the load test's) and prints the bound
for each output length.

    python scripts/serving_bound.py                          # the CPU default pair (bf16 target, int8 draft)
    python scripts/serving_bound.py --quantize int8 --json out.json

Run it with the machine to yourself (a benchmark command, not a test).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import specdec
from specdec.drafters.spec import parse_spec
from specdec.models.sessions.batch_session import BatchSession
from specdec.sweeps.machine import where_measured
from specdec.tasks import load_humaneval


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quantize", default=None, help="the target's quantization (int8), as `serve --quantize`")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b:int8", help="today's server's draft")
    parser.add_argument("--rows", type=int, default=8, help="B: the batch's rows (clients at least as many)")
    parser.add_argument("--prompts", type=int, default=4, help="HumanEval prompts to measure on")
    parser.add_argument("--max-tokens", default="16,32,64,128,256", help="output lengths n to print the bound for")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.max_tokens.split(",")]

    levels = parse_spec(args.draft)  # the draft spec's own grammar: NAME[:QUANT]
    if len(levels) != 1:
        parser.error(f"--draft: one model, as the batched server drafts with; got the hierarchy {args.draft!r}")

    target = specdec.load(args.target, quantize=args.quantize)
    draft = specdec.load(levels[0].name, quantize=levels[0].quantize)
    prompts = [target.encode(p.text) for p in load_humaneval(max(args.prompts, args.rows))]

    # P: the target's prefill of each prompt alone (what a joining row costs the batch)
    session = BatchSession(target, args.rows, max(len(p) for p in prompts) + max(lengths) + 64)
    session.prefill(0, prompts[0])  # warm-up
    prefill = []
    for ids in prompts[: args.prompts]:
        t0 = time.perf_counter()
        session.prefill(0, ids)
        prefill.append(time.perf_counter() - t0)
    # R_B: plain steps over B rows (one token each) after the prompts
    for slot in range(args.rows):
        session.prefill(slot, prompts[slot])
    steps = []
    for _ in range(6):
        feeds = [torch.tensor(prompts[slot][-1:]) for slot in range(args.rows)]
        t0 = time.perf_counter()
        session.extend(feeds, [1] * args.rows)
        steps.append(time.perf_counter() - t0)
        for slot in range(args.rows):
            session.rollback(slot, len(prompts[slot]))
    step_b = statistics.median(steps[1:])
    rate_b = args.rows / step_b
    p = statistics.median(prefill)

    # T_1(n): today's server, one request at a time (the server's default: its draft, the adaptive schedule)
    specdec.generate(target, prompts[0], draft=draft, max_new_tokens=8)  # warm-up
    one = {}
    for n in lengths:
        walls, tokens = [], []
        for ids in prompts[: args.prompts]:
            t0 = time.perf_counter()
            out = specdec.generate(target, ids, draft=draft, max_new_tokens=n)
            walls.append(time.perf_counter() - t0)
            tokens.append(out.stats.new_tokens)
        one[n] = (statistics.mean(walls), statistics.mean(tokens))

    where = where_measured()
    print(f"target {target.name}, draft {draft.name}, {args.threads} threads, {args.prompts} HumanEval prompts; "
          f"{where['cpu']} ({where['cpu_kind']}), {where['date']}")
    print(f"P (target prefill, median) {p:.3f} s; one plain step over {args.rows} rows {step_b:.3f} s "
          f"(R_{args.rows} = {rate_b:.1f} tokens/s)")
    print(f"\n| n (max tokens) | tokens | today's server: s per request | batched: P + n / R_{args.rows} | bound "
          "(batched / today's tokens/s) |\n|---|---|---|---|---|")
    rows = []
    for n in lengths:
        t1, made = one[n]
        batched = p + made / rate_b
        rows.append({"max_tokens": n, "tokens": made, "today_s": t1, "batched_s": batched, "bound": t1 / batched})
        print(f"| {n} | {made:.1f} | {t1:.2f} | {batched:.2f} | {t1 / batched:.2f}x |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": vars(args), "target": target.name, "draft": draft.name, "machine": where,
                       "prefill_s": prefill, "step_b_s": steps, "rate_b": rate_b, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
