"""Quality metrics on known strings (sacrebleu BLEU / chrF, rouge-score ROUGE with stemming)."""

import pytest

from specdec.tasks.metrics import bleu, check_metric_libraries, chrf, rouge, score
from specdec.errors import SpecDecError

REF = ["the cat sat on the mat today", "a quick brown fox jumps over it"]


def test_identical_outputs_score_100():
    assert bleu(REF, REF) == pytest.approx(100.0)
    assert chrf(REF, REF) == pytest.approx(100.0)
    assert rouge(REF, REF) == pytest.approx({"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0})


def test_disjoint_outputs_score_0():
    hyps = ["xyz qqq", "www vvv"]
    assert bleu(hyps, REF) == pytest.approx(0.0)
    assert rouge(hyps, REF)["rouge1"] == pytest.approx(0.0)


def test_known_values():
    # ROUGE-1: "the cat" vs "the cat sat": precision 1, recall 2/3 -> F1 0.8; stemming maps "cats" to "cat".
    assert rouge(["the cat"], ["the cat sat"], ["rouge1"]) == {"rouge1": pytest.approx(80.0)}
    assert rouge(["cats"], ["cat"], ["rouge1"]) == {"rouge1": pytest.approx(100.0)}
    # BLEU of a 4-token output against itself plus one extra reference token: brevity penalty exp(1 - 5/4).
    import math

    assert bleu(["a b c d"], ["a b c d e"]) == pytest.approx(100 * math.exp(1 - 5 / 4), rel=1e-6)
    assert 0 < chrf(["Hallo Welt"], ["Hallo schöne Welt"]) < 100


def test_score_dispatch_and_errors():
    out = score(("bleu", "chrf", "rougeL"), REF, REF)
    assert list(out) == ["bleu", "chrf", "rougeL"] and all(v == pytest.approx(100.0) for v in out.values())
    with pytest.raises(SpecDecError, match="unknown metric"):
        score(("meteor",), REF, REF)
    with pytest.raises(SpecDecError, match="reference"):
        score(("bleu",), REF, [REF[0], None])
    with pytest.raises(SpecDecError, match="2 outputs but 1 references"):
        bleu(REF, REF[:1])


HAS_CLOSE_ELEMENTS = """\
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            if abs(numbers[i] - numbers[j]) < threshold:
                return True
    return False
"""


def test_humaneval_results_run_the_problems_tests():
    from specdec.tasks.metrics import humaneval_results

    # A generous timeout for the programs that finish: a loaded machine must not turn a pass into "timed out".
    results = humaneval_results({
        "HumanEval/0": HAS_CLOSE_ELEMENTS,  # a correct body
        "HumanEval/2": "    return number\n",  # truncate_number: wrong (must return the decimal part)
    }, timeout=60.0)
    assert results == {"HumanEval/0": "passed", "HumanEval/2": results["HumanEval/2"]}
    assert results["HumanEval/2"].startswith("failed")
    # A program that never returns times out whatever the machine's speed, so a short timeout is safe here.
    assert humaneval_results({"HumanEval/4": "    while True:\n        pass\n"}, timeout=0.5) == {"HumanEval/4": "timed out"}
    with pytest.raises(SpecDecError, match="not HumanEval task ids: HumanEval/999"):
        humaneval_results({"HumanEval/999": "pass"})


def test_a_missing_metric_library_is_named_before_anything_loads(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sacrebleu" else real_find_spec(name, *a))
    check_metric_libraries(("rouge1", "rougeL"))  # rouge-score is there
    with pytest.raises(SpecDecError, match=r"the task's metrics \(bleu, chrf\) need sacrebleu>=2.4, not installed: "
                                           r"pip install 'specdec\[bench\]' \(or pip install 'sacrebleu>=2.4'\)"):
        check_metric_libraries(("bleu", "chrf", "rouge1"))
