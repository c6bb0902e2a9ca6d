"""``specdec serve``'s batch engine under C clients, in one process: its default (the served draft, measured
speculation) against its own plain batching on the same requests, alternated run by run (A B B A ...), so that both
sides run at the same moments of a machine whose speed drifts 10-30% within minutes (the serving benchmark restarts a
server for every run, ~40 s each, and compares runs minutes apart).

    python scripts/batch_clients.py --clients 2 --workloads completion,chat --pairs 4
    python scripts/batch_clients.py --clients 2,4 --count 8 --pairs 3 --out docs/results/batch_clients

The engine is the server's (`specdec.cli.serve.batch_engine` with serve's defaults: the CPU default target and draft,
--max-batch 8, the 1,024 MB prefix cache, calibrated once); each run starts with an empty prefix cache, as a fresh
server does. C clients each send the next request of the workload (scripts/serve_bench.py's requests and token
limits, greedy) as soon as their last one finished; a run's output tokens/s is its tokens over its wall time, prefills
included. Printed per workload and load: each side's mean, each pair's ratio (default / plain), the mean and the
spread of the ratios; every text must equal plain decoding's. Not what a client sees end to end (no HTTP, no
detokenizing): the server's own engine, timed closer together.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def prompts_of(target, workload: str, n: int) -> list[list[int]]:
    import serve_bench

    jobs = serve_bench.jobs(workload, n)
    if any(job["turns"] for job in jobs):
        raise SystemExit(f"{workload}: a conversation resends its turns through a server; not run here")
    return [serve_bench.job_ids(target.tokenizer, job) for job in jobs]


def run(engine, prompts: list[list[int]], clients: int, max_tokens: int, draft, cache_bytes: int) -> tuple[float, list]:
    """Output tokens/s of ``prompts`` sent by ``clients`` clients, each sending its next as its last finishes."""
    from specdec.batch.prefix import prefix_cache
    from specdec.config import GenerationConfig

    engine.prefix_cache = prefix_cache(engine.target, cache_bytes)  # a fresh server's: empty
    config = GenerationConfig(max_new_tokens=max_tokens)
    queue, rows = list(prompts), []
    start = time.perf_counter()
    for _ in range(min(clients, len(queue))):
        rows.append(engine.add(queue.pop(0), config, draft=draft))
    while engine.busy:
        for finished in engine.step():
            if finished.error is not None:
                raise finished.error
            if queue:
                rows.append(engine.add(queue.pop(0), config, draft=draft))
    seconds = time.perf_counter() - start
    texts = [row.output.token_ids for row in rows]
    return sum(len(t) for t in texts) / seconds, texts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="2")
    parser.add_argument("--workloads", default="completion,chat")
    parser.add_argument("--count", type=int, default=8, help="requests a run (at least the clients)")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import serve_bench

    import specdec
    from specdec.batch.engine import MODEL
    from specdec.cli.parser import SERVED_BATCH_CPU, SERVED_PREFIX_CACHE_MB
    from specdec.cli.serve import batch_engine
    from specdec.config import DEFAULT_TARGET, preset_draft
    from specdec.sweeps.machine import machine_info

    target = specdec.load(DEFAULT_TARGET)
    cache_bytes = int(SERVED_PREFIX_CACHE_MB * 2 ** 20)
    engine = batch_engine(target, preset_draft(target), SERVED_BATCH_CPU, 4096, None, None, None, cache_bytes)
    results, lines = [], []
    for clients in (int(c) for c in args.clients.split(",")):
        for workload in args.workloads.split(","):
            prompts = prompts_of(target, workload, max(args.count, clients))
            max_tokens = serve_bench.MAX_TOKENS[workload]
            rates: dict[str, list[float]] = {"default": [], "plain": []}
            texts: dict[str, list] = {}
            for i in range(args.pairs):
                for side in (("default", "plain") if i % 2 == 0 else ("plain", "default")):
                    rate, texts[side] = run(engine, prompts, clients, max_tokens, MODEL if side == "default" else None,
                                            cache_bytes)
                    rates[side].append(rate)
                    print(f"{workload} {clients} clients, pair {i + 1}: {side} {rate:.2f} tokens/s", flush=True)
                if texts["default"] != texts["plain"]:
                    raise SystemExit(f"{workload}: the default's texts differ from plain decoding's")
            ratios = [a / b for a, b in zip(rates["default"], rates["plain"])]
            row = {"workload": workload, "clients": clients, "requests": len(prompts), "default": rates["default"],
                   "plain": rates["plain"], "pair_ratios": ratios, "mean_ratio": statistics.mean(ratios),
                   "ratio_of_means": statistics.mean(rates["default"]) / statistics.mean(rates["plain"])}
            results.append(row)
            lines.append(f"| {workload} | {clients} | {len(prompts)} | {statistics.mean(rates['default']):.2f} | "
                         f"{statistics.mean(rates['plain']):.2f} | **{row['ratio_of_means']:.2f}x** | "
                         f"{', '.join(f'{r:.2f}' for r in ratios)} | {len(prompts)}/{len(prompts)} |")
    table = [f"# specdec serve's batch engine under concurrent clients, in one process ({target.name}; {args.pairs} "
             "pairs, alternated)", "",
             "| workload | clients | requests a run | default tokens/s | plain tokens/s | default / plain | pairs' "
             "ratios | identical |", "|---|---|---|---|---|---|---|---|", *lines]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "batch_clients.md").write_text("\n".join(table) + "\n")
        (args.out / "batch_clients.json").write_text(json.dumps(
            {"machine": machine_info("int4 target"), "pairs": args.pairs, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
