"""Tokenizers: one per set of vocabulary files among the presets (loaded once, shared), and whether two
models tokenize exactly alike."""

from __future__ import annotations

import hashlib
import weakref
from pathlib import Path
from typing import Any

from specdec.errors import SpecDecError
from specdec.models.causal import LanguageModel

# Presets of one family ship the same tokenizer (the Qwen 0.5B draft and 1.5B target): loading a
# 150k-token tokenizer is a noticeable part of a short run, so it is loaded once per set of vocabulary
# files (keyed by their sha256; weakly held, so it goes with its last model). A folder whose chat template
# differs (the two Qwen GGUFs embed slightly different ones) gets a shallow copy with its own template:
# the copy shares the backend, so the draft's vocabulary check needs no comparison of the tables.
_VOCABULARY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                     "vocab.json", "merges.txt", "tokenizer.model")
_CHAT_TEMPLATE_FILE = "chat_template.jinja"
_preset_tokenizers: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _files_digest(folder: Path, files: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for file in files:
        path = folder / file
        if path.is_file():
            digest.update(file.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def preset_tokenizer(folder: Path, load_tokenizer: Any) -> Any:
    """The tokenizer of a preset folder, shared with an already loaded preset whose vocabulary files are
    byte-identical."""
    import copy

    folder = Path(folder)
    key = _files_digest(folder, _VOCABULARY_FILES)
    template = _files_digest(folder, (_CHAT_TEMPLATE_FILE,))
    shared = _preset_tokenizers.get(key)
    if shared is None:
        tokenizer = load_tokenizer(folder)
        tokenizer._specdec_template_digest = template
        _preset_tokenizers[key] = tokenizer
        return tokenizer
    if shared._specdec_template_digest == template:
        return shared
    tokenizer = copy.copy(shared)  # the same backend and vocabulary, this folder's chat template
    path = folder / _CHAT_TEMPLATE_FILE
    tokenizer.chat_template = path.read_text(encoding="utf-8") if path.is_file() else None
    tokenizer._specdec_template_digest = template
    return tokenizer


def same_vocabulary(target: LanguageModel, draft: LanguageModel) -> bool:
    """Whether two models tokenize exactly alike: same token list, same ids.

    Compares the models' vocabulary fingerprints, computed once per model (reading a large vocabulary
    is not free, so ``generate`` does not do it on every call).
    """
    if target.tokenizer is draft.tokenizer:
        return True
    backend = getattr(target.tokenizer, "backend_tokenizer", None)
    if backend is not None and backend is getattr(draft.tokenizer, "backend_tokenizer", None):
        return True  # one fast tokenizer's table, shared (presets of one family: see preset_tokenizer)
    return len(target.tokenizer) == len(draft.tokenizer) and target.vocabulary_fingerprint == draft.vocabulary_fingerprint


def check_same_vocabulary(target: LanguageModel, draft: LanguageModel) -> None:
    """A draft that proposes target tokens with probabilities (beam search) must share the target's vocabulary."""
    if not same_vocabulary(target, draft):
        raise SpecDecError(
            f"the draft {draft.name!r} does not share the target's vocabulary ({len(draft.tokenizer)} vs "
            f"{len(target.tokenizer)} tokens, or different ids): speculative beam search needs a draft with the "
            "same tokenizer, e.g. a smaller model of the same family, or prompt lookup"
        )
