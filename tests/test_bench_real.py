"""One smoke run of specdec alpha and the bench grid on a real packaged model (SmolLM2-135M, fp32):
2 prompts x 8 tokens of the translation task, the model as its own draft and prompt lookup."""

import argparse

import pytest

import specdec.bench as bench
from specdec import alpha
from specdec.sweeps.pool import ModelPool

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def pool():
    pool = ModelPool("fp32")
    pool.get(MODEL)
    return pool


def parse(module, *argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_alpha_smoke(pool):
    args = parse(alpha, "--target", MODEL, "--drafts", MODEL, "bigram", "prompt-lookup", "--task", "translation",
                 "--n-prompts", "2", "--max-new-tokens", "8", "--dtype", "fp32")
    doc = alpha.run(args, target=pool.get(MODEL), pool=pool, progress=False)
    assert doc["config"]["chat_template"] and doc["config"]["ngram_corpus_tokens"] > 10000
    rows = {(r["draft"], r["temperature"]): r for r in doc["results"]}
    assert rows[MODEL, 0.0]["alpha"] == pytest.approx(1.0) and rows[MODEL, 1.0]["alpha"] == pytest.approx(1.0, abs=1e-3)
    assert 0.0 <= rows["bigram", 1.0]["alpha"] < 1.0


def test_bench_grid_smoke(pool):
    args = parse(bench, "--target", MODEL, "--drafts", MODEL, "prompt-lookup", "--task", "translation",
                 "--n-prompts", "2", "--max-new-tokens", "8", "--gammas", "2", "--gamma", "2", "--temperatures", "0",
                 "--dtype", "fp32", "--warmup", "0")
    result = bench.run(args, target=pool.get(MODEL), pool=pool, progress=False)
    spec = [r for r in result["rows"] if r["method"] == "specdec-spec"]
    assert len(spec) == 2
    for r in spec:
        assert r["identical_to_plain"] == "2/2" and set(r["quality"]) == {"bleu", "chrf"}
    model_row = next(r for r in spec if r["draft"] == MODEL and r["temperature"] == 0)
    assert model_row["alpha"] == pytest.approx(1.0) and model_row["predicted_speedup"] is not None
