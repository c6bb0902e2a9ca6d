"""specdec bench, full form: the grid (temperatures x drafts x gammas x schedules x lenience), Theorem 8
beside each measured speedup, quality, output files; on tiny models (fast)."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

import specdec.bench as bench
from specdec import cli
from specdec.analysis import theorem8
from specdec.publish.tables import write_outputs
from specdec.sweeps.pool import ModelPool
from specdec.drafters.spec import parse_spec
from specdec.errors import SpecDecError
from tiny import tiny_model, tiny_tokenizer


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_draft_specs():
    assert parse_spec("a:int8<-b<-prompt-lookup") == [("a", "int8", None), ("b", None, None), ("prompt-lookup", None, None)]
    assert parse_spec("/models/x:y") == [("/models/x:y", None, None)]
    assert parse_spec("/models/x@y:int8@300") == [("/models/x@y", "int8", 300)]  # only a last "@digits" is a cut
    for bad, message in (
        ("prompt-lookup<-a", "every level but the last must be a model; put 'prompt-lookup' last"),
        ("bigram:int8", "'bigram' has no weights to quantize"),
        ("a<-", "draft specification 'a<-' has an empty level"),
        ("", "empty draft specification ''"),
    ):
        with pytest.raises(SpecDecError) as info:
            parse_spec(bad)
        assert message in str(info.value), bad


def test_cells_and_labels():
    grid = bench.Grid([0.0], ["m", "prompt-lookup", "m<-bigram"], [2, 4], ["constant", "adaptive"], [1.0, 0.5])
    cells = bench.build_cells(list(bench.METHODS), grid, gamma=4)
    labels = [c.label for c in cells]
    assert labels[:4] == ["specdec-plain", "hf-plain", "llama-cpp", "llama-cpp-lookup"]
    assert "specdec-spec[m,gamma=2]" in labels and "specdec-spec[m<-bigram,gamma=4,adaptive]" in labels
    assert "specdec-spec[prompt-lookup,gamma=4,l=0.5]" in labels
    assert [c.label for c in cells if c.method == "hf-assisted"] == ["hf-assisted[m,gamma=4]", "hf-assisted[prompt-lookup,gamma=4]"]
    assert len([c for c in cells if c.method == "specdec-spec"]) == 3 * (2 + 1 + 1)
    one = bench.build_cells(list(bench.METHODS), bench.Grid([0.0], ["m"], [4], ["constant"], [1.0]), gamma=4)
    assert [c.label for c in one] == ["specdec-plain", "hf-plain", "llama-cpp", "llama-cpp-lookup", "specdec-spec",
                                      "hf-assisted"]
    # transformers' assisted generation with its own drafts (e.g. bf16) while specdec runs another (int8)
    own = bench.build_cells(list(bench.METHODS), bench.Grid([0.0], ["m:int8"], [4, 6], ["constant"], [1.0], ["m"]), gamma=6)
    assert [(c.method, c.draft, c.gamma) for c in own if c.method == "hf-assisted"] == [("hf-assisted", "m", 6)]
    assert [(c.draft, c.gamma) for c in own if c.method == "specdec-spec"] == [("m:int8", 4), ("m:int8", 6)]


def test_theory_factors_multiply_to_the_ratio():
    plain = {"new_tokens": 100, "seconds": 10.0, "tokens_per_second": 10.0}
    spec = {"new_tokens": 100, "seconds": 5.0, "tokens_per_second": 20.0, "target_calls": 40, "drafted": 150,
            "mean_accepted_length": 2.5, "time_target_s": 3.0, "time_draft_s": 1.5, "time_other_s": 0.3,
            "time_setup_s": 0.2}
    row = theorem8.compare(alpha=0.7, gamma=4, c=0.1, plain=plain, spec=spec, verify_cost_ratio=1.2)
    assert row["predicted"] == pytest.approx((1 - 0.7 ** 5) / (0.3 * 1.4))
    assert row["measured"] == pytest.approx(2.0)
    assert row["ratio"] == pytest.approx(row["tokens_factor"] * row["cost_factor"])
    assert row["within_tolerance"] is (abs(row["ratio"] - 1) <= 0.15)
    assert row["verify_per_call_s"] == pytest.approx(3.0 / 40) and row["other_per_call_s"] == pytest.approx(0.5 / 40)
    text = theorem8.explain(row)
    assert "Theorem 8" in text and ("OUTSIDE" in text) == (not row["within_tolerance"])
    if not row["within_tolerance"]:
        assert "tokens factor" in text and "cost factor" in text and "verification" in text
    assert theorem8.compare(alpha=None, gamma=4, c=0.1, plain=plain, spec=spec)["predicted"] is None


def test_grid_on_tiny_models(tiny_pair, task_file, tmp_path):
    target, draft = tiny_pair
    pool = ModelPool("fp32", {"tiny-draft": draft})
    args = parse("--task", f"jsonl:{task_file}", "--n-prompts", "2", "--max-new-tokens", "6", "--dtype", "fp32",
                 "--drafts", "tiny-draft", "prompt-lookup", "tiny-draft<-bigram", "--gammas", "2,3",
                 "--temperatures", "0,1", "--gamma-schedules", "constant,heuristic", "--leniences", "1,0.5",
                 "--gamma", "3", "--warmup", "0")
    result = bench.run(args, target=target, pool=pool, progress=False)

    assert set(result["by_temperature"]) == {"0", "1"}
    cfg = result["config"]
    assert cfg["temperatures"] == [0.0, 1.0] and cfg["gammas"] == [2, 3] and cfg["leniences"] == [1.0, 0.5]
    rows = result["rows"]
    spec = [r for r in rows if r["method"] == "specdec-spec"]
    assert len(spec) == 2 * 3 * (2 + 1 + 1)  # temperatures x drafts x (gammas + heuristic + lenience)
    assert {r["label"] for r in rows if r["method"] == "hf-assisted"} == {"hf-assisted[tiny-draft,gamma=3]",
                                                                          "hf-assisted[prompt-lookup,gamma=3]"}
    assert "hf-assisted[tiny-draft<-bigram]" in result["skipped"]
    for r in spec:
        assert "predicted_speedup" in r and "within_15pct" in r and "check" in r
    model_rows = [r for r in spec if r["draft"] == "tiny-draft" and r["schedule"] == "constant" and r["lenience"] == 1.0]
    for r in model_rows:
        assert r["c_source"] == "direct" and r["c"] == pytest.approx(result["costs"]["drafts"]["tiny-draft"]["c_direct"])
        assert r["predicted_speedup"] > 0 and 0.0 <= r["alpha"] <= 1.0 and r["mean_accepted_length"] >= 1.0
        assert r["quality"] and set(r["quality"]) == {"bleu", "chrf", "rougeL"}
    # exact configurations at temperature 0 give exactly plain decoding's tokens (fp32)
    for r in spec:
        if r["temperature"] == 0 and r["exact"]:
            assert r["identical_to_plain"] == "2/2", r["label"]
    hier = [r for r in spec if r["draft"] == "tiny-draft<-bigram" and r["schedule"] == "constant"]
    assert all(r["levels"] and r["levels"][0]["level"].startswith("tiny-llama-perturbed<-") for r in hier)
    assert result["costs"]["verify_cost_ratio"].keys() == {"2", "3"}
    assert result["step_costs"]["c_direct"] > 0  # the original layout, for the primary draft

    paths = write_outputs(result, tmp_path / "out")
    assert all(p.stat().st_size > 0 for p in paths.values())
    with open(paths["csv"], newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and "predicted_speedup" in table[0] and "quality_bleu" in table[0]
    md = paths["md"].read_text()
    assert "paper Table 2 form" in md and "| EXP (Theorem 8) | EMP (measured) |" in md and "Theorem 8 checks" in md
    assert "NOT exact" in md and "Hierarchies, per level" in md
    json.loads(paths["json"].read_text())


def test_cli_bench_out(tmp_path, task_file, capsys):
    folder = tmp_path / "model"
    tiny_model(eos=None).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    out = tmp_path / "results"
    code = cli.main(["bench", "--target", str(folder), "--drafts", str(folder), "--dtype", "fp32",
                     "--task", f"jsonl:{task_file}", "--n-prompts", "2", "--max-new-tokens", "6", "--warmup", "0",
                     "--methods", "specdec-plain,specdec-spec", "--gammas", "2,3", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and text.startswith("| method |")
    assert {p.name for p in out.iterdir()} == {"bench.json", "bench.csv", "bench.md", "runs.jsonl"}
    assert len((out / "runs.jsonl").read_text().splitlines()) == 2  # one line per prompt
    doc = json.loads((out / "bench.json").read_text())
    spec = [r for r in doc["rows"] if r["method"] == "specdec-spec"]
    assert [r["gamma"] for r in spec] == [2, 3] and all(r["alpha"] == pytest.approx(1.0) for r in spec)


def test_bad_grid_options(tiny_pair):
    target, _ = tiny_pair
    for argv, match in ((["--gammas", "0,2"], "gammas"), (["--temperatures", "x"], "numbers"),
                        (["--gamma-schedules", "fast"], "schedule"), (["--leniences", "1.5"], "lenience"),
                        (["--drafts", "prompt-lookup<-bigram"], "last"),
                        (["--hf-assisted-drafts", "m", "bigram"], "--hf-assisted-drafts takes model names .* got bigram")):
        with pytest.raises(SpecDecError, match=match):
            bench.run(parse(*argv), target=target, progress=False)
    with pytest.raises(SpecDecError, match="not both"):
        bench.run(parse("--prompts-file", "x.jsonl", "--task", "translation"), target=target, progress=False)


def test_theorem_8_c_of_a_draft_with_another_tokenizer():
    """Its c is per TARGET token proposed: its own passes per target token times a pass's c, plus the
    conversion between tokenizers in target steps."""
    from specdec.bench.aggregation import retokenized_c

    assert retokenized_c(0.1, 1.0, 0.0) == pytest.approx(0.1)  # one pass per target token, free conversion
    assert retokenized_c(0.1, 1.4, 0.02) == pytest.approx(0.16)


def test_batch_axis_runs_each_batch_size_and_predicts_theorem8_per_batch(tiny_pair, task_file):
    """--batch-sizes: every prompt through the batch engine at each B, plain and speculative (each constant gamma
    and each varying schedule); fp32 greedy rows equal plain's at the same B; Theorem 8 per B from the engine's own
    timers (a varying schedule has none: its drafted tokens a call instead)."""
    target, draft = tiny_pair
    pool = ModelPool("fp32", {"tiny-draft": draft})
    args = parse("--prompts-file", str(task_file), "--n-prompts", "3", "--max-new-tokens", "8", "--drafts", "tiny-draft",
                 "m<-bigram", "--gammas", "2,3", "--gamma-schedules", "constant,adaptive", "--gamma", "6",
                 "--methods", "specdec-plain,specdec-spec", "--batch-sizes", "1,2", "--warmup", "0", "--dtype", "fp32")
    pool.models["m"] = draft
    result = bench.run(args, target=target, pool=pool, progress=False)
    batch = result["batch"]["0"]
    got = {(r["batch"], r["label"]) for r in batch["rows"]}
    constant = ["specdec-spec[tiny-draft,gamma=2]", "specdec-spec[tiny-draft,gamma=3]"]
    adaptive = "specdec-spec[tiny-draft,gamma=6,adaptive]"
    # a hierarchy runs too: its top model drafts for the batch's rows (a lone row drafts with all of it)
    hierarchy = ["specdec-spec[m<-bigram,gamma=2]", "specdec-spec[m<-bigram,gamma=3]",
                 "specdec-spec[m<-bigram,gamma=6,adaptive]"]
    assert got == {(b, label) for b in (1, 2) for label in ["specdec-plain", *constant, adaptive, *hierarchy]}
    for r in batch["rows"]:
        assert r["new_tokens"] == 3 * 8 and r["tokens_per_second"] > 0
        if r["draft"] is not None:
            assert r["identical_to_plain"] == "3/3"  # exact: the same tokens as plain rows at the same B
            assert 0 <= r["alpha"] <= 1 and r["c_batch"] > 0 and r["speedup_vs_plain"] > 0
            if r["label"] in (adaptive, hierarchy[2]):
                assert r["predicted_speedup"] is None and r["verify_cost_ratio_batch"] is None
                assert 0 < r["drafted_per_call"] <= 6  # BatchGamma's choices, at most its start of 6
            else:
                assert r["verify_cost_ratio_batch"] > 0 and r["predicted_speedup"] > 0
                assert 0 < r["drafted_per_call"] <= r["gamma"]
    assert set(batch["stops_paying_at"]) == {*constant, adaptive, *hierarchy}
    assert not batch["skipped"]


def test_batch_theorem8_and_where_speculation_stops_paying():
    from specdec.bench.batch_axis import batch_rows

    def record(b, draft, tokens, seconds, target_time, draft_time=None, beta=(0, 0)):
        return {"record": "batch", "temperature": 1.0, "batch": b, "label": draft or "specdec-plain", "draft": draft,
                "gamma": 2 if draft else None, "tokens": [[0] * tokens], "seconds": seconds, "target_calls": 1,
                "beta_sum": beta[0], "beta_count": beta[1], "target_time": target_time, "draft_time": draft_time or {}}

    records = [record(1, None, 10, 1.0, {"1": 0.1}),
               record(1, "d", 12, 1.0, {"3": 0.15}, {"1": 0.01}, beta=(5, 10)),  # 1.2x
               record(4, None, 40, 1.0, {"4": 0.2}),
               record(4, "d", 36, 1.0, {"12": 0.3}, {"4": 0.02}, beta=(5, 10))]  # 0.9x
    out = batch_rows(records)
    rows = {(r["batch"], r["label"]): r for r in out["rows"]}
    # B = 4: c_B = 0.02 / 0.2, v_B = 0.3 / 0.2; E(0.5, 2) = 1.75; 1.75 / (2 x 0.1 + 1.5)
    assert rows[(4, "d")]["c_batch"] == pytest.approx(0.1) and rows[(4, "d")]["verify_cost_ratio_batch"] == pytest.approx(1.5)
    assert rows[(4, "d")]["predicted_speedup"] == pytest.approx(1.75 / 1.7)
    assert rows[(1, "d")]["predicted_speedup"] == pytest.approx(1.75 / (2 * 0.1 + 1.5))
    assert rows[(1, "d")]["speedup_vs_plain"] == pytest.approx(1.2) and rows[(4, "d")]["speedup_vs_plain"] == pytest.approx(0.9)
    assert out["stops_paying_at"] == {"d": 4}
    from specdec.publish.tables import batch_markdown

    text = batch_markdown({"batch": {"1": out}})
    assert "| 4 | d | 36.00 | 0.50 | 0.100 | 1.50 | 1.03 | 0.90 | – | –" in text  # (no drafted counts recorded)
    assert "- d: speculation stops paying at B = 4" in text
