"""specdec alpha: teacher-forced acceptance rates on tiny models against directly computed expectations."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from specdec import cli
from specdec import alpha
from specdec.sweeps.pool import ModelPool
from specdec.drafters import Draft, DrafterBase
from tiny import load_tiny, perturbed, tiny_model, tiny_tokenizer

PROMPTS = [("a", [1, 10, 11, 12, 13]), ("b", [1, 20, 21, 20, 21, 22]), ("c", [1, 5])]


@pytest.fixture(scope="module")
def target():
    return load_tiny("llama", sharp=3.0)


class FixedQ(DrafterBase):
    """Always the same distribution q (and its argmax as the token)."""

    name = "fixed-q"

    def __init__(self, q: torch.Tensor):
        self.q = q

    def propose(self, sequence, k):
        return Draft(torch.tensor([int(self.q.argmax())] * k), self.q.expand(k, -1))


class OneToken(DrafterBase):
    """Always proposes one token, without probabilities (a one-hot q)."""

    name = "one-token"

    def __init__(self, token: int):
        self.token = token

    def propose(self, sequence, k):
        return Draft(torch.tensor([self.token] * k), None)


class Silent(DrafterBase):
    name = "silent"

    def propose(self, sequence, k):
        return Draft.empty()


def target_p(target, generations, temperature):
    """The target's standardized distribution at every generated position, computed in one plain forward pass."""
    rows = []
    for g in generations:
        if g["temperature"] != temperature or not g["token_ids"]:
            continue
        prompt = dict(PROMPTS)[g["prompt"]]
        ids = torch.tensor([prompt + g["token_ids"]])
        with torch.no_grad():
            logits = target.hf_model(ids).logits[0].float()  # [L, V]
        n = len(g["token_ids"])
        rows.append(logits[len(prompt) - 1: len(prompt) - 1 + n])
    logits = torch.cat(rows)  # [positions, V]
    return logits if temperature == 0 else torch.softmax(logits / temperature, -1)


def by_draft(results):
    return {(r["draft"], r["temperature"]): r for r in results}


def test_target_as_its_own_draft_gives_alpha_1(target):
    results, generations = alpha.measure(target, {"self": target}, PROMPTS, [0.0, 1.0], max_new_tokens=10, seed=3)
    for r in results:
        positions = sum(g["new_tokens"] for g in generations if g["temperature"] == r["temperature"])
        assert r["alpha"] == pytest.approx(1.0, abs=1e-4) and r["coverage"] == 1.0 and r["positions"] == positions > 10


def test_known_q_gives_the_analytic_alpha(target):
    V = target.vocab_size
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(V, generator=g) * 2, -1)  # [V]
    drafts = {"fixed": FixedQ(q), "token7": OneToken(7), "silent": Silent()}
    results, generations = alpha.measure(target, drafts, PROMPTS, [0.0, 1.0], leniences=[1.0, 0.5], max_new_tokens=8,
                                         seed=1)
    r = by_draft(results)
    p1 = target_p(target, generations, 1.0)  # [n, V]
    assert r["fixed", 1.0]["alpha"] == pytest.approx(float(torch.minimum(p1, q).sum(-1).mean()), abs=1e-5)
    assert r["fixed", 1.0]["alpha_by_lenience"]["0.5"] == pytest.approx(
        float(torch.minimum(p1 / 0.5, q).sum(-1).clamp(max=1).mean()), abs=1e-5)
    # one-hot q: beta = p(x); with lenience l: min(1, p(x) / l)
    assert r["token7", 1.0]["alpha"] == pytest.approx(float(p1[:, 7].mean()), abs=1e-5)
    assert r["token7", 1.0]["alpha_by_lenience"]["0.5"] == pytest.approx(float((p1[:, 7] / 0.5).clamp(max=1).mean()), abs=1e-5)
    # temperature 0: beta is 1 exactly where the draft's token is the target's argmax
    logits0 = target_p(target, generations, 0.0)
    argmax = logits0.argmax(-1)
    assert r["fixed", 0.0]["alpha"] == pytest.approx(float((argmax == int(q.argmax())).float().mean()))
    assert r["token7", 0.0]["alpha"] == pytest.approx(float((argmax == 7).float().mean()))
    lenient = (torch.log_softmax(logits0, -1)[:, 7] - torch.log_softmax(logits0, -1).max(-1).values) >= torch.log(torch.tensor(0.5))
    assert r["token7", 0.0]["alpha_by_lenience"]["0.5"] == pytest.approx(float((lenient | (argmax == 7)).float().mean()))
    # a draft that proposes nothing: coverage 0, alpha 0
    assert r["silent", 1.0]["alpha"] == 0.0 and r["silent", 1.0]["coverage"] == 0.0


def test_random_draft_at_temperature_1_is_sum_min_p_uniform(target):
    results, generations = alpha.measure(target, {"random": "random"}, PROMPTS, [1.0], max_new_tokens=6, seed=2)
    p1 = target_p(target, generations, 1.0)
    expected = float(torch.minimum(p1, torch.full_like(p1, 1.0 / target.vocab_size)).sum(-1).mean())
    assert results[0]["alpha"] == pytest.approx(expected, abs=1e-5)


def test_perturbed_draft_between_0_and_1_and_deterministic(target):
    draft = perturbed(target, 0.5)
    a, _ = alpha.measure(target, {"d": draft}, PROMPTS, [1.0], max_new_tokens=8, seed=0)
    b, _ = alpha.measure(target, {"d": draft}, PROMPTS, [1.0], max_new_tokens=8, seed=0)
    assert 0.0 < a[0]["alpha"] < 1.0 and a[0]["alpha"] == b[0]["alpha"]


def parse(*argv):
    parser = argparse.ArgumentParser()
    alpha.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults():
    args = parse()
    assert args.drafts == ["qwen2.5-coder-0.5b", "unigram", "bigram", "prompt-lookup", "random"]
    assert args.temperatures == "0,1" and args.task == "humaneval" and args.ngram_corpus == "task"


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [("w1 w2 w3 w4", "w5 w6"), ("w5 w6 w7 w5 w6", "w7"), ("w9 w10", "w11"), ("w12 w13 w14", "w15 w16")]
    path.write_text("".join(json.dumps({"prompt": p, "reference": r}) + "\n" for p, r in rows))
    return path


def test_run_document_and_tables(target, prompts_file):
    pool = ModelPool("fp32", {"tiny-draft": perturbed(target, 0.3)})
    args = parse("--task", f"jsonl:{prompts_file}", "--n-prompts", "3", "--max-new-tokens", "6", "--drafts", "tiny-draft",
                 "unigram", "bigram", "prompt-lookup", "random", "tiny-draft<-bigram", "--leniences", "0.5,0.1")
    doc = alpha.run(args, target=target, pool=pool, progress=False)
    cfg = doc["config"]
    assert cfg["leniences"] == [1.0, 0.5, 0.1] and cfg["generated_with"] == "tiny-draft"
    assert cfg["ngram_corpus"].startswith("prompts + references of the 1 records") and cfg["ngram_corpus_tokens"] > 0
    assert len(doc["results"]) == 12 and len(doc["generations"]) == 6
    r = by_draft(doc["results"])
    for (name, temperature), row in r.items():
        assert 0.0 <= row["alpha"] <= 1.0 and row["positions"] > 0
        assert row["alpha_by_lenience"]["1.0"] == row["alpha"] <= row["alpha_by_lenience"]["0.1"] + 1e-9
    # the hierarchy's output follows its top model, so its alpha is the model's
    assert r["tiny-draft<-bigram", 1.0]["alpha"] == pytest.approx(r["tiny-draft", 1.0]["alpha"], abs=1e-6)
    assert r["unigram", 1.0]["coverage"] == 1.0 and r["prompt-lookup", 1.0]["coverage"] <= 1.0
    text = alpha.table(doc)
    assert text.startswith("| M_p | M_q | task | sampling | alpha |") and "Table 5" in text and "| l=0.5 |" in text
    json.dumps(doc)


def test_cli_alpha(tmp_path, prompts_file, capsys):
    folder = tmp_path / "model"
    tiny_model(eos=None).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    out_json = tmp_path / "alpha.json"
    code = cli.main(["alpha", "--target", str(folder), "--dtype", "fp32", "--drafts", str(folder), "prompt-lookup",
                     "--task", f"jsonl:{prompts_file}", "--n-prompts", "2", "--max-new-tokens", "5",
                     "--temperatures", "1", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("| M_p |")
    doc = json.loads(out[out.index("\n{") + 1:])
    assert json.loads(out_json.read_text()) == doc
    assert by_draft(doc["results"])[str(folder), 1.0]["alpha"] == pytest.approx(1.0, abs=1e-4)  # the target itself


def test_bad_options(target):
    from specdec.errors import SpecDecError

    with pytest.raises(SpecDecError, match="lenience"):
        alpha.run(parse("--leniences", "0,1"), target=target)
    with pytest.raises(SpecDecError, match="last"):
        alpha.run(parse("--drafts", "prompt-lookup<-bigram"), target=target)
