"""Task data: prompts, references, how outputs are cleaned and scored, n-gram corpora.

- :mod:`~specdec.tasks.catalog`: the built-in tasks (HumanEval, English-German translation, man-page
  summarization; shipped in ``data/`` or an installed package, nothing downloaded) and ``load_task``;
- :mod:`~specdec.tasks.files`: tasks read from files you supply (``jsonl:``, ``wmt:``, ``cnndm:``);
- :mod:`~specdec.tasks.metrics`: quality metrics (chrF, BLEU, ROUGE, HumanEval pass@1).

Used by ``specdec bench`` and ``specdec alpha``, and by the publishing pipeline (:mod:`specdec.publish`).
"""

from specdec.tasks.catalog import (
    BUILT_IN, HUMANEVAL_STOPS, SUMMARIZATION_FILE, TRANSLATION_CORPUS_FILE, TRANSLATION_FILE, Prompt, Task, TaskItem,
    clean_code, clean_summary, clean_translation, encode_item, has_chat_template, humaneval_path, load_humaneval,
    load_jsonl, load_task, ngram_corpus,
)

__all__ = ["BUILT_IN", "HUMANEVAL_STOPS", "SUMMARIZATION_FILE", "TRANSLATION_CORPUS_FILE", "TRANSLATION_FILE", "Prompt",
           "Task", "TaskItem", "clean_code", "clean_summary", "clean_translation", "encode_item", "has_chat_template",
           "humaneval_path", "load_humaneval", "load_jsonl", "load_task", "ngram_corpus"]
