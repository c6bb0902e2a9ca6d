"""The results generator (specdec results) end to end on tiny models: every part, RESULTS.md, figures."""

from __future__ import annotations

import argparse
import json

import pytest

from specdec import cli
from specdec.publish import results
from specdec.sweeps.pool import ModelPool
from specdec.models.quantized.quantize import quantize_model
from tiny import load_tiny, perturbed


def parse(*argv):
    parser = argparse.ArgumentParser()
    results.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_plan_quick_and_full():
    quick = results.plan(parse("--quick"))
    full = results.plan(parse())
    assert [s.kind for s in quick] == ["alpha"] * 3 + ["speed"] * 3 + ["extension", "beam"]
    assert [s.kind for s in full] == ["alpha"] * 3 + ["speed"] * 3 + ["extension", "beam", "beam"]
    ext = next(s for s in full if s.kind == "extension")
    command = ext.command(results.Path("docs"))
    assert command.startswith("specdec bench ") and "'qwen2.5-coder-0.5b<-prompt-lookup'" in command
    assert "--gamma-schedules constant,heuristic,adaptive,confidence" in command and "--leniences 1,0.5" in command
    beams = [s.options for s in full if s.kind == "beam"]
    assert [b["task"] for b in beams] == ["translation", "summarization"] and all(b["widths"] == [3, 5] for b in beams)
    alpha_step = quick[0]
    assert "qwen2.5-coder-0.5b:int8" in alpha_step.argv and "random" in alpha_step.argv
    assert "qwen2.5-coder-0.5b:int8" not in results.plan(parse("--quick", "--no-int8-draft"))[0].argv
    assert [s.kind for s in results.plan(parse("--parts", "alpha,beam", "--tasks", "translation"))] == ["alpha", "beam"]


def test_dry_run_prints_the_commands(capsys):
    assert cli.main(["results", "--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("specdec alpha ") == 3 and out.count("specdec bench ") == 4


def test_generate_on_tiny_models(tmp_path, task_file):
    target = load_tiny("llama", sharp=4.0)
    draft = perturbed(target, 0.3)
    draft_int8 = perturbed(target, 0.3)
    quantize_model(draft_int8, "int8")
    pool = ModelPool("fp32", {"tiny-draft": draft, "tiny-draft:int8": draft_int8})
    out = tmp_path / "docs"
    args_list = ["--quick", "--out", str(out), "--target", "tiny", "--draft", "tiny-draft", "--dtype", "fp32",
                 "--tasks", f"jsonl:{task_file}", "--n-prompts", "2", "--max-new-tokens", "6"]
    args = parse(*args_list)
    result = results.generate(args, pool=pool, target=target, progress=False)

    text = (out / "RESULTS.md").read_text()
    for heading in ("## Machine", "## Summary", "## 1. Acceptance rate alpha", "## 2. Speed and the Theorem 8",
                    "## 3. Fixed gamma vs gamma schedules", "## 4. Speculative beam search", "## 5. Figures",
                    "## 6. Theorem 8 checks"):
        assert heading in text
    assert "specdec results --quick" in text and "specdec alpha " in text and "specdec bench " in text
    assert "| EXP (Theorem 8) | EMP (measured) |" in text and "Best fixed gamma" in text
    assert "measured speedups are within ±15%" in text
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert "figure2_expected_tokens.png" in figures and any(n.startswith("speedup_vs_gamma") for n in figures)
    for name in figures:
        assert f"figures/{name}" in text
    raw = {p.name for p in (out / "results").iterdir()}
    assert {"alpha_jsonl_task.jsonl.json", "speed_jsonl_task.jsonl", "extension_jsonl_task.jsonl"} <= raw
    beam = dict(result["steps"])["beam_jsonl_task.jsonl"]
    assert "skipped" not in beam and not any("error" in r for r in beam["rows"]), beam
    # exact speculative beam search must equal plain beam search, at every width of the quick plan
    exact = [r for r in beam["rows"] if r["mode"] == "exact"]
    assert exact and all(r["identical_to_plain_beam"] == "2/2" for r in exact), beam["rows"]
    assert {r["mode"] for r in beam["rows"]} == {"plain", "exact", "report"}
    assert "| beams w | mode |" in text and "Skipped: " not in text

    # --resume: every step's output is there with the same settings, so nothing is measured again
    def must_not_run(*a, **k):
        raise AssertionError("a step ran again under --resume")

    import specdec.bench as bench_module
    from specdec import alpha as alpha_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(alpha_module, "run", must_not_run)
        mp.setattr(bench_module, "run", must_not_run)
        mp.setattr(results, "run_beam", must_not_run)
        again = results.generate(parse(*args_list, "--resume"), pool=pool, target=target, progress=False)
    assert len(again["summary"]["reused"]) == len(result["steps"]) and "ran with `--resume`" in again["markdown"]
    assert "specdec results --quick" in again["markdown"] and "--resume`" not in again["markdown"].split("\n")[2]
    # a step whose recorded settings differ is measured again
    step = results.plan(parse(*args_list))[0]
    assert results._previous(step, out) is not None
    step.argv.append("--seed-changed")
    assert results._previous(step, out) is None


def test_results_keeps_unit_records_and_a_rerun_resumes_from_them(tmp_path):
    """--records: the alpha and bench steps' units are kept once; the same command again reads them back
    and runs no unit (a long sweep cut short resumes where it stopped)."""
    from specdec.sweeps import execution

    target = load_tiny("llama", sharp=3.0)
    pool = ModelPool("fp32", {"tiny": target, "tiny-draft": perturbed(target, 0.3)})
    task_file = tmp_path / "task.jsonl"
    task_file.write_text("".join(json.dumps({"prompt": p, "reference": r}) + "\n"
                                 for p, r in (("w1 w2 w3", "w4 w5"), ("w6 w7 w8 w6", "w7 w8"))))
    records = tmp_path / "units"
    args_list = ["--quick", "--out", str(tmp_path / "docs"), "--target", "tiny", "--draft", "tiny-draft", "--dtype",
                 "fp32", "--tasks", f"jsonl:{task_file}", "--n-prompts", "2", "--max-new-tokens", "6", "--parts",
                 "alpha,speed", "--no-int8-draft", "--shard-size", "1", "--records", str(records)]
    first = results.generate(parse(*args_list), pool=pool, target=target, progress=False)
    kept = sorted(p.name for p in records.iterdir())
    assert any(n.startswith("alpha-") for n in kept) and any(n.startswith("bench-") for n in kept)
    assert len([n for n in kept if n.startswith("bench-") and "-prompts-" in n]) == 2 * 2  # 2 temperatures x 2 shards

    assert "Steps measured on other machines or code" not in first["markdown"]
    # one unit as if another machine had measured it (a stored sweep resumed elsewhere): RESULTS.md says so
    elsewhere = sorted(records.glob("bench-*-prompts-t0-p0-0.jsonl"))[0]
    moved = [{**r, "machine": {"cpu": "Other CPU", "cpu_kind": "AVX2 only", "date": "2026-11-26T00:00:00+00:00"}}
             for r in map(json.loads, elsewhere.read_text().splitlines())]
    elsewhere.write_text("".join(json.dumps(r) + "\n" for r in moved))

    def must_not_run(unit):
        raise AssertionError(f"unit {unit.id} ran again")

    real_execute = execution.execute

    def execute_without_running(units, run, **kwargs):
        return real_execute(units, must_not_run, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        import specdec.alpha
        import specdec.bench.runner

        mp.setattr(specdec.alpha, "execute", execute_without_running)
        mp.setattr(specdec.bench.runner, "execute", execute_without_running)
        again = results.generate(parse(*args_list), pool=pool, target=target, progress=False)
    alpha_step = "alpha_jsonl_task.jsonl"
    assert dict(again["steps"])[alpha_step]["results"] == dict(first["steps"])[alpha_step]["results"]
    assert "Steps measured on other machines or code" in again["markdown"]
    assert "Other CPU (AVX2 only), specdec version not recorded, 1 runs" in again["markdown"]
