"""Task data: prompts, references, how outputs are cleaned and scored, n-gram corpora.

- :mod:`~specdec.tasks.catalog`: the built-in tasks (HumanEval, English-German translation, man-page
  summarization; shipped in ``data/`` or an installed package, nothing downloaded);
- :mod:`~specdec.tasks.files`: tasks read from files you supply (``jsonl:``, ``wmt:``, ``cnndm:``);
- :func:`load_task` (here): any of them by name or ``KIND:PATH``;
- :mod:`~specdec.tasks.metrics`: quality metrics (chrF, BLEU, ROUGE, HumanEval pass@1).

Used by ``specdec bench`` and ``specdec alpha``, and by the publishing pipeline (:mod:`specdec.publish`).
"""

from __future__ import annotations

from specdec.errors import SpecDecError
from specdec.tasks.catalog import (
    BUILT_IN, HUMANEVAL_STOPS, SUMMARIZATION_FILE, TRANSLATION_CORPUS_FILE, TRANSLATION_FILE, Prompt, Task, TaskItem,
    clean_code, clean_summary, clean_translation, encode_item, has_chat_template, humaneval_path, humaneval_task,
    load_humaneval, load_jsonl, ngram_corpus, summarization_task, translation_task,
)
from specdec.tasks.files import FILE_TASKS

__all__ = ["BUILT_IN", "HUMANEVAL_STOPS", "SUMMARIZATION_FILE", "TRANSLATION_CORPUS_FILE", "TRANSLATION_FILE", "Prompt",
           "Task", "TaskItem", "clean_code", "clean_summary", "clean_translation", "encode_item", "has_chat_template",
           "humaneval_path", "load_humaneval", "load_jsonl", "load_task", "ngram_corpus"]


def load_task(spec: str, n: int | None = None) -> Task:
    """A task by name (``humaneval``, ``translation``, ``summarization``) or ``KIND:PATH`` (``jsonl``,
    ``wmt``, ``cnndm``), keeping its first ``n`` items (all with None)."""
    if spec in ("humaneval", "code"):
        return humaneval_task(n)
    if spec == "translation":
        return translation_task(n)
    if spec == "summarization":
        return summarization_task(n)
    kind, _, rest = spec.partition(":")
    if rest and kind in FILE_TASKS:
        return FILE_TASKS[kind](rest, n)
    raise SpecDecError(
        f"unknown task {spec!r}; use one of {', '.join(BUILT_IN)}, or jsonl:PATH, wmt:SRC,REF (or wmt:FILE.tsv), "
        "cnndm:PATH"
    )
