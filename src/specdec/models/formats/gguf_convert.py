"""Converting a preset's GGUF file into a Hugging Face model folder, in the form its weights run in.

:func:`convert` writes the weights of one variant (:data:`specdec.models.formats.catalog.VARIANTS`) and, for a
new folder, the config, the generation config (with the preset's end-of-sequence ids) and the tokenizer
files with the chat template. transformers dequantizes the GGUF tensors; the int8 variants keep the
embedding table in its exact GGUF block form where that rebuilds the float32 values bit for bit.
:mod:`specdec.models.formats.presets` calls it once per variant, in a work folder, under a lock.
"""

from __future__ import annotations

import contextlib
import pathlib

from specdec.errors import SpecDecError
from specdec.models.formats.catalog import VARIANTS, Preset
from specdec.models.quantized.block_embedding import BLOCK  # values per float16 scale d in those types

__all__ = ["convert", "one_parse_per_file", "strip_gguf_quantization"]


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
def one_parse_per_file():
    """Within the block, every ``gguf.GGUFReader`` of one file is the same reader, parsed once.

    A conversion reads its GGUF four to five times (transformers' config, its weights, the tokenizer's
    config; the chat template and the exact blocks here), and gguf parses the whole metadata each time, one
    array element at a time: 18 s for Gemma 3's 262k-token vocabulary on a 2-core Xeon. The reader is
    read-only (a memory map), so one instance serves every caller. Reentrant; the first block ends it.
    """
    import gguf

    if getattr(gguf.GGUFReader, "shared_per_file", False):  # an outer block already shares them
        yield
        return
    original = gguf.GGUFReader
    readers: dict[tuple[str, str], object] = {}

    class SharedReader(original):
        shared_per_file = True

        def __new__(cls, path, mode="r"):
            key = (str(pathlib.Path(path).resolve()), mode)
            if key not in readers:
                reader = object.__new__(cls)
                original.__init__(reader, path, mode)
                readers[key] = reader
            return readers[key]

        def __init__(self, path, mode="r"):  # parsed in __new__, once per file
            pass

    gguf.GGUFReader = SharedReader
    try:
        yield
    finally:
        gguf.GGUFReader = original
        readers.clear()


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


def strip_gguf_quantization(model, dtype=None) -> None:
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


def convert_in_child(preset: Preset, gguf_path: pathlib.Path, out: pathlib.Path, progress: bool, *,
                     variant: str = "bf16", base: bool = True) -> None:
    """:func:`convert` in a child process (a fresh interpreter), so the process that goes on to generate never held
    the conversion's memory (up to 9.5 GB for the 1.5B): the first generation after a conversion ran at half the
    speed of later ones in the same process (8.0 against 15.7-19.6 tokens/s, Intel Xeon with AVX-512 VNNI and BF16,
    no AMX, 2026-12-02). Its errors are raised here as they were raised there; its progress bars write to the same
    terminal.

    The child is ``python -c`` on this module, not multiprocessing's spawn: spawn re-runs the caller's main script
    in the child, and a script without an ``if __name__ == "__main__"`` guard (the README's first example saved as
    a file) then loaded the preset again there and waited forever on the lock its parent held."""
    import os
    import pickle
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix=".convert-", dir=out.parent) as work:
        job = pathlib.Path(work) / "job.pickle"
        job.write_bytes(pickle.dumps((preset, gguf_path, out, progress, variant, base)))
        env = dict(os.environ)  # the child imports this specdec, wherever the caller found it
        root = str(pathlib.Path(__file__).resolve().parents[3])  # (src/specdec/models/formats/this file)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        code = "import sys; from specdec.models.formats.gguf_convert import _child; _child(sys.argv[1])"
        done = subprocess.run([sys.executable, "-c", code, str(job)], env=env)
        error = job.with_suffix(".error")
        if error.is_file():
            raise pickle.loads(error.read_bytes())
        if done.returncode:
            raise SpecDecError(f"converting model preset {preset.name!r} failed: its process exited with "
                               f"{done.returncode} (out of memory? it needs up to 9.5 GB for the 1.5B)")


def _child(job: str) -> None:
    """The child's side of :func:`convert_in_child`: run the pickled job; an error goes back pickled."""
    import pickle

    path = pathlib.Path(job)
    preset, gguf_path, out, progress, variant, base = pickle.loads(path.read_bytes())
    try:
        convert(preset, gguf_path, out, progress, variant=variant, base=base)
    except BaseException as err:  # (raised again in the parent, as it was raised here)
        try:
            blob = pickle.dumps(err)
        except Exception:
            blob = pickle.dumps(SpecDecError(f"{type(err).__name__}: {err}"))
        path.with_suffix(".error").write_bytes(blob)
        raise SystemExit(1)


def convert(
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
        one_parse_per_file(),
    ):
        bar.set_postfix_str("dequantizing weights")
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=dtype, **load_kwargs)
        strip_gguf_quantization(model, dtype)
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
            from specdec.models.quantized.int4 import int4_weights
            from specdec.models.formats.stored import save_quantized
            from specdec.models.quantized.quantize import quantized_weights

            model.config.save_pretrained(out)
            model.generation_config.save_pretrained(out)
            if variant in ("int4", "int4-mixed"):  # in the kernel's layout; the GGUF's Q4_K tensors exactly
                weights = int4_weights(model, True, gguf_path, mixed=variant == "int4-mixed")
            else:
                weights = quantized_weights(model, variant, free_floats=True)  # (nothing packed: only saved)
            save_quantized(model, out / VARIANTS[variant], variant, weights=weights,
                           blocks=_exact_blocks(model, gguf_path, skip=weights))
        del model
        if base:
            tokenizer.save_pretrained(out)
        bar.update()

        if base:
            bar.set_postfix_str("checking tokenizer")
            _ensure_chat_template(preset, out, template)
            bar.update()


#: GGUF types whose values are d * k (d: a float16 per block of BLOCK values, k: a small integer): float32
#: holds the product exactly, so int8 k and float16 d give the dequantized float32 tensor back bit for bit.
_SCALED_INT_TYPES = ("Q8_0", "Q5_0", "Q4_0")
#: Bytes of a block's scale d, the first field of each block.
SCALE_BYTES = 2
INT8_MIN, INT8_MAX = -128, 127


def _gives_back(weight, value, rows: int = 4096) -> bool:
    """Whether the Int4Weight ``weight`` dequantizes to the float32 tensor ``value`` bit for bit (``rows`` at a
    time: a whole 151,936-row table dequantized at once is several copies of 0.9 GB)."""
    import torch

    from specdec.models.quantized.int4 import Int4Weight

    for r in range(0, value.shape[0], rows):
        groups = slice(r // 32, (r + rows) // 32)
        part = Int4Weight(weight.packed[groups], weight.dmins[groups], weight.scs[groups],
                          min(rows, value.shape[0] - r), value.shape[1])
        if not torch.equal(part.dequantized(), value[r: r + rows]):
            return False
    return True


def _exact_blocks(model, gguf_path: pathlib.Path, skip=()) -> dict:
    """``{state key: (k int8 [rows, cols], d float16 [rows, cols // BLOCK])}`` for the float tensors of
    ``model`` (those a dynamic int8 model keeps in float32: the embedding table) that come from a
    Q8_0 / Q5_0 / Q4_0 GGUF tensor, and ``{state key: Int4Weight}`` for those from a Q4_K one, each checked to
    rebuild the float32 tensor exactly (else left out, and stored in float32): a quarter (an eighth) of the
    float32 bytes. The layers named in ``skip`` (those saved in int8) are not looked at.
    """
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize

    from specdec.models.kernels import extension
    from specdec.models.quantized.int4 import Int4Weight
    from specdec.models.formats.stored import expand_blocks

    tensors = GGUFReader(str(gguf_path)).tensors
    candidates = [t for t in tensors if t.tensor_type.name in _SCALED_INT_TYPES]
    # (Q4_K tables are laid out by specdec's extension: where it cannot run or build, they stay float32)
    q4k = [t for t in tensors if t.tensor_type.name == "Q4_K"] if extension.cpu_supported() else []
    found: dict = {}
    seen: set[int] = set()
    skipped = tuple(f"{name}." for name in skip)
    for key, value in model.state_dict().items():
        if skipped and key.startswith(skipped):
            continue
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or value.dim() != 2:
            continue
        if value.shape[1] % BLOCK or value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        for tensor in q4k:
            if tuple(int(n) for n in reversed(tensor.shape)) == tuple(value.shape):
                try:
                    weight = Int4Weight.from_q4k(np.asarray(tensor.data), *value.shape)
                except SpecDecError:  # the extension does not build here (no compiler): the table stays float32
                    break
                if _gives_back(weight, value):  # bit-identical to what transformers made
                    found[key] = weight
                    break
        if key in found:
            continue
        for tensor in candidates:
            if tuple(int(n) for n in reversed(tensor.shape)) != tuple(value.shape):
                continue
            raw = np.asarray(tensor.data).reshape(value.shape[0], -1)
            block_bytes = raw.shape[1] // (value.shape[1] // BLOCK)
            scales = np.ascontiguousarray(raw.reshape(value.shape[0], -1, block_bytes)[:, :, :SCALE_BYTES]).view(np.float16)
            d = torch.from_numpy(scales.reshape(value.shape[0], -1).copy())
            values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).reshape(value.shape).copy())
            with np.errstate(all="ignore"):
                ratio = values.view(value.shape[0], -1, BLOCK) / d.float().unsqueeze(-1)
            k = torch.nan_to_num(ratio, nan=0.0, posinf=0.0, neginf=0.0).round().clamp(INT8_MIN, INT8_MAX).to(torch.int8)
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
