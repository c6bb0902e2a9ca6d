"""Fixed-shape forward steps on a static cache, run eagerly or replayed as captured CUDA graphs.

One step feeds w tokens at positions ``start .. start + w - 1`` and returns their logits [w, V].
Its shapes depend on w alone (:mod:`specdec.models.static_cache`), so on CUDA each width is
captured once per cache as a CUDA graph (optionally after ``torch.compile``) and replayed: the
draft's one-token step, its two-token catch-up, and the target's gamma + 1 verification pass cost
one graph launch each instead of hundreds of kernel launches. A request for a width that has no
graph yet uses the narrowest captured graph that is at least as wide (the extra tokens are padding:
they write stale cache entries past the sequence, which the mask hides and later writes overwrite),
else captures its own; one-token steps always have their own. The prefill and steps wider than
``MAX_GRAPH_WIDTH`` run eagerly.

Why not transformers' ``StaticCache`` with ``torch.compile(mode="reduce-overhead")``: its cache
advances an internal length on every call (re-running a step at the same positions, which is
what a rollback does, goes out of bounds), and its CUDA-graph trees hand out outputs that the
next replay overwrites. Here the positions are an explicit input and every output is copied out
before the next replay.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator

import torch

from specdec.models.static_cache import StaticKVCache

MAX_GRAPH_WIDTH = 64  # wider steps (a catch-up after plain steps, say) run eagerly
WARMUP_RUNS = 2  # eager runs on a side stream before capture (cuBLAS workspaces, compilation)


def static_step(hf_model: Any, cache: StaticKVCache, ids: torch.Tensor, start: torch.Tensor,
                n_logits: int = 0) -> torch.Tensor:
    """One forward pass of ``ids`` [1, w] at positions start + (0..w-1) (start: [1] long).

    Returns logits [w, V] (all rows; the last ``n_logits`` only when n_logits > 0).
    """
    width = ids.shape[1]
    positions = start + torch.arange(width, device=ids.device)  # [w]
    cache.positions = positions
    masks = cache.attention_masks(positions, cache.dtype)
    # Models with sliding-window layers take one mask per layer type; the others one 4-D mask.
    mask = masks if len(masks) > 1 else masks["full_attention"]
    out = hf_model(input_ids=ids, position_ids=positions[None], attention_mask=mask,
                   use_cache=True, logits_to_keep=n_logits, **{cache.keyword: cache})
    return out.logits[0]  # [w or n_logits, V]


class CapturedStep:
    """The step of one width on one cache, captured as a CUDA graph: fill ``ids``/``start``, replay."""

    def __init__(self, step: Callable[..., torch.Tensor], hf_model: Any, cache: StaticKVCache, width: int):
        self.width = width
        self.ids = torch.zeros(1, width, dtype=torch.long, device=cache.device)  # [1, w] static input
        self.start = torch.zeros(1, dtype=torch.long, device=cache.device)  # [1] static input
        self.compiled = step is not static_step  # False after a fallback from a failed compilation
        self._step, self._args = step, (hf_model, cache)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # [w, V] static output, overwritten by every replay

    def __call__(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [len(tokens), V] of ``tokens`` [k <= w] written at positions start.. (a copy)."""
        k = tokens.shape[0]
        self.ids[0, :k].copy_(tokens)
        self.start.fill_(start)
        if self.graph is None:
            self._capture()  # warm-up and capture run the real step, at the real positions
        self.graph.replay()
        return self.logits[:k].clone()

    def _run(self) -> torch.Tensor:
        return self._step(*self._args, self.ids, self.start)

    def _capture(self) -> None:
        with side_stream():
            try:
                self._run()
            except Exception as err:  # inductor could not compile this model: capture the eager step instead
                if not self.compiled:
                    raise
                warnings.warn(f"torch.compile failed for a {self.width}-token step ({type(err).__name__}: {err}); "
                              "capturing the eager step instead", RuntimeWarning, stacklevel=2)
                self._step, self.compiled = static_step, False
                self._run()
            for _ in range(WARMUP_RUNS - 1):
                self._run()
        self.graph, self.logits = capture(self._run)


@contextlib.contextmanager
def side_stream() -> Iterator[None]:
    """Run the block on a side CUDA stream, then make the current stream wait for it (warm-up before a
    capture must not run on the stream the graph is captured from)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream().wait_stream(side)


def capture(run: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
    """Capture ``run`` as a CUDA graph: (the graph, its static output, rewritten by every ``replay()``).

    This and :func:`side_stream` are the only CUDA calls of a captured step; tests on CPU stand in
    for both with a graph that replays by running again into the same output (``emulated_graphs`` in
    ``tests/conftest.py``), so the bookkeeping around them runs where CI does.
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = run()
    return graph, output


# Compiled steps of all widths and models share one dynamo cache (that of static_step's code): one
# entry per width and per shape of model and cache (architecture, size, capacity), reused by caches
# and models of one shape (weights and buffers are inputs). A model class first built after a step was
# compiled costs one more entry per width: transformers' output-capturing registry is a guarded global.
# Past torch's default of 8 entries dynamo would silently run the step eagerly.
RECOMPILE_LIMIT = 64


def compiled_step(backend: str = "inductor") -> Callable[..., torch.Tensor]:
    """``static_step`` compiled for fixed shapes (one compilation per width and architecture).

    Raises dynamo's recompile limit to at least RECOMPILE_LIMIT (a target, a draft, a few widths each).
    ``backend="eager"`` traces without generating code (tests use it: the same graphs, quickly).
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(static_step, dynamic=False, backend=backend)


def graph_for(cache: StaticKVCache, width: int,
              make: Callable[[StaticKVCache, int], CapturedStep]) -> CapturedStep | None:
    """The captured step to run ``width`` tokens with: the narrowest captured one >= width, else a new one
    of exactly ``width`` (None past MAX_GRAPH_WIDTH: run eagerly).

    A one-token step (plain decoding, a model draft) always gets its own graph: run padded in the
    verification's graph it would cost what gamma + 1 tokens cost (2.52 against 2.37 ms for the
    compiled 1.5B on an H100, k = 8 against 1), on every token.
    """
    wide_enough = [w for w in cache.graphs if w >= width and (w == width or width > 1)]
    if wide_enough:
        return cache.graphs[min(wide_enough)]
    if width > MAX_GRAPH_WIDTH:
        return None
    cache.graphs[width] = make(cache, width)
    return cache.graphs[width]
