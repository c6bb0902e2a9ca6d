"""Load test of `specdec serve`: concurrent streaming clients (the official openai client, one thread each).

For each server configuration (--max-batch values) it starts `specdec serve` on the packaged models, and for
each number of concurrent clients (1, 4, 8, 16) and each mode (speculative: the server's draft; plain:
"draft": "none") sends the same fixed list of requests (HumanEval prompts, a mix of max_tokens), each
client taking the next request as soon as its last one finished. It reports requests/s, output tokens/s,
p50/p95 time to first token and end-to-end latency, and checks every response's text against that
request's single-request output (the same request sent alone, to a server of --max-batch 1 first).

    python scripts/load_test.py --out docs/results/load_test            # the table of docs/serving.md
    python scripts/load_test.py --batches 1,8 --clients 1,8 --requests 8 --max-tokens 16,32   # quicker

Timing is not CI's business: this is a benchmark command. Run it with the machine to yourself.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from specdec.tasks import load_humaneval


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`specdec serve` in a subprocess, ready once /health says so."""

    def __init__(self, args: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--port", str(self.port),
                                      "--log-level", "warning", "--no-ui", *args], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited: see {log}")
            try:
                doc = httpx.get(self.url + "/health", timeout=2).json()
                if doc.get("status") == "ready":
                    self.health = doc
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit("the server did not become ready in 15 minutes")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def one_request(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, draft: str | None) -> dict:
    """Stream one completion; its text, tokens, time to first token and latency."""
    extra = {"draft": draft} if draft else {}
    t0 = time.perf_counter()
    first, parts, tokens = None, [], 0
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True, extra_body=extra):
        text = chunk.choices[0].text if chunk.choices else ""
        if text and first is None:
            first = time.perf_counter() - t0
        parts.append(text or "")
        stats = (chunk.model_extra or {}).get("specdec") or {}
        if "new_tokens" in stats:
            tokens = stats["new_tokens"]
    return {"text": "".join(parts), "tokens": tokens, "ttft": first if first is not None else time.perf_counter() - t0,
            "latency": time.perf_counter() - t0}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def run_level(server: Server, model: str, requests: list[tuple[str, int]], clients: int, draft: str | None) -> dict:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    queue = list(enumerate(requests))
    lock = threading.Lock()
    results: dict[int, dict] = {}

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i, (prompt, n) = queue.pop(0)
            results[i] = one_request(client, model, prompt, n, draft)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(worker) for _ in range(clients)]:
            f.result()
    wall = time.perf_counter() - t0
    out = [results[i] for i in range(len(requests))]
    return {"clients": clients, "mode": "plain" if draft == "none" else "speculative", "requests": len(out),
            "seconds": wall, "requests_per_s": len(out) / wall,
            "output_tokens_per_s": sum(r["tokens"] for r in out) / wall,
            "ttft_p50_s": percentile([r["ttft"] for r in out], 0.5), "ttft_p95_s": percentile([r["ttft"] for r in out], 0.95),
            "latency_p50_s": percentile([r["latency"] for r in out], 0.5),
            "latency_p95_s": percentile([r["latency"] for r in out], 0.95), "texts": [r["text"] for r in out]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve-args", default="", help="extra `specdec serve` options (the default: the CPU default pair)")
    parser.add_argument("--batches", default="1,8", help="--max-batch values to serve with (comma-separated)")
    parser.add_argument("--clients", default="1,4,8,16", help="concurrent clients (comma-separated)")
    parser.add_argument("--requests", type=int, default=16, help="requests per run (the same list every run)")
    parser.add_argument("--max-tokens", default="16,32,48", help="max_tokens, cycled over the requests")
    parser.add_argument("--modes", default="speculative,plain")
    parser.add_argument("--out", default="load_test", help="folder for load_test.json, load_test.md, server logs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in args.max_tokens.split(",")]
    prompts = [p.text for p in load_humaneval(args.requests)]
    requests = [(prompts[i % len(prompts)], lengths[i % len(lengths)]) for i in range(args.requests)]
    extra = args.serve_args.split()
    modes = args.modes.split(",")
    rows, references = [], {}
    for batch in [int(b) for b in args.batches.split(",")]:
        server = Server([*extra, "--max-batch", str(batch), "--max-queue", "64"], out / f"server_batch{batch}.log")
        try:
            model = server.health["model"]
            if not references:  # each request alone, in turn: its single-request output
                for mode in modes:
                    draft = "none" if mode == "plain" else None
                    alone = run_level(server, model, requests, 1, draft)
                    references[mode] = alone["texts"]
            for clients in [int(c) for c in args.clients.split(",")]:
                for mode in modes:
                    draft = "none" if mode == "plain" else None
                    row = run_level(server, model, requests, clients, draft)
                    row["max_batch"] = batch
                    texts = row.pop("texts")
                    row["identical"] = sum(t == r for t, r in zip(texts, references[mode]))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            server.close()
    doc = {"cpu": cpu_name(), "serve_args": extra, "requests": args.requests, "max_tokens": lengths, "rows": rows,
           "date": time.strftime("%Y-%m-%d")}
    (out / "load_test.json").write_text(json.dumps(doc, indent=1))
    base = {(r["clients"], r["mode"]): r["output_tokens_per_s"] for r in rows if r["max_batch"] == 1}
    lines = ["| max-batch | clients | mode | req/s | output tok/s | vs max-batch 1 | TTFT p50 / p95 s | latency p50 / p95 s "
             "| identical |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["output_tokens_per_s"] / base[(r["clients"], r["mode"])] if (r["clients"], r["mode"]) in base else None
        lines.append(f"| {r['max_batch']} | {r['clients']} | {r['mode']} | {r['requests_per_s']:.2f} | "
                     f"{r['output_tokens_per_s']:.1f} | {'' if ratio is None else f'{ratio:.2f}x'} | "
                     f"{r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f} | {r['latency_p50_s']:.2f} / {r['latency_p95_s']:.2f} "
                     f"| {r['identical']}/{r['requests']} |")
    (out / "load_test.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    kinds = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {f}" in flags]
    return f"{name} ({', '.join(kinds)}), {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
