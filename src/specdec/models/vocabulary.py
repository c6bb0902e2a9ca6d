"""Tokenizers: one per set of vocabulary files among the presets (loaded once, shared; where transformers
builds one in Python, its backend stored on first load and read back directly after), and whether two models
tokenize exactly alike."""

from __future__ import annotations

import hashlib
import types
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

# transformers 5 builds some tokenizers in Python: Qwen2Tokenizer's __init__ parses tokenizer.json with `json`
# for its vocabulary and merges and builds the backend from them (1.0-1.2 s of a Qwen preset's load on the
# AVX-512 EPYC, a sixth of a one-shot `specdec generate`). Such a class adds nothing to its base but that
# __init__, so the first load writes the backend it built into BACKEND_FOLDER, marked as a plain
# TokenizersBackend, which later loads read with one call into `tokenizers` (0.3-0.4 s): the same backend (its
# normalizer included), special tokens and chat template, checked when written.
BACKEND_FOLDER = "specdec_tokenizer"
_SOURCE_FILE = "specdec_source.json"


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
        source = {"vocabulary": key, "template": template, "transformers": _transformers_version()}
        tokenizer = _stored_backend(folder, source, load_tokenizer)
        if tokenizer is None:
            tokenizer = load_tokenizer(folder)
            _store_backend(folder, tokenizer, source, load_tokenizer)
        tokenizer._specdec_template_digest = template
        tokenizer._specdec_source = (folder, source)
        _preset_tokenizers[key] = tokenizer
        return tokenizer
    if shared._specdec_template_digest == template:
        _share_backend(shared._specdec_source, folder)
        return shared
    tokenizer = copy.copy(shared)  # the same backend and vocabulary, this folder's chat template
    path = folder / _CHAT_TEMPLATE_FILE
    tokenizer.chat_template = path.read_text(encoding="utf-8") if path.is_file() else None
    tokenizer._specdec_template_digest = template
    return tokenizer


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _rebuilt_in_python(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s class is a TokenizersBackend that only adds an ``__init__`` (one that builds the
    backend in Python): a TokenizersBackend reading the backend it built behaves the same."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - another transformers layout
        return False
    kind = type(tokenizer)
    own = [name for name, value in vars(kind).items()
           if isinstance(value, (types.FunctionType, property, classmethod, staticmethod))]  # (not `model = BPE`)
    return kind is not TokenizersBackend and kind.__bases__ == (TokenizersBackend,) and own == ["__init__"]


def _stored_backend(folder: Path, source: dict, load_tokenizer: Any) -> Any:
    """The tokenizer from ``folder``'s stored backend (:data:`BACKEND_FOLDER`), or None where there is none for
    these vocabulary files, this chat template and this transformers version."""
    import json

    stored = folder / BACKEND_FOLDER
    if not _holds(stored, source):
        return None
    try:
        if json.loads((stored / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class") == \
                "TokenizersBackend":  # what AutoTokenizer would pick, without importing its table of every model's
            from transformers.tokenization_utils_tokenizers import TokenizersBackend  # classes (0.3 s a process)

            return TokenizersBackend.from_pretrained(stored)
        return load_tokenizer(stored)
    except (OSError, ValueError):  # (none, or another process replacing it just now: load as before)
        return None


def _holds(stored: Path, source: dict) -> bool:
    """Whether the stored backend folder ``stored`` was made from ``source`` (vocabulary, chat template, transformers)."""
    import json

    try:
        return json.loads((stored / _SOURCE_FILE).read_text(encoding="utf-8")) == source
    except (OSError, ValueError):
        return False


def auto_tokenizer(folder: Path) -> Any:
    """``AutoTokenizer.from_pretrained(folder)``, transformers' auto classes imported only when called (the
    loader to give :func:`preset_tokenizer`: a stored backend does not need them)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers have the same backend, vocabulary, special tokens and chat template."""
    import json

    fields = ("all_special_tokens", "all_special_ids", "chat_template", "model_max_length", "padding_side",
              "truncation_side", "clean_up_tokenization_spaces", "add_bos_token", "add_eos_token")
    return (json.loads(a.backend_tokenizer.to_str()) == json.loads(b.backend_tokenizer.to_str()) and len(a) == len(b)
            and a.added_tokens_decoder == b.added_tokens_decoder
            and all(getattr(a, f, None) == getattr(b, f, None) for f in fields))


def _store_backend(folder: Path, tokenizer: Any, source: dict, load_tokenizer: Any) -> None:
    """Write ``tokenizer``'s backend into ``folder`` / :data:`BACKEND_FOLDER` where its class builds it in Python,
    if the stored form loads as the same tokenizer (else nothing is kept); a folder that cannot be written to
    (a read-only cache) is left as it is."""
    import json
    import os
    import shutil
    import tempfile

    if not _rebuilt_in_python(tokenizer):
        return
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{BACKEND_FOLDER}-", dir=folder))
        staging.chmod(0o755)  # (as the folder's other files: mkdtemp makes it private)
    except OSError:
        return
    try:
        (staging / "tokenizer.json").write_text(tokenizer.backend_tokenizer.to_str(), encoding="utf-8")
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["tokenizer_class"] = "TokenizersBackend"
        config["added_tokens_decoder"] = {  # (given here, transformers does not parse tokenizer.json in Python)
            str(i): {attr: getattr(t, attr) for attr in ("content", "lstrip", "rstrip", "normalized", "single_word",
                                                          "special")}
            for i, t in tokenizer.added_tokens_decoder.items()}
        (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        for name in (_CHAT_TEMPLATE_FILE, "special_tokens_map.json"):
            if (folder / name).is_file():
                shutil.copyfile(folder / name, staging / name)
        if not _same_tokenizer(load_tokenizer(staging), tokenizer):
            return
        (staging / _SOURCE_FILE).write_text(json.dumps(source), encoding="utf-8")
        shutil.rmtree(folder / BACKEND_FOLDER, ignore_errors=True)
        os.replace(staging, folder / BACKEND_FOLDER)
    except (OSError, ValueError):
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _share_backend(origin: tuple[Path, dict], folder: Path) -> None:
    """Give ``folder`` (a preset with the vocabulary files and chat template of ``origin``'s folder) a copy of the
    origin's stored backend where it has none: a later process that reads ``folder`` first (the CLI checks the
    target's prompt before loading the draft) then reads it without transformers' auto classes."""
    import os
    import shutil
    import tempfile

    source_folder, source = origin
    mine, theirs = folder / BACKEND_FOLDER, source_folder / BACKEND_FOLDER
    if _holds(mine, source) or not _holds(theirs, source):
        return
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{BACKEND_FOLDER}-", dir=folder))
    except OSError:
        return
    try:
        shutil.copytree(theirs, staging, dirs_exist_ok=True)
        staging.chmod(0o755)
        shutil.rmtree(mine, ignore_errors=True)  # (a stale one)
        os.replace(staging, mine)
    except OSError:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
