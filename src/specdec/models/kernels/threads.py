"""Threads of the CPU int8 models: in a decoding pass only the matrix kernels run in parallel.

torch runs an op in parallel when its tensor is large enough, and each parallel region wakes the threads
of its OpenMP pool. Those sleep between regions unless ``OMP_WAIT_POLICY=ACTIVE``, which ``import specdec``
sets when torch is not imported yet: not when a program imports torch first, nor where you chose
``PASSIVE`` (a machine shared with other busy processes, the test suite).

A decoding pass of an int8 model (a step, a verification block, a batch of rows) is about 110 int8
kernel calls and over a thousand small ops: an attention call per query row and layer (the block-invariant
attention), the rows' scaling around each kernel, the activation functions. Waking sleeping threads for
those small ops costs more than it gains. Measured with ``PASSIVE`` on the project's AMD EPYC (AVX-512,
2 threads, the 1.5B int8, one process alternating, 2026-11-26): a pass over 8 new tokens 138.5 ms with the
pool woken by every op, 111.8 ms with the small ops on one thread; one token 99.1 and 86.9 ms; 8 rows x 5
tokens 431 and 305 ms. With ``ACTIVE`` (spinning threads) it was 2-3% slower, so it is not used there.

So where the threads sleep, a forward pass of an int8 model at most :data:`SERIAL_WIDTH` tokens wide
runs with one thread (:func:`install` hooks the model), and the int8 kernels borrow the caller's threads
back (:func:`parallel_kernel`). A wider pass (a prefill) keeps torch's usual threads throughout. The
number of threads does not change the bits of a row: the int8 kernels accumulate in int32, and each
attention row is one call over its own shapes (tested bit for bit with 1 and 2 threads).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

import torch

#: Passes at most this many tokens wide (per row: a step, a verification block, a batch of rows) run serial
#: outside the kernels; a wider one (a prefill) runs as torch would.
SERIAL_WIDTH = 64

_state = threading.local()  # .threads: the caller's threads while a serial pass runs on this thread; .owner


def threads_sleep() -> bool:
    """Whether OpenMP's idle threads sleep: any ``OMP_WAIT_POLICY`` but ACTIVE (read when torch loaded OpenMP)."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() != "ACTIVE"


def kernel_threads() -> int | None:
    """The threads the kernels of the pass under way may use (None: not inside a serial pass)."""
    return getattr(_state, "threads", None)


class _Borrowed:
    """The caller's threads for one kernel call inside a serial pass."""

    def __init__(self, threads: int):
        self.threads = threads

    def __enter__(self) -> None:
        torch.set_num_threads(self.threads)

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads(1)


_UNCHANGED = contextlib.nullcontext()  # outside a serial pass (every int8 kernel call pays only this)


def parallel_kernel() -> contextlib.AbstractContextManager:
    """Inside a serial pass: run the enclosed kernel with the caller's threads; elsewhere: nothing changes."""
    threads = kernel_threads()
    return _UNCHANGED if threads is None else _Borrowed(threads)


def _width(args: tuple, kwargs: dict) -> int | None:
    """The tokens per row the pass feeds: input_ids [B, w] (or inputs_embeds [B, w, d])."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    return None if ids is None or ids.dim() < 2 else int(ids.shape[1])


def _enter(module: Any, args: tuple, kwargs: dict) -> None:
    _begin(module, _width(args, kwargs))


def _begin(module: Any, width: int | None) -> None:
    threads = torch.get_num_threads()
    if threads == 1 or kernel_threads() is not None or width is None or width > SERIAL_WIDTH:
        return
    _state.threads, _state.owner = threads, module
    torch.set_num_threads(1)


def _exit(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
    if getattr(_state, "owner", None) is module:
        torch.set_num_threads(_state.threads)
        _state.threads = _state.owner = None


@contextlib.contextmanager
def serial_pass(hf_model: Any, width: int) -> Iterator[None]:
    """Around a pass of ``width`` tokens per row run without calling ``hf_model`` (specdec.models.native.decoder_step):
    what :func:`install`'s hooks do around its forward."""
    if not getattr(hf_model, "_specdec_serial_passes", False):
        yield
        return
    _begin(hf_model, width)
    try:
        yield
    finally:
        _exit(hf_model, (), {}, None)


def install(hf_model: Any) -> None:
    """Run ``hf_model``'s short passes serial outside its kernels where OpenMP's threads sleep (once per model;
    the threads come back when the pass ends, also when it raises). With spinning threads waking them costs
    nothing and the small ops keep both (measured: serial was 2-3% slower there)."""
    if getattr(hf_model, "_specdec_serial_passes", False) or not threads_sleep():
        return
    hf_model.register_forward_pre_hook(_enter, with_kwargs=True)
    hf_model.register_forward_hook(_exit, with_kwargs=True, always_call=True)
    hf_model._specdec_serial_passes = True
