"""specdec serve's pieces in-process: streamed text around stop strings, the application before and after
loading, the API key, a failed load, the command's options."""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest
from starlette.testclient import TestClient

import specdec
from specdec import cli
from specdec.serve import Served
from specdec.serve.app import create_app
from specdec.serve.stream import TextStream, held_back
from tiny import load_tiny


def join(ids):
    return "".join(ids)


@pytest.mark.parametrize("groups, stop, sent, final", [
    ([["a", "b"], ["c"]], [], ["ab", "c"], "abc"),
    ([["a", "<"], ["/"], ["s", ">", "x"]], ["</s>"], ["a", "", ""], "a"),  # held, then cut
    ([["a", "<"], ["/"], ["b"]], ["</s>"], ["a", "", "</b"], "a</b"),  # held, then released
    ([["x", "E", "N", "D", "y"]], ["END"], ["x"], "x"),  # the stop inside one group
    ([["a", "E"], ["N"]], ["END", "NO"], ["a", ""], "aEN"),  # finish sends what was held
])
def test_text_stream(groups, stop, sent, final):
    stream = TextStream(join, stop)
    assert [stream.push(g) for g in groups] == sent
    assert "".join(sent) + stream.finish(final) == final


def test_text_stream_never_shows_a_stop_string():
    rng = random.Random(0)
    for _ in range(300):
        stop = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 2))]
        stream, shown, tokens, final = TextStream(join, stop), "", [], None
        while final is None and len(tokens) < 20:
            group = [rng.choice("ab") for _ in range(rng.randint(1, 4))]
            tokens += group
            shown += stream.push(group)
            text = join(tokens)
            cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
            if cuts:  # the decoding loop stops here, its text cut before the first stop string
                final = text[: min(cuts)]
            assert (final or text).startswith(shown) and not any(s in shown for s in stop)
        if final is None:
            final = join(tokens)
            assert len(final) - len(shown) < max(map(len, stop))  # only a possible start of a stop is held
        assert shown + stream.finish(final) == final


def test_held_back():
    assert held_back("abc<|en", ["<|end|>"]) == 4 and held_back("abc", ["<|end|>"]) == 0
    assert held_back("ab", ["b", "abx"]) == 2


def _served() -> Served:
    return Served(model_id="tiny", target=load_tiny("llama", eos=None), draft=None, draft_label="none",
                  options={}, timeout=30.0)


def _wait(condition, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_loading_then_ready_and_the_api_key():
    gate = threading.Event()

    def load() -> Served:
        assert gate.wait(20)
        return _served()

    body = {"model": "tiny", "prompt": "w1 w2", "max_tokens": 5}
    key = {"Authorization": "Bearer sesame"}
    with TestClient(create_app(load, api_key="sesame")) as http:
        assert http.get("/health").json() == {"status": "loading"} and http.get("/health").status_code == 503
        loading = http.post("/v1/completions", json=body, headers=key)
        assert loading.status_code == 503 and loading.json()["error"]["code"] == "loading"
        gate.set()
        _wait(lambda: http.get("/health").status_code == 200)  # /health needs no key
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            refused = http.post("/v1/completions", json=body, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/v1/models").status_code == 401
        answer = http.post("/v1/completions", json=body, headers=key)
        assert answer.status_code == 200
        reference = specdec.generate(_served().target, "w1 w2", max_new_tokens=5)
        assert answer.json()["choices"][0]["text"] == reference.text


def test_the_playground_is_served_unless_turned_off():
    with TestClient(create_app(_served)) as http:
        page = http.get("/")
        assert page.status_code == 200 and "<title>specdec playground</title>" in page.text
        for name in ("playground.js", "style.css"):
            assert http.get(f"/ui/{name}").status_code == 200
        assert http.get("/ui/missing.js").status_code == 404
    with TestClient(create_app(_served, ui=False)) as http:
        assert http.get("/").status_code == 404 and http.get("/ui/playground.js").status_code == 404
    assert cli.build_parser().parse_args(["serve"]).ui and not cli.build_parser().parse_args(["serve", "--no-ui"]).ui


def test_a_failed_load_is_reported_and_stops_the_server():
    failures = []

    def load() -> Served:
        raise specdec.SpecDecError("no model here")

    with TestClient(create_app(load, on_load_error=failures.append)) as http:
        _wait(lambda: failures)
        assert http.get("/health").json() == {"status": "failed"}
    assert str(failures[0]) == "no model here"


def test_serve_command_exits_with_the_load_error(capsys, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = cli.main(["serve", "--target", str(tmp_path / "missing"), "--draft", "none", "--port", str(port),
                     "--log-level", "error"])
    assert code == 2 and "specdec: error:" in capsys.readouterr().err


def test_serve_options():
    args = cli.build_parser().parse_args(["serve"])
    from specdec.config import DEFAULT_TARGET
    from specdec.models.kernels.extension import cpu_supported

    assert (args.host, args.port, args.max_queue, args.device, args.target) == ("127.0.0.1", 8000, 16, None, DEFAULT_TARGET)
    cpu = cli.build_parser().parse_args(["serve", "--device", "cpu"])
    # one draft in both server modes, the CPU default hierarchy (the batch's rows draft with its top model, a lone
    # row with all of it), 4 a round, constant
    default = f"copy+qwen2.5-coder-0.5b:{'int4@65536' if cpu_supported() else 'int8'}<-prompt-lookup"
    for cpu.max_batch in (cli.SERVED_BATCH_CPU, 1):  # as _serve sets it on CPU; one request at a time
        assert cli.draft_spec(cpu) == default
    assert (cpu.gamma, cpu.gamma_schedule) == (None, None)
    assert cli.build_parser().parse_args(["serve", "--device", "cpu"]).device == "cpu"
    assert cli.main(["serve", "--max-queue", "-1"]) == 2


def test_a_requests_gamma_and_schedule_replace_the_servers_one_by_one():
    """The command line's gamma and schedule (Served.options) apply to every request that does not give its own;
    a request's gamma or schedule replaces only that one."""
    from dataclasses import replace

    from specdec.serve.protocol import parse_request

    served = replace(_served(), options={"gamma": 6, "gamma_schedule": "adaptive", "max_gamma": 9})

    def speculation(**asked):
        config = parse_request({"model": "tiny", "prompt": "w1 w2", "max_tokens": 3, **asked}, chat=False,
                               served=served).config
        return config.gamma, config.gamma_schedule, config.max_gamma

    assert speculation() == (6, "adaptive", 9)
    assert speculation(gamma=2) == (2, "adaptive", 9)
    assert speculation(gamma_schedule="constant") == (6, "constant", 9)
    assert speculation(gamma=3, gamma_schedule="heuristic") == (3, "heuristic", 9)
    plain = replace(served, options={})  # a server started without either: 4 a round, constant
    assert parse_request({"model": "tiny", "prompt": "w1"}, chat=False, served=plain).config.gamma == 4
