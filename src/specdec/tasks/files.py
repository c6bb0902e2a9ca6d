"""Benchmark tasks read from files you supply (``--task KIND:PATH``); the built-in ones are in
:mod:`specdec.tasks`.

- ``jsonl:PATH``: one JSON object a line with ``prompt`` (required), ``reference``, ``id``/``task_id``,
  ``chat`` (true: wrap in the chat template; default false). With references: BLEU, chrF and ROUGE-L.
- ``wmt:SRC,REF``: a WMT test set as two line-aligned plain-text files, English source and German
  reference (what ``sacrebleu -t wmt14 -l en-de --echo src`` / ``--echo ref`` print), or ``wmt:FILE.tsv``
  with ``source<TAB>reference`` lines. Prompted and scored like ``translation``.
- ``cnndm:PATH``: CNN/DailyMail as JSONL (or CSV with a header) with the fields ``article`` and
  ``highlights`` (the Hugging Face ``cnn_dailymail`` field names; ``id`` optional). Prompted with
  "Summarize the following news article in three sentences" and scored with ROUGE like
  ``summarization``.

The items after the first n are held out as the n-gram corpus.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable

from specdec.tasks.catalog import (
    NEWS_PROMPT, Task, TaskItem, check_count, existing, held_out, jsonl_records, summarization, translation,
)
from specdec.errors import SpecDecError


def jsonl_task(path: str | Path, n: int | None = None) -> Task:
    check_count(n)
    path = existing(path)
    records = jsonl_records(path)
    items = []
    for number, record in enumerate(records, 1):
        prompt = record.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecDecError(f"{path}, record {number}: needs a non-empty string field \"prompt\"")
        reference = record.get("reference")
        if reference is not None and not isinstance(reference, str):
            raise SpecDecError(f"{path}, record {number}: \"reference\" must be a string")
        ident = str(record.get("task_id", record.get("id", f"{path.name}:{number}")))
        items.append(TaskItem(ident, prompt, reference, chat=bool(record.get("chat", False))))
    used, rest = items[:n], items[len(items[:n]):]
    corpus, corpus_source = held_out([i.prompt + "\n" + (i.reference or "") for i in rest], "prompts + references",
                                     "records", " (no held-out records)")
    with_refs = all(i.reference is not None for i in used)
    return Task(
        name=f"jsonl:{path.name}",
        source=f"{len(used)} prompts of {path}",
        items=used,
        metrics=("bleu", "chrf", "rougeL") if with_refs else (),
        metric_note="BLEU, chrF and ROUGE-L F1 vs the \"reference\" field" if with_refs else "no references: no quality metric",
        corpus=corpus,
        corpus_source=corpus_source,
        clean=lambda text: text.strip(),
    )


def _read_lines(path: Path) -> list[str]:
    return [line.rstrip("\n") for line in open(path, encoding="utf-8")]


def wmt_task(spec: str, n: int | None = None) -> Task:
    """``SRC,REF`` (line-aligned plain text) or ``FILE.tsv`` (source<TAB>reference)."""
    check_count(n)
    if "," in spec:
        src_path, ref_path = (existing(p) for p in spec.split(",", 1))
        sources, references = _read_lines(src_path), _read_lines(ref_path)
        if len(sources) != len(references):
            raise SpecDecError(f"wmt: {src_path} has {len(sources)} lines but {ref_path} has {len(references)}")
        label = f"{src_path.name} / {ref_path.name}"
    else:
        path = existing(spec)
        sources, references = [], []
        for number, line in enumerate(_read_lines(path), 1):
            if not line.strip():
                continue
            if "\t" not in line:
                raise SpecDecError(f"{path}, line {number}: expected source<TAB>reference")
            src, ref = line.split("\t", 1)
            sources.append(src)
            references.append(ref)
        label = path.name
    pairs = [(f"wmt:{i}", s, r) for i, (s, r) in enumerate(zip(sources, references)) if s.strip()]
    if not pairs:
        raise SpecDecError(f"wmt: {label} holds no sentence pairs")
    used, rest = pairs[:n], pairs[len(pairs[:n]):]
    corpus, corpus_source = held_out([r for _, _, r in rest], "references", "pairs")
    return translation(f"wmt:{label}", f"{len(used)} English -> German pairs of {label}", used, "the reference",
                       corpus, corpus_source)


def cnndm_task(path: str | Path, n: int | None = None) -> Task:
    check_count(n)
    path = existing(path)
    if path.suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            records = list(csv.DictReader(f))
    else:
        records = jsonl_records(path)
    rows = []
    for number, record in enumerate(records, 1):
        article, highlights = record.get("article"), record.get("highlights")
        if not isinstance(article, str) or not isinstance(highlights, str) or not article.strip():
            raise SpecDecError(f"{path}, record {number}: needs string fields \"article\" and \"highlights\"")
        rows.append((str(record.get("id", f"cnndm:{number}")), article.strip(), " ".join(highlights.split())))
    used, rest = rows[:n], rows[len(rows[:n]):]
    corpus, corpus_source = held_out([a + "\n" + h for _, a, h in rest], "articles + highlights", "records")
    return summarization(f"cnndm:{path.name}", f"{len(used)} CNN/DailyMail articles of {path}", used, NEWS_PROMPT,
                         "the highlights", corpus, corpus_source)


#: ``--task KIND:PATH`` -> the loader of that kind (``loader(PATH, n)``).
FILE_TASKS: dict[str, Callable[[str, int | None], Task]] = {"jsonl": jsonl_task, "wmt": wmt_task, "cnndm": cnndm_task}
