"""specdec bench: prompt loading and the whole run path on tiny random models (no real model, fast)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import specdec
import specdec.bench as bench
from specdec.bench.aggregation import first_difference
from specdec.analysis.values import ms
from specdec.bench.grid import select_methods
from specdec.bench.methods import METHODS
from specdec.publish.tables import machine_lines, table
from specdec.sweeps.machine import code_version, cpu_kind, machines_of
from specdec.errors import SpecDecError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults():
    args = parse()
    assert (args.target, args.draft, args.gamma, args.n_prompts, args.max_new_tokens) == (
        "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", 4, 20, 64)
    assert args.temperature == 0.0 and args.dtype == "bf16" and args.repeats == 1 and args.warmup == 1
    assert args.methods is None and args.threads is None and args.json is None


def test_humaneval_prompts():
    prompts = bench.load_humaneval(20)
    assert len(prompts) == 20
    assert all(isinstance(p.text, str) and p.text.strip() for p in prompts)
    assert prompts[0].id == "HumanEval/0" and len({p.id for p in prompts}) == 20


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "w1 w2", "task_id": "a"}\n\n{"prompt": "w3"}\n{"prompt": "w4"}\n')
    prompts = bench.load_jsonl(path, 2)
    assert [p.text for p in prompts] == ["w1 w2", "w3"]
    assert prompts[0].id == "a"
    assert len(bench.load_jsonl(path)) == 3


@pytest.mark.parametrize("content, message", [
    ('{"text": "x"}\n', 'bad.jsonl, line 1: needs a non-empty string field "prompt"'),
    ("not json\n", "bad.jsonl, line 1: not JSON"),
    ("", "bad.jsonl holds no prompts"),
])
def test_jsonl_prompts_bad(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(SpecDecError) as info:
        bench.load_jsonl(path)
    assert message in str(info.value)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = ["w1 w2 w3 w4", "w5 w6 w7 w8 w9 w10", "w11 w12", "w3 w3 w3 w3 w3"]
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    return path


def test_run_tiny(tiny_pair, prompts_file, tmp_path, capsys):
    target, draft = tiny_pair
    args = parse("--prompts-file", str(prompts_file), "--n-prompts", "2", "--max-new-tokens", "10",
                 "--gamma", "3", "--repeats", "2", "--dtype", "fp32")
    result = bench.run(args, target=target, draft=draft, progress=False)

    assert set(result["methods"]) == set(METHODS) - {"llama-cpp", "llama-cpp-lookup"}  # no GGUF for a tiny model
    for name, m in result["methods"].items():
        assert m["runs"] == 4 and m["new_tokens"] > 0 and m["tokens_per_second"] > 0
        assert set(result["speedups"][name]) == {"vs_specdec-plain", "vs_hf-plain", "vs_hf-assisted"}
    assert result["speedups"]["specdec-plain"]["vs_specdec-plain"] == pytest.approx(1.0)
    spec = result["methods"]["specdec-spec"]
    assert 0.0 <= spec["alpha"] <= 1.0 and 1.0 <= spec["mean_accepted_length"] <= 4.0
    assert spec["draft_calls"] > 0 and spec["c_estimate"] > 0
    assert sum(spec["time_split"].values()) == pytest.approx(1.0)
    assert result["methods"]["specdec-plain"]["mean_accepted_length"] == pytest.approx(1.0)

    # Greedy: speculative tokens equal plain tokens (fp32), and the HF peers agree with specdec.
    eq = result["equality"]
    assert eq["specdec_spec_vs_plain"] == {"runs": 4, "equal": 4, "all_equal": True, "mismatches": []}
    assert eq["hf_plain_vs_specdec_plain"]["all_equal"]
    assert eq["hf_assisted_vs_hf_plain"]["all_equal"]

    assert len(result["runs"]) == 4 and result["runs"][0]["order"] != result["runs"][1]["order"]
    assert result["config"]["n_prompts"] == 2 and result["config"]["dtype"] == "float32"
    assert result["machine"]["torch_threads"] >= 1 and result["machine"]["cpu_count"] >= 1
    assert result["machine"]["cpu_kind"] == cpu_kind()
    assert result["machine"]["kernels"]["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    (here,) = result["machine"]["units_measured_on"]  # every prompt's record names the machine that measured it
    assert (here["cpu"], here["cpu_kind"], here["code"], here["records"]) == (
        result["machine"]["cpu"], cpu_kind(), code_version(), 4)
    assert code_version().startswith(specdec.__version__)
    assert result["step_costs"]["c_direct"] > 0
    json.dumps(result)  # JSON-able
    assert "| specdec-spec |" in table(result)


def test_step_times_keep_three_figures_from_a_cpu_to_a_gpu():
    # a GPU's graphed step (2.43 ms) must not print as "2 ms": c and the verify ratio are read from these
    assert [ms(s) for s in (0.206, 0.0415, 0.002425, 0.00015)] == ["206", "41.5", "2.43", "0.15"]


def test_main_prints_table_then_json(tiny_pair, prompts_file, tmp_path, monkeypatch, capsys):
    target, draft = tiny_pair
    real_run = bench.run
    monkeypatch.setattr(bench, "run", lambda args: real_run(args, target=target, draft=draft, progress=False))
    out_path = tmp_path / "bench.json"
    args = parse("--prompts-file", str(prompts_file), "--n-prompts", "2", "--max-new-tokens", "6",
                 "--methods", "specdec-plain,specdec-spec", "--warmup", "0", "--json", str(out_path))
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("| method |")
    document = json.loads(out[out.index("\n{") + 1:])
    assert list(document["methods"]) == ["specdec-plain", "specdec-spec"]
    assert json.loads(out_path.read_text()) == document


def test_out_dir_logs_each_prompt_as_it_ends(tiny_pair, prompts_file, tmp_path, monkeypatch):
    """A run cut short by a time limit still leaves its measured prompts in <out>/runs.jsonl."""
    from specdec.bench import measuring, runner

    target, draft = tiny_pair
    out = tmp_path / "out"
    out.mkdir()
    (out / runner.RUNS_LOG).write_text("a line from an earlier run\n")
    args = parse("--prompts-file", str(prompts_file), "--n-prompts", "2", "--max-new-tokens", "6",
                 "--methods", "specdec-plain,specdec-spec", "--warmup", "0", "--out", str(out))
    result = bench.run(args, target=target, draft=draft, progress=False)
    lines = [json.loads(line) for line in (out / runner.RUNS_LOG).read_text().splitlines()]
    assert [line["prompt"] for line in lines] == [run["prompt"] for run in result["runs"]]  # no earlier line
    assert all(line["temperature"] == 0.0 and line["specdec-spec"]["new_tokens"] == 6 for line in lines)

    calls = []
    real_log = measuring.log_record

    def stop_after_the_first(*a):
        real_log(*a)
        calls.append(1)
        raise KeyboardInterrupt  # the time limit, after the first prompt

    monkeypatch.setattr(measuring, "log_record", stop_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        bench.run(args, target=target, draft=draft, progress=False)
    lines = (out / runner.RUNS_LOG).read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["specdec-plain"]["tokens_per_second"] > 0


def test_bench_prepares_every_step_width_before_timing(tiny_pair, prompts_file, monkeypatch):
    from specdec.models.causal import LanguageModel

    target, draft = tiny_pair
    asked = []
    monkeypatch.setattr(LanguageModel, "prepare_steps", lambda self, positions=None, max_width=None:
                        asked.append((self.name, positions, max_width)) or [])
    args = parse("--prompts-file", str(prompts_file), "--n-prompts", "2", "--max-new-tokens", "6",
                 "--methods", "specdec-plain,specdec-spec", "--gammas", "2,5", "--warmup", "0")
    bench.run(args, target=target, draft=draft, progress=False)
    prompts = [target.encode(json.loads(line)["prompt"]) for line in prompts_file.read_text().splitlines()[:2]]
    positions = max(map(len, prompts)) + 6 + 1
    # every model a run uses, one capacity, up to its widest step: the target verifies 5 drafts after a token
    assert asked == [(target.name, positions, 6), (draft.name, positions, 2)]


def test_prompt_lookup_draft_name(tiny_pair, prompts_file):
    target, _ = tiny_pair
    args = parse("--prompts-file", str(prompts_file), "--n-prompts", "2", "--max-new-tokens", "8",
                 "--draft", "prompt-lookup", "--warmup", "0")
    result = bench.run(args, target=target, progress=False)
    assert result["config"]["draft"] == "prompt-lookup"
    assert result["equality"]["specdec_spec_vs_plain"]["all_equal"]
    assert "c_direct" not in result["step_costs"]


def test_bad_method(tiny_pair):
    with pytest.raises(SpecDecError, match="unknown method"):
        bench.run(parse("--methods", "specdec-plain,fast"), target=tiny_pair[0], progress=False)


class FakeLlama:
    """Stands in for llama_cpp.Llama: yields a fixed token stream and records how it was called."""

    def __init__(self, stream):
        self.stream, self.calls, self.seeds, self.resets = stream, [], [], 0

    def reset(self):
        self.resets += 1

    def set_seed(self, seed):
        self.seeds.append(seed)

    def generate(self, tokens, **options):
        self.calls.append((list(tokens), options))
        yield from self.stream


def test_llama_cpp_runner_greedy_stops_at_eos_and_length():
    from specdec.bench.methods import Settings, llama_cpp_runner

    llm = FakeLlama([5, 6, 2, 7, 8])
    trial = llama_cpp_runner(llm, {2}, Settings(4, 0.0, 10, 0))([1, 2, 3])
    assert trial.tokens == [5, 6, 2] and trial.stats is None and trial.seconds > 0
    prompt, options = llm.calls[0]
    assert prompt == [1, 2, 3] and options["reset"] and llm.resets == 1  # no prefix reuse across calls
    assert options["temp"] == 0.0 and options["top_k"] == 1 and options["repeat_penalty"] == 1.0
    assert llama_cpp_runner(llm, {2}, Settings(4, 0.0, 2, 0))([1]).tokens == [5, 6]
    sampled = llama_cpp_runner(llm, set(), Settings(4, 1.0, 3, 7))([1])
    assert sampled.tokens == [5, 6, 2] and llm.seeds == [7]
    options = llm.calls[-1][1]
    assert options["temp"] == 1.0 and options["top_k"] == 0 and options["top_p"] == 1.0 and options["min_p"] == 0.0


def test_llama_cpp_method_errors(monkeypatch):
    import sys

    from specdec.bench import methods
    from specdec.models.llama_cpp import target_gguf

    with pytest.raises(SpecDecError, match="neither a preset .* nor a .gguf file; leave llama-cpp and llama-cpp-lookup out of --methods"):
        target_gguf("some/hf-folder")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    with pytest.raises(SpecDecError, match=r"pip install 'specdec\[llama\]'"):
        methods.load_llama_cpp(methods.Path("x.gguf"), 512, 2, 0)
    monkeypatch.setattr(methods.llama_cpp, "installed", lambda: False)
    assert {"llama-cpp", "llama-cpp-lookup"} <= set(METHODS)
    assert not {"llama-cpp", "llama-cpp-lookup"} & set(methods.default_methods())
    monkeypatch.setattr(methods.llama_cpp, "installed", lambda: True)
    assert methods.default_methods() == METHODS
    assert "llama-cpp" in select_methods(None, "qwen2.5-coder-1.5b")  # a preset: its GGUF is packaged
    assert "llama-cpp" not in select_methods(None, "some/hf-folder")  # the default leaves it out, no error
    assert "llama-cpp-lookup" not in select_methods(None, "some/hf-folder")


@pytest.mark.parametrize("command, argv, message", [
    ("bench", ["--drafts", "nosuch-model"], "unknown model 'nosuch-model'"),
    ("bench", ["--drafts", "qwen2.5-coder-0.5b:int8<-nosuch-model"], "unknown model 'nosuch-model'"),
    ("bench", ["--target", "nosuch-target"], "unknown model 'nosuch-target'"),
    ("alpha", ["--drafts", "bigram", "nosuch-model"], "unknown model 'nosuch-model'"),
    ("bench", ["--shard-size", "0"], "--shard-size must be >= 1, got 0"),
    ("alpha", ["--shard-size", "0"], "--shard-size must be >= 1, got 0"),
    ("bench", ["--batch-sizes", "4,0"], "--batch-sizes must be >= 1"),
])
def test_bench_and_alpha_check_models_before_loading(monkeypatch, capsys, command, argv, message):
    from specdec.sweeps.pool import ModelPool
    from specdec.cli import main

    def must_not_load(self, name, quantize=None):
        raise AssertionError(f"{name} was loaded before the names were checked")

    monkeypatch.setattr(ModelPool, "get", must_not_load)
    assert main([command, *argv, "--n-prompts", "1"]) == 2
    assert message in capsys.readouterr().err


def test_the_cpu_kind_names_the_instruction_sets_that_decide_speed():
    assert cpu_kind({"fpu", "sse4_2", "avx2", "fma"}) == "AVX2 only"
    assert cpu_kind({"avx2", "avx512f"}) == "AVX-512"
    assert cpu_kind({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}) == "AVX-512 BF16, AVX-512 VNNI"
    assert cpu_kind({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"}) == "AMX, AVX-512 BF16, AVX-512 VNNI"
    assert cpu_kind({"neon", "asimd"}) == "unknown"


def test_the_one_cpu_classifier_says_which_kernel_code_runs():
    """specdec.models.kernels.cpu: the kernel code a CPU's flags allow (the extension's choice starts from it)."""
    from specdec.models.kernels.cpu import has_amx, kernel_code

    epyc_zen4 = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
    assert kernel_code(epyc_zen4) == "avx512" and kernel_code(epyc_zen4, avx512=False) == "avx2"
    assert kernel_code({"avx2", "fma", "f16c"}) == "avx2"
    assert kernel_code({"avx2", "fma", "f16c", "avx512f", "avx512bw"}) == "avx2"  # AVX-512 without VNNI: the AVX2 code
    assert kernel_code({"avx2", "fma"}) is None and kernel_code({"neon", "asimd"}) is None  # no F16C; ARM
    assert has_amx(epyc_zen4 | {"amx_tile"}) and not has_amx(epyc_zen4)


def test_a_sweeps_records_name_their_machines_and_the_table_says_when_there_are_several():
    a = {"cpu": "EPYC", "cpu_kind": "AVX2 only", "code": "0.1.0 (abc1234)"}
    b = {"cpu": "Xeon", "cpu_kind": "AMX, AVX-512 BF16, AVX-512 VNNI", "code": "0.1.0 (abc1234)"}
    records = [{"machine": {**a, "date": "2026-11-25T10:00:00+00:00"}}, {"machine": {**b, "date": "2026-11-26T09:00:00+00:00"}},
               {"machine": {**a, "date": "2026-11-24T10:00:00+00:00"}}, {}]
    got = machines_of(records)
    assert got == [{**a, "records": 2, "first": "2026-11-24T10:00:00+00:00", "last": "2026-11-25T10:00:00+00:00"},
                   {**b, "records": 1, "first": "2026-11-26T09:00:00+00:00", "last": "2026-11-26T09:00:00+00:00"},
                   {"cpu": "not recorded", "cpu_kind": None, "code": None, "records": 1, "first": None, "last": None}]
    machine = {**a, "cpu_count": 2, "torch_threads": 2, "units_measured_on": got[:2]}
    text = "\n".join(machine_lines({"machine": machine}))
    assert ("The prompts were measured on: EPYC (AVX2 only), specdec 0.1.0 (abc1234), 2 runs, 2026-11-24 to "
            "2026-11-25; Xeon (AMX") in text
    assert "measured on" not in "\n".join(machine_lines({"machine": {**machine, "units_measured_on": got[:1]}}))
    # the same machine with other code says so too
    other_code = [{**got[0], "code": "0.1.0 (def5678)"}]
    assert "specdec 0.1.0 (def5678)" in "\n".join(machine_lines({"machine": {**machine, "units_measured_on": other_code}}))
    # a GPU run names its GPU first; the same CPU with a GPU is another machine
    gpu = {**b, "gpu": "NVIDIA H200"}
    on_gpu, on_cpu = machines_of([{"machine": {**gpu, "date": "2026-11-26T01:00:00+00:00"}}, {"machine": b}])
    assert on_gpu["gpu"] == "NVIDIA H200" and "gpu" not in on_cpu
    lines = machine_lines({"machine": {**gpu, "cpu_count": 16, "torch_threads": 16, "units_measured_on": [on_gpu]}})
    assert lines == [lines[0]] and lines[0].startswith("Machine: GPU NVIDIA H200; CPU Xeon, AMX, AVX-512 BF16")
    assert "Xeon (AMX, AVX-512 BF16, AVX-512 VNNI), GPU NVIDIA H200, specdec" in "\n".join(
        machine_lines({"machine": {**machine, "units_measured_on": [on_gpu]}}))


def test_the_machine_lines_say_how_llama_cpp_ran():
    machine = {"cpu": "Xeon", "cpu_kind": "AMX", "cpu_count": 2, "torch_threads": 2}
    for how, says in (({"llama_cpp_python": "0.3.36", "amx_in_build": True, "extra_buffer_types": False},
                       "llama.cpp: llama-cpp-python 0.3.36, a build with ggml's AMX kernel, extra buffer types off"),
                      ({"llama_cpp_python": "0.3.36", "amx_in_build": False, "extra_buffer_types": True},
                       "a build without ggml's AMX kernel, extra buffer types (repacked layouts) on")):
        lines = machine_lines({"machine": machine, "config": {"llama_cpp": how}})
        assert len(lines) == 2 and says in lines[1]
    assert len(machine_lines({"machine": machine, "config": {"llama_cpp": None}})) == 1  # no llama-cpp method ran

def test_a_process_warms_each_configuration_up_once_per_temperature_not_once_per_shard(tiny_pair, prompts_file,
                                                                                       monkeypatch):
    """With --shard-size 1 every prompt is a unit; the warmup (untimed, WARMUP_TOKENS tokens) runs on the first
    unit of each temperature only: the process is warm for the others."""
    from specdec.bench import measuring, runner

    target, draft = tiny_pair
    real = measuring._runners
    calls = {"warm": 0, "timed": 0}

    def counting(cells, *a, **k):
        made = real(cells, *a, **k)
        kind = "warm" if a[-3] == runner.WARMUP_TOKENS else "timed"  # a: (..., max_new_tokens, gamma, seed)

        def count(fn):
            def run(ids):
                calls[kind] += 1
                return fn(ids)
            return run
        return {name: count(fn) for name, fn in made.items()}

    monkeypatch.setattr(measuring, "_runners", counting)
    args = parse("--prompts-file", str(prompts_file), "--n-prompts", "4", "--max-new-tokens", "20", "--shard-size",
                 "1", "--methods", "specdec-plain,specdec-spec", "--temperatures", "0,1", "--dtype", "fp32")
    bench.run(args, target=target, draft=draft, progress=False)
    assert calls == {"warm": 2 * 2, "timed": 2 * 4 * 2}  # 2 configurations x 2 temperatures; x 4 prompts timed


def test_two_ways_alternate_within_each_pair_and_their_ratios_are_the_pairs(monkeypatch):
    """bench.timing.alternated: an untimed call first, the order a b, b a, a b, ...; medians and the pairs' ratios
    from the clock; the switch left at the first way."""
    from specdec.bench import timing

    clock, way, order = [0.0], ["?"], []
    cost = {"fast": 1.0, "slow": 2.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def run():
        order.append(way[0])
        clock[0] += cost[way[0]] if way[0] in cost else 100.0

    def switch(w):
        way[0] = w

    r = timing.alternated(run, switch, ("fast", "slow"), 3)
    assert order == ["?", "fast", "slow", "slow", "fast", "fast", "slow"] and way[0] == "fast"
    assert r == {"a_s": 1.0, "b_s": 2.0, "median_pair_ratio": 0.5, "a_won": 1.0}
