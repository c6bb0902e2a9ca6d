"""The server's overhead per request: tokens/s and time to first token through `specdec serve` (streaming
over HTTP on 127.0.0.1) against specdec.generate in-process (what `specdec generate` runs), same prompts,
same models, same options, greedy.

    python scripts/serve_overhead.py                      # the packaged pair, the CLI defaults
    python scripts/serve_overhead.py --tiny --threads 1   # tiny random models (seconds)
    python scripts/serve_overhead.py -- --draft none      # options after -- go to both sides (serve's options)

Direct: time from the call to the first on_tokens group (TTFT) and to the return (tokens/s = tokens / time).
Server: time from sending the request to the first SSE event carrying tokens, and to `[DONE]`. Reported: the median
over requests of tokens/s and of TTFT (a shared machine's load spikes hit single requests), and totals. Both
run one warm-up request first, then run each prompt on both, alternating which goes first, so that drift in the
machine's load hits both. Prints a table, then one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "def quicksort(arr):",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
    "class Stack:\n    def __init__(self):",
    "def is_palindrome(s: str) -> bool:",
]
TINY_PROMPTS = ["w5 w6 w7", "w10 w11", "w20 w21 w22 w23", "w40"]


def _tiny_models(folder: Path, draft: bool) -> list[str]:
    """Options for tiny random models saved in ``folder`` (the draft: unless the options name one)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny import tiny_model, tiny_tokenizer

    for name, seed in (("target", 0), ("draft", 1)):
        tiny_model(eos=None, seed=seed).save_pretrained(folder / name)
        tiny_tokenizer().save_pretrained(folder / name)
    return ["--target", str(folder / "target"), "--dtype", "fp32"] + (["--draft", str(folder / "draft")] if draft else [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def direct(target, draft, config, prompt: str) -> dict:
    import specdec

    first: list[float] = []
    t0 = time.perf_counter()
    out = specdec.generate(target, prompt, draft=draft, config=config,
                           on_tokens=lambda ids, origin: first or first.append(time.perf_counter()))
    total = time.perf_counter() - t0
    return {"tokens": len(out.token_ids), "ttft_s": first[0] - t0, "total_s": total, "text": out.text}


def served(http, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    ttft, tokens, text = None, 0, []
    t0 = time.perf_counter()
    with http.stream("POST", url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            n = chunk.get("specdec", {}).get("tokens", 0) if chunk["choices"][0]["finish_reason"] is None else 0
            if n and ttft is None:
                ttft = time.perf_counter() - t0
            tokens += n
            text.append(chunk["choices"][0]["text"])
    return {"tokens": tokens, "ttft_s": ttft, "total_s": time.perf_counter() - t0, "text": "".join(text)}


def summarize(rows: list[dict]) -> dict:
    """Per side: totals, and medians over requests (robust to a spike in a shared machine's load)."""
    def side(name: str) -> dict:
        tokens = sum(r[name]["tokens"] for r in rows)
        seconds = sum(r[name]["total_s"] for r in rows)
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                "tokens_per_s_median": statistics.median(r[name]["tokens"] / r[name]["total_s"] for r in rows),
                "ttft_median_s": statistics.median(r[name]["ttft_s"] for r in rows)}

    return {"direct": side("direct"), "server": side("server")}


def table(result: dict) -> str:
    d, s = result["direct"], result["server"]
    lines = [f"{'':27s} {'tokens/s (median)':>17s} {'tokens/s (total)':>16s} {'TTFT (median)':>13s} {'requests':>8s}"]
    for label, x in (("specdec.generate (direct)", d), ("specdec serve (HTTP, SSE)", s)):
        lines.append(f"{label:27s} {x['tokens_per_s_median']:17.2f} {x['tokens_per_s']:16.2f} "
                     f"{x['ttft_median_s'] * 1000:11.1f}ms {result['prompts']:8d}")
    lines.append(f"server / direct: median tokens/s {s['tokens_per_s_median'] / d['tokens_per_s_median']:.3f}x, "
                 f"median TTFT {(s['ttft_median_s'] - d['ttft_median_s']) * 1000:+.1f} ms; "
                 f"same text: {result['same_text']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny random models (tests/tiny.py) instead of the packaged pair")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="times through the prompts (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on both sides (default: torch's)")
    parser.add_argument("--json-out", default=None, help="also write the JSON document here")
    parser.add_argument("--summarize", metavar="JSON", default=None,
                        help="print the table of a document this script wrote (summaries recomputed), measure nothing")
    parser.add_argument("options", nargs="*", help="after --: specdec serve's model options, for both sides")
    args = parser.parse_args()
    if args.summarize:
        result = json.loads(Path(args.summarize).read_text())
        print(table({**result, **summarize(result["rows"])}))
        return 0

    import httpx
    import torch

    from specdec import cli

    tmp = tempfile.TemporaryDirectory()
    options = (_tiny_models(Path(tmp.name), "--draft" not in args.options) if args.tiny else []) + args.options
    prompts = TINY_PROMPTS if args.tiny else PROMPTS
    if args.threads:
        torch.set_num_threads(args.threads)
    serve_args = cli.build_parser().parse_args(["serve", *options])

    # the server, started now so that it loads while this process loads the same models
    port = _free_port()
    env = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    log = open(Path(tmp.name) / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", *options, "--port", str(port),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        import specdec

        target, draft = cli.load_models(serve_args)
        config = specdec.GenerationConfig.from_options(
            gamma=serve_args.gamma, gamma_schedule=serve_args.gamma_schedule,
            max_gamma=serve_args.max_gamma, confidence=serve_args.confidence, max_new_tokens=args.max_tokens)
        deadline = time.monotonic() + 1800
        while True:
            assert proc.poll() is None, "the server exited: " + Path(log.name).read_text()
            assert time.monotonic() < deadline, "the server did not get ready in 30 minutes"
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        rows = []
        with httpx.Client(timeout=3600) as http:
            direct(target, draft, config, prompts[0])  # warm-up, both sides
            served(http, url, serve_args.target, prompts[0], args.max_tokens)
            for i, prompt in enumerate(prompts * args.rounds):
                run_direct = lambda: direct(target, draft, config, prompt)  # noqa: E731
                run_server = lambda: served(http, url, serve_args.target, prompt, args.max_tokens)  # noqa: E731
                if i % 2:  # alternate which side goes first
                    s, d = run_server(), run_direct()
                else:
                    d, s = run_direct(), run_server()
                rows.append({"prompt": prompt, "direct": d, "server": s, "same_text": d["text"] == s["text"]})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        tmp.cleanup()

    result = {
        "models": {"target": serve_args.target, "draft": cli.draft_label(draft), "dtype": serve_args.dtype,
                   "gamma": config.gamma, "gamma_schedule": config.gamma_schedule},
        "max_tokens": args.max_tokens, "prompts": len(rows), "threads": torch.get_num_threads(),
        "cpu": {"machine": platform.machine(), "cores": os.cpu_count(),
                "flags": sorted({f for f in ("amx_tile", "avx512_bf16", "avx2")
                                 if f in Path("/proc/cpuinfo").read_text().split()})},
        "same_text": all(r["same_text"] for r in rows), "rows": rows,
    }
    for r in rows:
        for side in ("direct", "server"):
            r[side].pop("text")
    result.update(summarize(rows))
    print(table(result))
    document = json.dumps(result, indent=2)
    print(document)
    if args.json_out:
        Path(args.json_out).write_text(document + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
