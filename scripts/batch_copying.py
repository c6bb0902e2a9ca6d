"""Copying first in a batch (specdec/batch/copying.py), in one process: ``specdec serve``'s batch engine (the CPU
default pair, measured speculation, calibrated) over the serving benchmark's requests (scripts/serve_bench.py: editing
and completion), --rows at once, with copying, without it (the batch's model draft only), and plain rows; output
tokens/s over the whole run (prefills included), alternating the sides --rounds times, best kept; every side's
texts must equal plain decoding's.

    python scripts/batch_copying.py --rows 4 --out docs/results/batch_copying
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def run(engine, prompts, max_tokens: int, draft) -> tuple[float, list, dict]:
    from specdec.config import GenerationConfig

    start = time.perf_counter()
    rows = [engine.add(p, GenerationConfig(max_new_tokens=max_tokens), draft=draft) for p in prompts]
    engine.run()
    seconds = time.perf_counter() - start
    outs = [r.output for r in rows]
    return (sum(len(o.token_ids) for o in outs) / seconds, [o.token_ids for o in outs],
            {"target_calls": sum(o.stats.target_calls for o in outs), "accepted": sum(o.stats.accepted for o in outs),
             "drafted": sum(o.stats.drafted for o in outs)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--workloads", default="editing,completion")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import serve_bench

    import specdec
    from specdec.batch import engine as batch_engine_module
    from specdec.batch.engine import MODEL
    from specdec.cli.serve import batch_engine
    from specdec.config import DEFAULT_TARGET, preset_draft
    from specdec.sweeps.machine import machine_info

    target = specdec.load(DEFAULT_TARGET)
    draft = preset_draft(target)  # serve's default draft (the Python API's default)
    engine = batch_engine(target, draft, args.rows, 4096, None, None, None, 0)
    copies = batch_engine_module.propose_copies

    def no_copies(engine, rows, ks, skip):
        return ks, {}

    results, lines = {}, []
    for workload in args.workloads.split(","):
        prompts = [serve_bench.job_ids(target.tokenizer, job) for job in serve_bench.jobs(workload, args.rows)]
        max_tokens = serve_bench.MAX_TOKENS[workload]
        best: dict[str, tuple] = {}
        for _ in range(args.rounds):
            for side, draft_kind, propose in (("copying", MODEL, copies), ("model draft only", MODEL, no_copies),
                                              ("plain", None, copies)):
                batch_engine_module.propose_copies = propose
                rate, texts, counts = run(engine, prompts, max_tokens, draft_kind)
                if side not in best or rate > best[side][0]:
                    best[side] = (rate, texts, counts)
        batch_engine_module.propose_copies = copies
        plain = best["plain"]
        results[workload] = {side: {"tokens_per_s": r, "identical": sum(a == b for a, b in zip(t, plain[1])), **c}
                             for side, (r, t, c) in best.items()}
        for side, (rate, texts, counts) in best.items():
            same = sum(a == b for a, b in zip(texts, plain[1]))
            lines.append(f"| {workload} | {side} | {rate:.2f} | {rate / plain[0]:.2f}x | {counts['target_calls']} | "
                         f"{counts['accepted']}/{counts['drafted']} | {same}/{len(texts)} |")
    table = [f"# Copying first in a batch of {args.rows} rows ({target.name}, serve's batch engine; best of "
             f"{args.rounds})", "",
             "| workload | rows draft with | tokens/s | vs plain | target calls | accepted/drafted "
             "| same text as plain |",
             "|---|---|---|---|---|---|---|", *lines]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"batch_copying_{args.rows}.md").write_text("\n".join(table) + "\n")
        (args.out / f"batch_copying_{args.rows}.json").write_text(json.dumps(
            {"machine": machine_info("int4-mixed target"), "rows": args.rows, "results": results}, indent=1) + "\n")
    return 0 if all(v["identical"] == args.rows for r in results.values() for v in r.values()) else 1


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
