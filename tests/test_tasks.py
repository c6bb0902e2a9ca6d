"""Benchmark tasks: the shipped data sets, the file formats users supply, output cleaning, prompt encoding."""

from __future__ import annotations

import json

import pytest

from specdec.tasks import (
    SUMMARIZATION_FILE, TRANSLATION_CORPUS_FILE, TRANSLATION_FILE, clean_code, clean_summary, clean_translation,
    encode_item, load_task,
)
from specdec.errors import SpecDecError
from tiny import load_tiny


def test_translation_set():
    task = load_task("translation")
    assert len(task.items) == 200
    assert len({i.id for i in task.items}) == 200
    for item in task.items:
        assert item.chat and item.reference and item.reference.strip()
        assert item.prompt.startswith("Translate the following English text into German")
        source = item.prompt.split("\n\n", 1)[1]
        assert len(source.split()) >= 6 and source[-1] in ".?!"
    assert task.metrics == ("bleu", "chrf")
    # The n-gram corpus holds none of the evaluated references.
    corpus = set(TRANSLATION_CORPUS_FILE.read_text(encoding="utf-8").splitlines())
    assert len(corpus) == 2000 and not corpus & {i.reference for i in task.items}
    assert len(load_task("translation", 7).items) == 7


def test_translation_file_records():
    records = [json.loads(line) for line in TRANSLATION_FILE.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 200
    assert all(set(r) == {"id", "source", "reference"} and r["source"].strip() and r["reference"].strip() for r in records)


def test_summarization_set():
    task = load_task("summarization")
    assert len(task.items) == 100
    for item in task.items:
        assert item.chat and item.prompt.startswith("Summarize the following text")
        text = item.prompt.split("\n\n", 1)[1]
        assert len(text) >= 700 and item.reference and 2 <= len(item.reference.split()) <= 20
    assert task.metrics == ("rouge1", "rouge2", "rougeL")
    records = [json.loads(line) for line in SUMMARIZATION_FILE.read_text(encoding="utf-8").splitlines()]
    assert all(r["license"] and r["source"].startswith("Debian manpages") for r in records)
    small = load_task("summarization", 10)
    assert len(small.items) == 10 and small.corpus  # the 90 other pages are the n-gram corpus


def test_humaneval_task():
    task = load_task("humaneval", 5)
    assert [i.id for i in task.items] == [f"HumanEval/{k}" for k in range(5)]
    assert all(not i.chat and i.reference for i in task.items)
    assert task.corpus and task.corpus_source.startswith("prompts + canonical solutions of the 159 ")
    assert task.items[0].prompt not in task.corpus  # held out: the evaluated prompts are not in the corpus
    assert load_task("humaneval").corpus is None  # all 164 evaluated: nothing is held out


def test_jsonl_task(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "a b", "reference": "c", "id": "x"}\n\n{"prompt": "d", "reference": "e", "chat": true}\n'
                    '{"prompt": "f", "reference": "g"}\n')
    task = load_task(f"jsonl:{path}", 2)
    assert [(i.id, i.prompt, i.reference, i.chat) for i in task.items] == [("x", "a b", "c", False), ("mine.jsonl:2", "d", "e", True)]
    assert task.metrics == ("bleu", "chrf", "rougeL") and task.corpus == "f\ng"
    path.write_text('{"prompt": "only a prompt"}\n')
    assert load_task(f"jsonl:{path}").metrics == ()


@pytest.mark.parametrize("content, message", [
    ('{"text": "x"}\n', 'bad.jsonl, record 1: needs a non-empty string field "prompt"'),
    ("not json\n", "bad.jsonl, line 1: not JSON"),
    ("", "bad.jsonl holds no records"),
    ('{"prompt": "p", "reference": 3}\n', 'bad.jsonl, record 1: "reference" must be a string'),
])
def test_jsonl_task_bad(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(SpecDecError) as info:
        load_task(f"jsonl:{path}")
    assert message in str(info.value)


def test_wmt_files(tmp_path):
    src, ref = tmp_path / "newstest.en", tmp_path / "newstest.de"
    src.write_text("Hello world.\nGood morning.\n")
    ref.write_text("Hallo Welt.\nGuten Morgen.\n")
    task = load_task(f"wmt:{src},{ref}")
    assert [i.reference for i in task.items] == ["Hallo Welt.", "Guten Morgen."]
    assert task.items[0].prompt.endswith("Hello world.") and task.items[0].chat and task.metrics == ("bleu", "chrf")
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("One.\tEins.\nTwo.\tZwei.\n")
    assert [i.reference for i in load_task(f"wmt:{tsv}").items] == ["Eins.", "Zwei."]
    ref.write_text("Hallo Welt.\n")
    with pytest.raises(SpecDecError, match="lines"):
        load_task(f"wmt:{src},{ref}")


def test_cnndm_files(tmp_path):
    jsonl = tmp_path / "cnndm.jsonl"
    jsonl.write_text(json.dumps({"id": "a1", "article": "A long story.", "highlights": "Story.\nShort."}) + "\n")
    task = load_task(f"cnndm:{jsonl}")
    assert task.items[0].id == "a1" and task.items[0].reference == "Story. Short."
    assert task.items[0].prompt.startswith("Summarize the following news article") and task.metrics[0] == "rouge1"
    csv_path = tmp_path / "cnndm.csv"
    csv_path.write_text('id,article,highlights\nb2,"Text, with comma.",Sum.\n')
    assert load_task(f"cnndm:{csv_path}").items[0].prompt.endswith("Text, with comma.")
    jsonl.write_text('{"article": "x"}\n')
    with pytest.raises(SpecDecError, match="highlights"):
        load_task(f"cnndm:{jsonl}")


def test_unknown_task_and_missing_file(tmp_path):
    with pytest.raises(SpecDecError, match="unknown task"):
        load_task("poetry")
    with pytest.raises(SpecDecError, match="not found"):
        load_task(f"jsonl:{tmp_path / 'nope.jsonl'}")
    with pytest.raises(SpecDecError, match="number of prompts must be >= 1, got 0"):
        load_task("translation", 0)


def test_cleaning():
    assert clean_code("    return a + b\n\ndef other():\n    pass") == "    return a + b"
    assert clean_code("    x = 1\nprint(x)") == "    x = 1"
    assert clean_translation('\n  "Hallo Welt."\nThis translates to ...') == "Hallo Welt."
    assert clean_translation("„Guten Morgen.“") == "Guten Morgen."
    assert clean_summary(" one\n two  three ") == "one two three"


def test_encode_item_uses_the_chat_template_only_when_there_is_one():
    model = load_tiny("llama")
    item = load_task("translation", 1).items[0]
    plain = model.encode(item.prompt)
    assert encode_item(model, item) == plain  # the tiny tokenizer has no chat template
    model.tokenizer.chat_template = "{% for m in messages %}<s> {{ m['content'] }}{% endfor %}"
    assert encode_item(model, item) == model.encode(item.prompt, chat=True) != plain
