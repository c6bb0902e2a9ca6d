"""A GGUF model run by llama.cpp (llama-cpp-python, the optional extra ``specdec[llama]``), as a DRAFT.

llama.cpp's one-token step is the fastest on a CPU (the Qwen2.5-Coder 0.5B Q4_K_M: about 30 ms on an
AVX2 EPYC, against 86 ms for torch's int8), and with a block-invariant int8 target whose verification
costs little more than one step, the draft's single-token step decides the speed-up (Theorem 8: c).
A draft never changes the output, so llama.cpp's own arithmetic (its batched kernels are not
block-invariant) does not matter here; a llama.cpp model is refused as a target.

:class:`LlamaCppModel` answers what :class:`~specdec.drafters.model.ModelDrafter` asks of a model
(``start`` -> a session with ``prefill`` / ``extend`` / ``rollback``), so it drafts through the same
drafter as a torch model, hierarchies included. q comes from its logits exactly as for a torch draft;
rollback removes the forgotten positions from llama.cpp's KV cache (``llama_memory_seq_rm``), which is
bookkeeping there too.

In a draft specification: ``qwen2.5-coder-0.5b:llama-cpp`` (a preset's packaged GGUF) or
``/path/model.gguf:llama-cpp``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from specdec.errors import SpecDecError
from specdec.models.interface import Model

INSTALL = ("pip install 'specdec[llama]' (or pip install llama-cpp-python==0.3.36; it builds from source in "
           "about 4 minutes)")


def installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def extra_buffers_default(cpu_flags: Sequence[str], setting: str | None, amx_in_build: bool = True) -> bool:
    """Whether llama.cpp loads with its extra weight buffer types (AMX, repacked layouts): ``setting`` ("0" / "1")
    if given, else on unless the CPU has AMX and the llama.cpp build holds ggml's AMX kernel (``amx_in_build``:
    :func:`build_has_amx`), which crashed with SIGSEGV on the AMX Xeon. pip's build on such a CPU holds it; a build
    without it (docs/BENCHMARKING.md) runs the repacked layouts there, llama.cpp's fastest configuration on that
    CPU as on the AVX-512 EPYC (docs/cpu_default.md)."""
    value = (setting or "").strip()
    if not value:
        from specdec.models.kernels.cpu import has_amx

        return not (has_amx(cpu_flags) and amx_in_build)
    if value not in ("0", "1"):
        raise SpecDecError(f"SPECDEC_LLAMA_EXTRA_BUFFERS must be 0 or 1, not {setting!r}")
    return value == "1"


def build_has_amx() -> bool:
    """Whether the installed llama-cpp-python was compiled with ggml's AMX kernel (its system info says
    ``AMX_INT8 = 1``)."""
    import llama_cpp

    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def configuration(extra_buffers: bool | None = None) -> dict[str, Any]:
    """How llama.cpp runs in this process, for a benchmark to state beside its speed: llama-cpp-python's version,
    whether its build holds ggml's AMX kernel, and whether the extra buffer types are on (``extra_buffers``; None: as
    :func:`load_llama_cpp` decides)."""
    import llama_cpp

    amx = build_has_amx()
    if extra_buffers is None:
        extra_buffers = _extra_buffers(amx)
    return {"llama_cpp_python": llama_cpp.__version__, "amx_in_build": amx, "extra_buffer_types": extra_buffers}


def _extra_buffers(amx_in_build: bool) -> bool:
    from specdec.models.kernels.cpu import cpuinfo

    return extra_buffers_default(cpuinfo()[1], os.environ.get("SPECDEC_LLAMA_EXTRA_BUFFERS"), amx_in_build)


def load_llama_cpp(gguf: Path, n_ctx: int, threads: int, seed: int = 0, extra_buffers: bool | None = None,
                   draft_model: Any = None) -> Any:
    """A ``llama_cpp.Llama`` for ``gguf`` (quiet, ``threads`` threads for decoding and prompt; ``draft_model``:
    llama-cpp-python's own speculative draft, e.g. its ``LlamaPromptLookupDecoding``).

    extra_buffers: llama.cpp's extra weight buffer types (AMX, repacked layouts); None: as
    ``SPECDEC_LLAMA_EXTRA_BUFFERS`` (0 or 1) says, else :func:`extra_buffers_default`.
    """
    try:
        import llama_cpp
        from llama_cpp import llama_cpp as low_level  # where Llama() reads its default model parameters
    except ImportError:
        raise SpecDecError(f"llama.cpp needs llama-cpp-python: {INSTALL}") from None
    if extra_buffers is None:
        extra_buffers = _extra_buffers(build_has_amx())
    defaults = low_level.llama_model_default_params

    def model_params() -> Any:
        params = defaults()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = extra_buffers
        return params

    low_level.llama_model_default_params = model_params
    try:
        return llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               seed=seed, verbose=False, draft_model=draft_model)
    finally:
        low_level.llama_model_default_params = defaults


def has_gguf(target: str) -> bool:
    """Whether llama.cpp can run ``target`` (a preset name or a .gguf file)."""
    from specdec.models.formats.catalog import PRESETS

    return target in PRESETS or (target.endswith(".gguf") and Path(target).expanduser().is_file())


def target_gguf(target: Any) -> Path:
    """The GGUF file llama.cpp runs for ``target``: a preset's packaged file, or the ``.gguf`` path itself."""
    from specdec.models.formats.catalog import PRESETS
    from specdec.models.formats.presets import preset_gguf

    name = str(target if isinstance(target, str) else target.name)
    if not has_gguf(name):
        raise SpecDecError(
            f"llama-cpp needs the target as GGUF: {name!r} is neither a preset ({', '.join(PRESETS)}) nor a .gguf "
            "file; leave llama-cpp and llama-cpp-lookup out of --methods")
    return preset_gguf(name) if name in PRESETS else Path(name).expanduser()


class LlamaCppSession:
    """One sequence in llama.cpp's KV cache (sequence 0 of its context), with specdec's session calls."""

    def __init__(self, model: "LlamaCppModel"):
        self.model = model
        self.llm = model.llm
        self.length = 0
        self.forward_passes = 0
        self.last_pass_tokens = 0
        self.llm.reset()
        self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)

    def prefill(self, ids: Sequence[int]) -> torch.Tensor | None:
        if len(ids) == 0:
            return None
        return self.extend(ids, 1)[0]

    def extend(self, tokens: torch.Tensor | Sequence[int], n_logits: int = 1) -> torch.Tensor:
        """Feed ``tokens`` [k] after the cached positions; logits [n_logits, V] (float32, CPU) of the last ones."""
        ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]  # (CPU only)
        k = len(ids)
        if not 1 <= n_logits <= k:
            raise ValueError(f"asked for {n_logits} logits of {k} new tokens")
        llm, ctx, n_vocab = self.llm, self.llm._ctx, self.model.vocab_size
        if self.length + k > self.model.n_ctx:
            raise SpecDecError(f"{self.model.name} holds {self.model.n_ctx} positions; {self.length + k} asked")
        llm.n_tokens = self.length  # eval() forgets the cache from here on (llama_memory_seq_rm)
        if n_logits == 1:
            llm.eval(ids)  # in batches of n_batch; logits of the last token only
            rows = [ctx.get_logits_ith(-1)]
        else:  # a verifying level of a hierarchy: logits of several positions in one batch
            if k > llm.n_batch:
                raise SpecDecError(f"{self.model.name}: a pass of {k} tokens exceeds llama.cpp's batch of {llm.n_batch}")
            ctx.kv_cache_seq_rm(-1, self.length, -1)
            llm._batch.set_batch(batch=ids, n_past=self.length, logits_all=True)
            ctx.decode(llm._batch)
            llm.n_tokens = self.length + k
            rows = [ctx.get_logits_ith(j) for j in range(k - n_logits, k)]
        logits = torch.from_numpy(np.stack([np.ctypeslib.as_array(r, shape=(n_vocab,)) for r in rows]))  # a copy
        self.length += k
        self.forward_passes += 1
        self.last_pass_tokens = k
        return logits  # [n_logits, V]

    def rollback(self, length: int) -> None:
        if length < 0:
            raise ValueError(f"cannot roll back to a negative length {length}")
        if length < self.length:
            self.llm._ctx.kv_cache_seq_rm(-1, length, -1)
            self.length = length
            self.llm.n_tokens = length

    def close(self) -> None:
        return None


class LlamaCppModel(Model):
    """A GGUF model in llama.cpp with the tokenizer specdec compares against the target's."""

    quantization = "llama-cpp"
    engine = "llama.cpp"
    dtype = torch.float32
    device = torch.device("cpu")

    def __init__(self, gguf: str | Path, tokenizer: Any, name: str, n_ctx: int = 4096, threads: int | None = None):
        self.gguf = Path(gguf)
        self.tokenizer = tokenizer
        self.name = name
        self.n_ctx = n_ctx
        self.llm = load_llama_cpp(self.gguf, n_ctx, threads or torch.get_num_threads())
        self.vocab_size = int(self.llm.n_vocab())
        self._session: LlamaCppSession | None = None

    def __repr__(self) -> str:
        return f"LlamaCppModel({self.name!r}, {self.gguf.name})"

    @property
    def vocabulary_fingerprint(self) -> str:
        from specdec.models.causal import LanguageModel

        return LanguageModel.vocabulary_fingerprint.func(self)  # the same table hash as a torch model's

    @property
    def max_context(self) -> int:
        return self.n_ctx

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self.llm.token_eos()
        return {int(eos)} if eos is not None and eos >= 0 else set()

    def encode(self, text: str, chat: bool = False) -> list[int]:
        from specdec.models.causal import encode_text

        return encode_text(self.tokenizer, text, chat, self.name)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def start(self, prompt_ids: Sequence[int], max_positions: int | None = None) -> tuple[LlamaCppSession, list[int]]:
        """A fresh session (llama.cpp has one context: a new session forgets the previous one's cache)."""
        if max_positions is not None and max_positions > self.n_ctx:
            raise SpecDecError(f"{self.name} was loaded with a context of {self.n_ctx} positions; this generation "
                               f"may reach {max_positions}")
        self._session = LlamaCppSession(self)
        return self._session, list(prompt_ids)

    def prepare_steps(self, max_positions: int | None = None) -> list[int]:
        return []
