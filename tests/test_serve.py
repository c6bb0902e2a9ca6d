"""specdec serve, end to end: a real server process on 127.0.0.1 with tiny models saved to local folders,
driven by the official openai client and by raw HTTP. Every wait is bounded in time."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

import specdec
from specdec.analysis import walltime_improvement
from serving import CONTEXT, tiny_server, wait_until

PROMPTS = ["w5 w6 w7", "w10 w11", "w20 w21 w22 w23", "w40"]
MAX_QUEUE = 15  # 16 concurrent clients fit: one running, 15 waiting
LONG = 3000  # tokens of a request meant to be cancelled (5 to 15 ms each here: it would run for 15 s or more)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-at-a-time", "batched"])
def server(request, tmp_path_factory):
    """Today's worker (--max-batch 1) and the batched one (rows join between rounds: --max-batch 2, so that
    two long requests fill the batch)."""
    with tiny_server(tmp_path_factory.mktemp("serve"), "--max-queue", str(MAX_QUEUE), "--max-batch",
                     str(request.param)) as served:
        served.target = specdec.load(served.model, dtype="fp32")
        served.max_batch = request.param
        yield served


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(server):
    """specdec.generate's output on the same model: plain decoding, greedy unless options say otherwise."""
    @functools.lru_cache(maxsize=None)
    def generate(prompt: str, n: int, **options):
        return specdec.generate(server.target, prompt, max_new_tokens=n, **options)

    return lambda prompt, n, **options: generate(prompt, n, **{k: tuple(v) if isinstance(v, list) else v
                                                                 for k, v in options.items()})


def health(server) -> dict:
    return httpx.get(server.url + "/health", timeout=5).json()


def post(server, path: str, body, timeout: float = 60) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(server.url + path, content=body, timeout=timeout)
    return httpx.post(server.url + path, json=body, timeout=timeout)


def test_health_and_models(server, client):
    doc = health(server)
    assert doc["status"] == "ready" and doc["model"] == server.model and doc["max_queue"] == MAX_QUEUE
    assert doc["draft"] != "none"  # the model draft of --draft
    assert doc.get("max_batch", 1) == server.max_batch and doc["running"] == 0  # the batch and the queue
    assert [m.id for m in client.models.list().data] == [server.model]


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_completions_equal_generate(server, client, reference, prompt):
    ref = reference(prompt, 12)
    out = client.completions.create(model=server.model, prompt=prompt, max_tokens=12, temperature=0, n=1)
    assert out.choices[0].text == ref.text and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ref.prompt_ids), 12)
    stats = out.model_extra["specdec"]
    # the policy for one model draft: 4 a round, constant, in the batch engine and one at a time alike
    assert stats["exact"] and stats["new_tokens"] == 12 and stats["gamma_schedule"] == "constant"
    assert stats["gamma"] == 4
    assert 1 <= stats["target_calls"] <= 12 and 0 <= stats["accepted"] <= stats["drafted"]
    # the statistics' own conventions: tokens per target call counts the bonus token; alpha is a mean of
    # sum_x min(p, q) over verified positions, so it lies in [0, 1] whenever anything was drafted
    assert stats["mean_accepted_length"] == pytest.approx(12 / stats["target_calls"])
    assert stats["drafted"] == 0 or 0.0 <= stats["alpha"] <= 1.0

    # gamma 4, constant: every round drafts (the adaptive schedule may stop drafting for a draft that costs
    # what the tiny target costs, and the batched server keeps what it measured across requests)
    chunks = list(client.completions.create(model=server.model, prompt=prompt, max_tokens=12, temperature=0,
                                            stream=True, extra_body={"gamma": 4}))
    assert "".join(c.choices[0].text for c in chunks) == ref.text
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    groups = [c.model_extra["specdec"] for c in chunks[:-1]]  # one event per accepted group of tokens
    final = chunks[-1].model_extra["specdec"]
    assert sum(g["tokens"] for g in groups) == 12 and sum(g["from_draft"] for g in groups) == final["accepted"]
    # the playground's fields: each group's text split by origin, and the rejected drafts of its target call
    assert [g["draft_text"] + g["target_text"] for g in groups] == [c.choices[0].text for c in chunks[:-1]]
    assert sum(g["drafted"] for g in groups) == final["drafted"] and len(groups) == final["target_calls"]
    # rejected text only where the target rejected a draft (a rejected special token has no text)
    assert all(g["rejected_text"] == "" for g in groups if g["from_draft"] == g["drafted"])
    assert any(g["rejected_text"] for g in groups)  # the tiny draft disagrees with the tiny target often
    theory = final["theory"]  # Theorem 8 on the measured alpha and c
    assert theory["alpha"] == final["alpha"] and theory["c"] > 0
    assert theory["expected_speedup"] == pytest.approx(
        walltime_improvement(final["alpha"], theory["gamma"], theory["c"]))


def test_a_schedule_from_the_request(server, client):
    out = client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=12,
                                    extra_body={"gamma_schedule": "heuristic", "gamma": 2})
    stats = out.model_extra["specdec"]
    assert (stats["gamma_schedule"], stats["gamma"]) == ("heuristic", 2)
    plain = client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=12, extra_body={"draft": "none"})
    assert plain.model_extra["specdec"]["theory"] is None  # nothing drafted
    assert out.choices[0].text == plain.choices[0].text


@pytest.mark.parametrize("content", ["w5 w6 w7", "w30 w31"])
def test_chat_equals_generate(server, client, reference, content):
    ref = reference(content, 10, chat=True)
    messages = [{"role": "user", "content": content}]
    out = client.chat.completions.create(model=server.model, messages=messages, max_tokens=10, temperature=0)
    assert out.choices[0].message.content == ref.text and out.choices[0].message.role == "assistant"
    assert out.usage.prompt_tokens == len(ref.prompt_ids) and out.usage.completion_tokens == 10

    chunks = list(client.chat.completions.create(model=server.model, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_stop_strings_never_stream_past_the_stop(server, client, reference):
    words = reference(PROMPTS[2], 12).text.split()
    # a stop string that ends the text, and one whose beginning appears (held back, then released)
    for stop, finish in ((" " + words[4], "stop"), (words[4] + " w999", "length")):
        ref = reference(PROMPTS[2], 12, stop=[stop])
        chunks = list(client.completions.create(model=server.model, prompt=PROMPTS[2], max_tokens=12,
                                                temperature=0, stop=[stop], stream=True))
        texts = [c.choices[0].text for c in chunks]
        assert "".join(texts) == ref.text and chunks[-1].choices[0].finish_reason == finish
        assert all(stop not in "".join(texts[: i + 1]) for i in range(len(texts)))
        out = client.completions.create(model=server.model, prompt=PROMPTS[2], max_tokens=12, stop=stop)
        assert out.choices[0].text == ref.text and out.choices[0].finish_reason == finish


def test_per_request_draft_gamma_and_sampling(server, client, reference):
    ref = reference(PROMPTS[0], 10)
    plain = client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=10, extra_body={"draft": "none"})
    stats = plain.model_extra["specdec"]
    assert plain.choices[0].text == ref.text
    assert stats["draft"] == "none" and stats["drafted"] == 0 and stats["target_calls"] == 10
    chunks = list(client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=10, stream=True,
                                            extra_body={"draft": "none"}))
    assert [c.model_extra["specdec"]["tokens"] for c in chunks[:-1]] == [1] * 10  # plain decoding: one per group

    fixed = client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=10, extra_body={"gamma": 2})
    stats = fixed.model_extra["specdec"]
    assert fixed.choices[0].text == ref.text and (stats["gamma"], stats["gamma_schedule"]) == (2, "constant")
    lookup = client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=10,
                                       extra_body={"draft": "prompt-lookup"})
    assert lookup.choices[0].text == ref.text and lookup.model_extra["specdec"]["draft"] == "prompt-lookup"

    # temperature, top_p, top_k and seed reach the generation: seeded sampling repeats specdec.generate's
    sampled = reference(PROMPTS[1], 10, temperature=0.9, top_p=0.9, top_k=20, seed=7)
    for _ in range(2):
        out = client.completions.create(model=server.model, prompt=PROMPTS[1], max_tokens=10, temperature=0.9,
                                        top_p=0.9, seed=7, extra_body={"draft": "none", "top_k": 20})
        assert out.choices[0].text == sampled.text and out.model_extra["specdec"]["seed"] == 7


def test_sixteen_concurrent_streams(server, client, reference):
    def stream(i: int) -> tuple[str, str]:
        prompt, n = PROMPTS[i % len(PROMPTS)], 4 + i % 5
        chunks = client.completions.create(model=server.model, prompt=prompt, max_tokens=n, stream=True)
        return "".join(c.choices[0].text for c in chunks), reference(prompt, n).text

    for i in range(len(PROMPTS) * 5):  # references first: the test process computes them one at a time
        reference(PROMPTS[i % len(PROMPTS)], 4 + i % 5)
    with ThreadPoolExecutor(16) as pool:
        results = [f.result(timeout=120) for f in [pool.submit(stream, i) for i in range(16)]]
    assert all(got == want for got, want in results)
    assert health(server)["rejected"] == 0


def test_full_queue_answers_429_and_a_disconnecting_client_stops_only_itself(server, reference):
    body = {"model": server.model, "prompt": PROMPTS[0], "max_tokens": LONG, "draft": "none", "stream": True}
    cancelled = health(server)["cancelled"]
    batch = server.max_batch  # long streams that fill the batch: the others wait in the queue
    with ThreadPoolExecutor(MAX_QUEUE) as pool, httpx.Client(timeout=30) as http, contextlib.ExitStack() as longs:
        held = []  # the line iterators: a dropped iterator closes its stream, and the server cancels it
        for _ in range(batch):
            long = longs.enter_context(http.stream("POST", server.url + "/v1/completions", json=body))
            assert long.status_code == 200
            held.append(long.iter_lines())
            assert next(line for line in held[-1] if line.startswith("data:"))  # it runs
        waiting = [pool.submit(post, server, "/v1/completions",
                               {"model": server.model, "prompt": PROMPTS[i % 4], "max_tokens": 4 + i % 3})
                   for i in range(MAX_QUEUE)]
        wait_until(lambda: health(server)["waiting"] == MAX_QUEUE, 30, "the queue to fill")
        full = post(server, "/v1/completions", {"model": server.model, "prompt": "w1", "max_tokens": 2})
        assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
        assert full.json()["error"]["code"] == "queue_full" and health(server)["running"] == batch
        longs.close()  # the long streams are closed here: their clients disconnected, the waiting requests go on
        answers = [f.result(timeout=90) for f in waiting]
    for i, answer in enumerate(answers):
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["text"] == reference(PROMPTS[i % 4], 4 + i % 3).text
    doc = wait_until(lambda: (d := health(server))["running"] == 0 and d, 10, "the worker to be idle")
    assert doc["waiting"] == 0 and doc["cancelled"] == cancelled + batch


def test_a_non_streaming_client_that_leaves_cancels_its_generation(server):
    cancelled = health(server)["cancelled"]
    body = json.dumps({"model": server.model, "prompt": PROMPTS[0], "max_tokens": LONG, "draft": "none"}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    # a raw socket: the client leaves once the generation is seen running, whatever the machine's speed
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: health(server)["running"] == 1, 10, "the generation to start")
    doc = wait_until(lambda: (d := health(server))["cancelled"] > cancelled and d, 10, "the generation to stop")
    assert doc["running"] == 0 and doc["cancelled"] == cancelled + 1


def test_requests_run_in_arrival_order(server, reference):
    """While a long generation holds the worker, requests arrive one by one (each seen waiting before the
    next is sent); once it is gone they must finish in the order they arrived."""
    long_body = {"model": server.model, "prompt": PROMPTS[0], "max_tokens": LONG, "draft": "none", "stream": True}
    finished: list[int] = []

    def request(i: int) -> httpx.Response:
        # 12 tokens: one generation outlasts a client thread's wake-up (with 3, one CI run saw two clients of
        # one-at-a-time requests record their ends out of order)
        answer = post(server, "/v1/completions", {"model": server.model, "prompt": PROMPTS[i], "max_tokens": 12})
        finished.append(i)  # list.append is atomic
        return answer

    batch = server.max_batch
    with ThreadPoolExecutor(len(PROMPTS)) as pool, httpx.Client(timeout=30) as http, contextlib.ExitStack() as longs:
        held = []  # the line iterators: a dropped iterator closes its stream, and the server cancels it
        for _ in range(batch):  # long streams that fill the batch
            long = longs.enter_context(http.stream("POST", server.url + "/v1/completions", json=long_body))
            held.append(long.iter_lines())
            assert next(line for line in held[-1] if line.startswith("data:"))  # it runs
        order = [2, 0, 3, 1]
        futures = []
        for n, i in enumerate(order, start=1):
            futures.append(pool.submit(request, i))
            wait_until(lambda n=n: health(server)["waiting"] == n, 30, f"request {n} to wait")
        longs.close()
        answers = [f.result(timeout=90) for f in futures]  # the long streams' clients have left
    # they join in arrival order, `batch` at a time; requests of one length that joined together finish together
    groups = [order[i: i + batch] for i in range(0, len(order), batch)]
    assert [sorted(finished[i: i + batch]) for i in range(0, len(order), batch)] == [sorted(g) for g in groups]
    assert [a.json()["choices"][0]["text"] for a in answers] == [reference(PROMPTS[i], 12).text for i in order]
    wait_until(lambda: health(server)["running"] == 0, 10, "the worker to be idle")


def test_timeout(server, client):
    body = {"model": server.model, "prompt": PROMPTS[0], "max_tokens": LONG, "draft": "none", "timeout": 0.5}
    answer = post(server, "/v1/completions", body)
    assert answer.status_code == 504 and answer.json()["error"]["code"] == "timeout"
    with pytest.raises(openai.APIError, match="timeout"):  # streaming: an error event, then [DONE]
        list(client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=LONG, stream=True,
                                       extra_body={"draft": "none", "timeout": 0.5}))
    wait_until(lambda: health(server)["running"] == 0, 10, "the worker to be idle")


M = "{model}"  # replaced by the served model's name
BAD = [  # (path, body, status, the error's param, words of its message)
    ("/v1/completions", b"{not json", 400, None, 'the request body is not valid JSON'),
    ("/v1/completions", b"[1, 2]", 400, None, 'the request body must be a JSON object, got list'),
    ("/v1/completions", {"prompt": "w1"}, 400, "model", "'model' is required; this server serves"),
    ("/v1/completions", {"model": "gpt-4o", "prompt": "w1"}, 400, "model", "the model 'gpt-4o' is not served here"),
    ("/v1/completions", {"model": M}, 400, "prompt", "'prompt' is required and must not be empty"),
    ("/v1/completions", {"model": M, "prompt": ""}, 400, "prompt", "'prompt' is empty; give some text to continue"),
    ("/v1/completions", {"model": M, "prompt": "   "},
     400, "prompt", "'prompt' is empty; give some text to continue"),
    ("/v1/completions", {"model": M, "prompt": ["w1", "w2"]},
     400, "prompt", 'one prompt per request (specdec serves n = 1, no batches)'),
    ("/v1/completions", {"model": M, "prompt": [5, 100000]}, 400, "prompt", 'prompt token ids must be in [0, '),
    ("/v1/completions", {"model": M, "prompt": "w1", "temperature": -0.5},
     400, "temperature", "'temperature' must be a number >= 0, got -0.5"),
    ("/v1/completions", {"model": M, "prompt": "w1", "temperature": "hot"},
     400, "temperature", "'temperature' must be a number >= 0, got 'hot'"),
    ("/v1/completions", {"model": M, "prompt": "w1", "top_p": 0},
     400, "top_p", "'top_p' must be a number in (0, 1], got 0"),
    ("/v1/completions", {"model": M, "prompt": "w1", "top_p": 1.5},
     400, "top_p", "'top_p' must be a number in (0, 1], got 1.5"),
    ("/v1/completions", {"model": M, "prompt": "w1", "top_k": 0},
     400, "top_k", "'top_k' must be an integer >= 1, got 0"),
    ("/v1/completions", {"model": M, "prompt": "w1", "max_tokens": 0},
     400, "max_tokens", "'max_tokens' must be an integer >= 1, got 0"),
    ("/v1/completions", {"model": M, "prompt": "w1", "max_tokens": CONTEXT},
     400, "max_tokens", "this model's context is 4096 tokens; you asked for"),
    ("/v1/completions", {"model": M, "prompt": "w1", "n": 2},
     400, "n", "'n' must be 1 (specdec generates one completion per request), got 2"),
    ("/v1/completions", {"model": M, "prompt": "w1", "stop": [""]},
     400, "stop", "'stop' must be a non-empty string or a list of them, got ['']"),
    ("/v1/completions", {"model": M, "prompt": "w1", "seed": 1.5}, 400, "seed", "'seed' must be an integer in 64 bits"),
    ("/v1/completions", {"model": M, "prompt": "w1", "seed": 99999999999999999999},
     400, "seed", "'seed' must be an integer in 64 bits (-2**63 to 2**64 - 1), got 99999999999999999999"),
    ("/v1/completions", {"model": M, "prompt": "w1", "gamma": 0},
     400, "gamma", "'gamma' must be an integer >= 1, got 0"),
    ("/v1/completions", {"model": M, "prompt": "w1", "gamma_schedule": "fast"},
     400, "gamma_schedule", "'gamma_schedule' must be one of constant, heuristic, adaptive, confidence, got 'fast'"),
    ("/v1/completions", {"model": M, "prompt": "w1", "draft": "gpt2"},
     400, "draft", "'draft' must be one of none, default"),
    ("/v1/completions", {"model": M, "prompt": "w1", "stream": "yes"},
     400, "stream", "'stream' must be true or false, got 'yes'"),
    ("/v1/completions", {"model": M, "prompt": "w1", "logprobs": 3},
     400, "logprobs", "'logprobs' is not supported by specdec serve"),
    ("/v1/completions", {"model": M, "prompt": "w1", "timeout": -1},
     400, "timeout", "'timeout' must be a number of seconds > 0, got -1"),
    ("/v1/chat/completions", {"model": M},
     400, "messages", "'messages' is required: a non-empty list of {role, content}"),
    ("/v1/chat/completions", {"model": M, "messages": []},
     400, "messages", "'messages' is required: a non-empty list of {role, content}"),
    ("/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": ""}]},
     400, "messages", 'the messages are empty; give some text'),
    ("/v1/chat/completions", {"model": M, "messages": [{"content": "w1"}]},
     400, "messages[0]", "messages[0] must be an object with a string 'role'"),
    ("/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "messages[0].content", 'messages[0].content must be a string or a list of text parts'),
    ("/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "w1"}], "max_tokens": -3},
     400, "max_tokens", "'max_tokens' must be an integer >= 1, got -3"),
    ("/v1/completions", b'{"model": "{model}", "prompt": "w1 \\udcff"}',  # a lone surrogate: no tokenizer takes it
     400, "prompt", "prompt holds invalid Unicode: a lone surrogate"),
    ("/v1/chat/completions", b'{"model": "{model}", "messages": [{"role": "user", "content": "\\ud800w1"}]}',
     400, "messages[0].content", "messages[0].content holds invalid Unicode: a lone surrogate"),
    ("/v1/completions", b'{"model": "{model}", "prompt": "w1", "stop": ["\\udfff"]}',
     400, "stop[0]", "stop[0] holds invalid Unicode"),
    ("/v1/completions", b'{"model": "{model}", "prompt": "w1 \xff"}', 400, None, "the request body is not valid JSON"),
    ("/v1/completions", {"model": M, "prompt": "w1", "max_tokens": 10 ** 30},
     400, "max_tokens", "this model's context is 4096 tokens; you asked for"),
    ("/v1/completions", b'{"model": "{model}", "prompt": "w1", "temperature": NaN}',
     400, "temperature", "'temperature' must be a number >= 0, got nan"),
    ("/v1/completions", b'{"model": "{model}", "prompt": "w1", "top_p": Infinity}',
     400, "top_p", "'top_p' must be a number in (0, 1], got inf"),
    ("/v1/completions", {"model": M, "prompt": "w1 " * 5000}, 400, "prompt", "but the model reads at most 4096"),
    ("/v1/completions", {"model": M, "prompt": {"text": "w1"}}, 400, "prompt", "'prompt' must be a string or a list"),
    ("/v1/completions", {"model": M, "prompt": "w1", "response_format": {"type": "xml"}},
     400, "response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"}"),
    ("/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "w1"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
     400, "response_format", "'response_format.json_schema' must be an object with a 'schema' object"),
    ("/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "w1"}],
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     400, "response_format", "the JSON schema is invalid"),
    ("/v1/completions", {"model": M, "prompt": "w1", "draft": "grammar"},
     400, "draft", "'draft': \"grammar\" proposes the tokens a constraint forces"),
    ("/v1/nowhere", {}, 404, None, 'Not Found'),
]


@pytest.mark.parametrize("path, body, status, param, message", BAD,
                         ids=[f"{i}-{case[3]}" for i, case in enumerate(BAD)])
def test_bad_requests_answer_an_error_object(server, path, body, status, param, message):
    if isinstance(body, dict):
        body = {k: server.model if v == M else v for k, v in body.items()}
    else:
        body = body.replace(M.encode(), server.model.encode())
    answer = post(server, path, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert message in error["message"], error["message"]
    assert error["type"] == "invalid_request_error" and "Traceback" not in answer.text
    assert health(server)["status"] == "ready"


def test_the_server_answers_after_bad_requests(server, client, reference):
    assert httpx.get(server.url + "/v1/completions", timeout=5).status_code == 405
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=server.model, prompt="w1", temperature=-1)
    assert err.value.body["param"] == "temperature"
    out = client.completions.create(model=server.model, prompt=PROMPTS[3], max_tokens=5)
    assert out.choices[0].text == reference(PROMPTS[3], 5).text
    assert "Traceback" not in server.log.read_text()
