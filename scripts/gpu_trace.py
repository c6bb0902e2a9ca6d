"""A device-side trace of plain decoding's step and of one speculative round, each replayed as one CUDA graph.

    python scripts/gpu_trace.py --out DIR [--draft qwen2.5-coder-0.5b | prompt-lookup | SPEC] [--gamma 4] [--compile]

Loads the target and the draft on the GPU, prepares the capture plan (:func:`specdec.decoding.prepare_steps`:
the step graphs and the whole rounds), warms up, then runs ``torch.profiler`` with CUDA activity over a short
plain generation and a short speculative one (greedy, a HumanEval prompt). Writes, per generation, the Chrome
trace (``*.trace.json.gz``), PyTorch's table of device time by kernel, and ``trace_summary.json``: per target
call the wall time on the host, the device's busy time (the union of its kernels' intervals) and the gaps.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import time
from pathlib import Path

import torch

import specdec
from specdec.decoding import prepare_steps
from specdec.models.formats.catalog import PRESETS
from specdec.tasks import load_task


def busy_time_us(trace_file: Path) -> tuple[float, float, int]:
    """(union of the device kernels' intervals, first kernel start to last kernel end, kernel count), in us."""
    events = json.loads(Path(trace_file).read_text())["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "ts" in e)
    if not spans:
        return 0.0, 0.0, 0
    busy, (start, end) = 0.0, spans[0]
    first = start
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    return busy, end - first, len(spans)


def traced(label: str, out: Path, fn) -> dict:
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    raw = out / f"{label}.trace.json"
    prof.export_chrome_trace(str(raw))
    busy, span, kernels = busy_time_us(raw)
    with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    try:
        table = prof.key_averages().table(sort_by="device_time_total", row_limit=30)
    except Exception:  # older torch: the CUDA name
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
    (out / f"{label}.kernels.txt").write_text(table)
    stats = result.stats
    calls = stats.target_calls
    return {
        "label": label, "new_tokens": stats.new_tokens, "target_calls": calls, "rounds_graphed": stats.rounds_graphed,
        "rounds_per_step": stats.rounds_per_step, "rounds_chained": stats.rounds_chained, "wall_ms": wall * 1e3, "device_busy_ms": busy / 1e3,
        "device_span_ms": span / 1e3, "kernels": kernels, "wall_ms_per_call": wall * 1e3 / calls,
        "device_busy_ms_per_call": busy / 1e3 / calls, "token_ids": result.token_ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=9, help="new tokens of each traced generation")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = specdec.load(args.target, device="cuda", compile=args.compile)
    # a preset is loaded here once (on the GPU, compiled like the target); any other draft spec (prompt-lookup,
    # an n-gram draft) goes to generate as it is
    draft = specdec.load(args.draft, device="cuda", compile=args.compile) if args.draft in PRESETS else args.draft
    prompt = load_task("humaneval").items[0].prompt
    # the capacity the bench fixes for this prompt and 128 new tokens (the static attention reads all of it)
    prepare_steps(target, [draft], [args.gamma], len(target.encode(prompt)) + 128 + 1)
    for _ in range(2):  # warm: cuBLAS, allocator, the first graph replays
        specdec.generate(target, prompt, draft=None, max_new_tokens=32)
        specdec.generate(target, prompt, draft=draft, gamma=args.gamma, max_new_tokens=32)
    runs = [
        traced("plain", out, lambda: specdec.generate(target, prompt, draft=None, max_new_tokens=args.tokens)),
        traced("speculative", out, lambda: specdec.generate(target, prompt, draft=draft, gamma=args.gamma,
                                                            max_new_tokens=args.tokens * 2)),
    ]
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "target": args.target,
               "draft": args.draft, "gamma": args.gamma, "compile": args.compile, "runs": runs}
    (out / "trace_summary.json").write_text(json.dumps(summary, indent=2))
    for r in runs:
        print(f"{r['label']:12s} {r['new_tokens']} tokens in {r['target_calls']} target calls "
              f"({r['rounds_graphed']} graphed): wall {r['wall_ms_per_call']:.2f} ms a call, device busy "
              f"{r['device_busy_ms_per_call']:.2f} ms a call, {r['kernels']} kernels")


if __name__ == "__main__":
    main()
