"""The serving benchmark's pieces (scripts/serve_bench.py): its requests, llama-server's command lines, a
conversation's turns, and the verdict against the best peer row. The timing itself is the benchmark's, not CI's."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "serve_bench.py"


@pytest.fixture(scope="module")
def sb():
    spec = importlib.util.spec_from_file_location("serve_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_editing_functions_are_real_stdlib_sources_of_the_sizes_asked(sb):
    functions = sb.stdlib_functions()
    assert len(functions) >= 24
    assert all(600 <= len(code) <= 5500 and code.startswith(f"def {name}(") for name, code in functions)
    assert functions == sb.stdlib_functions()  # the same list every run
    first = [len(code) for _, code in functions[:6]]
    assert max(first) > 3000 and min(first) < 1500  # the first few mix long and short functions


def test_jobs_per_workload(sb):
    completion = sb.jobs("completion", 3)
    problems = sb.humaneval()
    assert [j["prompt"] for j in completion] == [p["prompt"] for p in problems[120:123]]  # held out from the bench's
    chat = sb.jobs("chat", 2)
    assert chat[0]["kind"] == "chat" and chat[0]["turns"] == []
    assert problems[40]["entry_point"] in chat[0]["messages"][0]["content"]
    editing = sb.jobs("editing", 2)
    name, code = sb.stdlib_functions()[0]
    assert f"`{name}` to `{name}_v2`" in editing[0]["messages"][0]["content"] and code in editing[0]["messages"][0]["content"]
    conversation = sb.jobs("conversation", 1)
    assert len(conversation[0]["turns"]) == 3
    with pytest.raises(SystemExit, match="unknown workload 'poems': one of completion, chat, editing, conversation"):
        sb.jobs("poems", 1)


def test_job_counts_one_for_all_or_per_workload(sb):
    assert sb.job_counts("8") == {"*": 8}
    assert sb.job_counts("chat=8,editing=10") == {"chat": 8, "editing": 10}
    for bad in ("poems=3", "chat=0", "chat=x", "chat"):
        with pytest.raises(Exception, match=r"give a number, or workload=number .*\(chat=8,editing=8\)"):
            sb.job_counts(bad)


def test_llama_server_command_lines(sb, tmp_path):
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    plain = sb.llama_args("plain", 4, 2, t, d)
    assert plain[plain.index("-np") + 1] == "4" and plain[plain.index("-c") + 1] == str(4 * sb.CONTEXT)
    assert "--spec-type" not in plain
    draft = sb.llama_args("draft-8", 1, 2, t, d)
    assert draft[draft.index("--spec-type") + 1] == "draft-simple" and draft[draft.index("-md") + 1] == str(d)
    assert draft[draft.index("--spec-draft-n-max") + 1] == "8"
    ngram = sb.llama_args("ngram", 1, 2, t, d)
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod" and "-md" not in ngram
    with pytest.raises(SystemExit, match="unknown llama-server mode 'eagle'"):
        sb.llama_args("eagle", 1, 2, t, d)


class FakeClient:
    """Answers each chat turn with the turn's number; records the bodies."""

    def __init__(self, usage_shape: str):
        self.bodies, self.usage_shape = [], usage_shape

    def post(self, path, json):
        self.bodies.append((path, json))
        doc = {"choices": [{"message": {"content": f"answer {len(self.bodies)}"}, "text": "t"}],
               "usage": {"completion_tokens": 5, "prompt_tokens": 10 * len(self.bodies)}}
        if self.usage_shape == "openai":
            doc["usage"]["prompt_tokens_details"] = {"cached_tokens": 7}
        else:
            doc["timings"] = {"cache_n": 3}

        class Reply:
            status_code, text = 200, ""

            @staticmethod
            def json():
                return doc
        return Reply()


@pytest.mark.parametrize("shape,cached", [("openai", 7), ("llama-server", 3)])
def test_a_conversation_resends_its_answers(sb, shape, cached):
    client = FakeClient(shape)
    job = {"kind": "chat", "messages": [{"role": "user", "content": "q1"}], "turns": ["q2", "q3"], "max_tokens": 9}
    out = sb.send(client, "m", job, {"draft": "none"})
    assert [r["text"] for r in out] == ["answer 1", "answer 2", "answer 3"]
    assert [r["cached_tokens"] for r in out] == [cached] * 3
    path, last = client.bodies[-1]
    assert path == "/v1/chat/completions" and last["draft"] == "none" and last["max_tokens"] == 9
    assert last["messages"] == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "answer 1"},
                                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "answer 2"},
                                {"role": "user", "content": "q3"}]
    assert job["messages"] == [{"role": "user", "content": "q1"}]  # the job itself is left as it was


def test_verdicts_take_the_best_llama_server_row(sb):
    def row(server, workload, clients, tps, **kw):
        return {"server": server, "workload": workload, "clients": clients, "output_tokens_per_s": tps,
                "requests": 4, **kw}

    rows = [row("specdec", "chat", 1, 16.0, identical=4), row("specdec plain", "chat", 1, 10.0),
            row("llama-server plain", "chat", 1, 10.0), row("llama-server draft-4", "chat", 1, 8.0),
            row("specdec", "chat", 8, 30.0, identical=4), row("specdec plain", "chat", 8, 32.0),
            row("llama-server plain", "chat", 8, 20.0), row("openvino plain", "chat", 1, 9.0)]
    one, eight = sb.verdicts(rows)
    assert one["peer"] == "llama-server plain" and one["vs_peer"] == pytest.approx(1.6)
    assert one["vs_plain"] == pytest.approx(1.6) and one["openvino_tokens_per_s"] == 9.0 and one["meets_bar"]
    assert eight["vs_peer"] == pytest.approx(1.5) and not eight["meets_bar"]  # ahead of llama-server, behind plain
    json.dumps([one, eight])


def test_verdicts_compare_the_means_of_repeated_runs(sb):
    """--repeat: specdec and its plain batching ran twice each; the verdict compares their means and lists each run's
    ratio; the identical texts add up over the runs."""
    def row(server, run, tps, **kw):
        return {"server": server, "workload": "completion", "clients": 8, "output_tokens_per_s": tps, "requests": 8,
                "run": run, "latency_p50_s": 20.0, "latency_p95_s": 25.0, **kw}

    rows = [row("specdec", 0, 33.0, identical=8), row("specdec plain", 0, 30.0, identical=8),
            row("specdec", 1, 35.0, identical=8), row("specdec plain", 1, 36.0, identical=8),
            row("llama-server plain", 0, 20.0)]
    (v,) = sb.verdicts(rows)
    assert v["specdec"] == pytest.approx(34.0) and v["plain"] == pytest.approx(33.0)
    assert v["vs_plain"] == pytest.approx(34.0 / 33.0) and v["vs_plain_runs"] == pytest.approx([1.1, 35.0 / 36.0])
    assert v["identical"] == "16/16" and v["vs_peer"] == pytest.approx(1.7) and v["meets_bar"]
    assert "| 1.03x (runs 0.97-1.10x) |" in sb.tables({"cpu": "c", "date": "d", "specdec_commit": "x", "llama_cpp_python": "y",
                                              "rows": rows, "verdicts": [v]})


def test_a_peer_that_ran_in_each_repeat_is_its_mean_and_each_runs_ratio_is_listed(sb):
    """--repeat with llama-server: its plain ran in each repeat beside specdec (A B C C B A); the peer is the best mode
    by its mean over its runs (not its luckiest run), and each run's ratio against it is listed."""
    def row(server, run, tps):
        return {"server": server, "workload": "chat", "clients": 1, "output_tokens_per_s": tps, "requests": 8,
                "run": run, "identical": 8, "latency_p50_s": 5.0, "latency_p95_s": 9.0}

    rows = [row("specdec", 0, 15.0), row("specdec plain", 0, 13.0), row("llama-server plain", 0, 10.0),
            row("llama-server plain", 1, 8.0), row("specdec plain", 1, 12.0), row("specdec", 1, 12.0),
            {**row("llama-server draft-4", 0, 9.5), "run": None}]  # (a mode that ran once: 9.5 > plain's mean 9.0)
    (v,) = sb.verdicts(rows)
    assert v["peer"] == "llama-server draft-4" and v["vs_peer"] == pytest.approx(13.5 / 9.5) and "vs_peer_runs" not in v
    rows = rows[:-1]
    (v,) = sb.verdicts(rows)
    assert v["peer"] == "llama-server plain" and v["peer_tokens_per_s"] == pytest.approx(9.0)
    assert v["vs_peer"] == pytest.approx(1.5) and v["vs_peer_runs"] == pytest.approx([1.5, 1.5]) and v["meets_bar"]
    table = sb.tables({"cpu": "c", "date": "d", "specdec_commit": "x", "llama_cpp_python": "y", "rows": rows,
                       "verdicts": [v]})
    assert "| 9.00 (llama-server plain) | 1.50x (runs 1.50-1.50x) |" in table


def test_verdicts_without_llama_server_still_compare_with_plain(sb):
    """A run of specdec alone (--servers specdec): the verdict compares it with its plain batching; the bar against
    llama-server cannot be judged (None, 'n/a'), except where it has no peer bar (2 clients: >= plain only)."""
    def row(server, clients, tps):
        return {"server": server, "workload": "chat", "clients": clients, "output_tokens_per_s": tps, "requests": 4,
                "identical": 4, "latency_p50_s": 1.0, "latency_p95_s": 2.0}

    rows = [row("specdec", 2, 30.0), row("specdec plain", 2, 25.0), row("specdec", 8, 33.0),
            row("specdec plain", 8, 30.0)]
    two, eight = sb.verdicts(rows)
    assert two["vs_plain"] == pytest.approx(1.2) and two["meets_bar"] is True and "vs_peer" not in two
    assert eight["vs_plain"] == pytest.approx(1.1) and eight["meets_bar"] is None
    table = sb.tables({"cpu": "c", "date": "d", "specdec_commit": "x", "llama_cpp_python": "y", "rows": rows,
                       "verdicts": [two, eight]})
    assert "| chat | 8 | 33.00 | 30.00 | 1.10x | not run |  |  | >= 1.25x, >= plain | n/a |" in table
