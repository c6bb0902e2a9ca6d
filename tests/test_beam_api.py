"""Beam search through specdec.generate and the CLI (the algorithm itself: test_beam.py)."""

import json

import pytest
import torch

import specdec
from specdec import cli
from tiny import load_tiny, perturbed, tiny_model, tiny_tokenizer

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]


@pytest.fixture(scope="module")
def target():
    return load_tiny("qwen2", eos=None)


def test_generate_with_beams_equals_transformers_and_exact_speculative(target):
    plain = specdec.generate(target, PROMPT, num_beams=3, max_new_tokens=16)
    with torch.inference_mode():
        hf = target.hf_model.generate(torch.tensor([PROMPT]), num_beams=3, do_sample=False, max_new_tokens=16)
    assert plain.token_ids == hf[0, len(PROMPT):].tolist()
    spec = specdec.generate(target, PROMPT, draft=perturbed(target, 0.05), num_beams=3, draft_beams=4, gamma=3,
                            max_new_tokens=16)
    assert spec.token_ids == plain.token_ids
    assert spec.extra["beam"]["exact"] is True and spec.stats.exact
    assert spec.stats.target_calls <= plain.stats.target_calls


def test_report_mode_is_labelled_approximate(target):
    out = specdec.generate(target, PROMPT, draft=perturbed(target, 0.05), num_beams=2, beam_mode="report",
                           max_new_tokens=8, seed=0)
    assert out.extra["beam"]["exact"] is False and not out.stats.exact
    assert len(out.token_ids) == 8


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_beams": 0}, "num_beams must be an integer >= 1"),
        ({"num_beams": 3, "draft_beams": 2}, "draft_beams must be an integer >= num_beams \\(3\\)"),
        ({"num_beams": 2, "top_p": 0.9}, "beam search \\(num_beams=2\\) does not support top_p < 1"),
        ({"num_beams": 2, "temperature": 1.0}, "does not support temperature > 0"),
        ({"num_beams": 2, "gamma_schedule": "adaptive"}, "does not support gamma_schedule=adaptive"),
        ({"num_beams": 2, "beam_mode": "fast"}, "beam_mode must be 'exact' or 'report'"),
    ],
)
def test_bad_beam_options(target, options, message):
    with pytest.raises(specdec.SpecDecError, match=message):
        specdec.generate(target, PROMPT, draft="bigram", **options)


def test_cli_num_beams(tmp_path, capsys):
    tiny_model(kind="llama", eos=None).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    code = cli.main(["generate", "w1 w2 w3 w4", "--target", str(tmp_path), "--draft", str(tmp_path), "--dtype", "fp32",
                     "--num-beams", "3", "--draft-beams", "3", "--max-new-tokens", "8", "--json"])
    doc = json.loads(capsys.readouterr().out)
    model = specdec.load(str(tmp_path), dtype="fp32")
    plain = specdec.generate(model, "w1 w2 w3 w4", num_beams=3, max_new_tokens=8)
    assert code == 0 and doc["token_ids"] == plain.token_ids and doc["extra"]["beam"]["mode"] == "exact"
    code = cli.main(["generate", "w1 w2", "--target", str(tmp_path), "--num-beams", "2", "--draft-beams", "1"])
    assert code == 2 and "draft_beams must be" in capsys.readouterr().err
