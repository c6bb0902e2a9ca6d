"""Fixed-shape forward steps on a static cache, run eagerly or replayed as captured CUDA graphs.

One step feeds w tokens at positions ``start .. start + w - 1`` and returns their logits [w, V].
Its shapes depend on w alone (:mod:`specdec.models.cache.static_cache`), so on CUDA a step is captured as a
CUDA graph (optionally after ``torch.compile``) and replayed: the draft's one-token step, its
two-token catch-up, and the target's gamma + 1 verification pass cost one graph launch each instead
of hundreds of kernel launches.

The capture plan (as in vLLM and gpt-fast): a fixed set of width buckets (``WIDTH_BUCKETS``: 1, 2, 4,
8, 16, 32). A step of w tokens runs in the narrowest bucket >= w (the extra tokens are padding: they
write stale cache entries past the sequence, which the mask hides and later writes overwrite). A
prepared model (:meth:`~specdec.models.causal.LanguageModel.prepare_steps`) fixes its cache capacity
and captures the buckets up to its widest planned step (every bucket unless told), largest first, into
one shared memory pool; after that nothing is ever captured in a generation: a step that has no graph
(wider than the plan, a long catch-up; a generation longer than the prepared capacity) runs eagerly. An
unprepared model captures a bucket on its first use. A prepared cache also holds captured prefill chunks
(``PREFILL_BUCKETS``, the eager step captured, not compiled): a prompt, or a catch-up wider than every step
bucket, that needs one row of logits runs through them; an unprepared cache prefills eagerly.

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

from specdec.models.cache.static_cache import StaticKVCache

WIDTH_BUCKETS = (1, 2, 4, 8, 16, 32)  # captured step widths; a narrower step runs padded in the next one
MAX_GRAPH_WIDTH = WIDTH_BUCKETS[-1]  # wider steps (a long catch-up after plain steps, say) run eagerly
WARMUP_RUNS = 2  # eager runs on a side stream before capture (cuBLAS workspaces, compilation)
# prefill widths, captured (never compiled) by a prepared model: a prompt runs in chunks of these instead of an
# eager pass (hundreds of kernel launches from Python: tens of ms a generation and a model on a GPU)
PREFILL_BUCKETS = (64, 128, 256, 512)


def static_step(hf_model: Any, cache: StaticKVCache, ids: torch.Tensor, start: torch.Tensor,
                n_logits: int | torch.Tensor = 0) -> torch.Tensor:
    """One forward pass of ``ids`` [1, w] at positions start + (0..w-1) (start: [1] long).

    Returns logits [w, V] (all rows; the last ``n_logits`` only when n_logits > 0; the rows a [r] long tensor
    names, [r, V], when it is one).
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

    def __init__(self, step: Callable[..., torch.Tensor], hf_model: Any, cache: StaticKVCache, width: int,
                 pool: Any = None):
        self.width = width
        self.pool = pool  # the memory pool the graph is captured into (shared by a model's graphs)
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
        self.graph, self.logits = capture(self._run, self.pool)


class CapturedPrefill(CapturedStep):
    """A prefill chunk of up to ``width`` tokens on one cache, captured as a CUDA graph (the eager step, never
    compiled: one capture per width, seconds): fill ``ids``/``start``/``last``, replay; logits [1, V] of the
    chunk's last real token. The padding after it writes stale entries past the sequence (masked, overwritten)."""

    def __init__(self, hf_model: Any, cache: StaticKVCache, width: int, pool: Any = None):
        super().__init__(static_step, hf_model, cache, width, pool)
        self.last = torch.zeros(1, dtype=torch.long, device=cache.device)  # [1] static input: the last real row

    def _run(self) -> torch.Tensor:
        return self._step(*self._args, self.ids, self.start, self.last)  # [1, V]

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture at positions 0.. (before any sequence uses the cache: what it writes is stale)."""
        self._capture()

    def __call__(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [1, V] after ``tokens`` [k <= w] written at positions start.. (a copy)."""
        self.last.fill_(tokens.shape[0] - 1)
        self.ids[0, : tokens.shape[0]].copy_(tokens)
        self.start.fill_(start)
        self.graph.replay()
        return self.logits.clone()


def prefill_chunks(cache: StaticKVCache, start: int, k: int) -> list[tuple[int, CapturedPrefill]]:
    """How to feed k tokens from position ``start`` through the cache's captured prefills: [(tokens, graph)] in
    order, each graph's padded width within the capacity; [] when they cannot cover all k (run eagerly)."""
    plan: list[tuple[int, CapturedPrefill]] = []
    while k > 0:
        fits = sorted(w for w in cache.prefills if start + w <= cache.capacity)
        if not fits:
            return []
        width = next((w for w in fits if w >= k), fits[-1])
        chunk = min(k, width)
        plan.append((chunk, cache.prefills[width]))
        start, k = start + chunk, k - chunk
    return plan


@contextlib.contextmanager
def side_stream() -> Iterator[None]:
    """Run the block on a side CUDA stream, then make the current stream wait for it (warm-up before a
    capture must not run on the stream the graph is captured from)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream().wait_stream(side)


def capture(run: Callable[[], torch.Tensor], pool: Any = None) -> tuple[Any, torch.Tensor]:
    """Capture ``run`` as a CUDA graph into the memory ``pool`` (None: a private one): (the graph, its static
    output, rewritten by every ``replay()``).

    This, :func:`side_stream` and :func:`memory_pool` are the only CUDA calls of a captured step; tests on
    CPU stand in for them with a graph that replays by running again into the same output
    (``emulated_graphs`` in ``tests/conftest.py``), so the bookkeeping around them runs where CI does.
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = run()
    return graph, output


def memory_pool() -> Any:
    """A CUDA graph memory pool: the graphs of one model share it. Graphs are captured largest first, so
    each narrower one reuses the memory the wider ones reserved (their replays never overlap)."""
    return torch.cuda.graph_pool_handle()


def bucket_for(width: int) -> int | None:
    """The narrowest bucket >= ``width`` (None: wider than every bucket, the step runs eagerly)."""
    return next((b for b in WIDTH_BUCKETS if b >= width), None)


def buckets_up_to(width: int | None) -> tuple[int, ...]:
    """The buckets a model captures when its widest step feeds ``width`` tokens: every bucket up to that
    step's, so each narrower step keeps its own (None, or a step wider than every bucket: all of them).
    With ``compile`` each bucket is an inductor compilation (about a minute for the 1.5B on an H100): the
    plan of a draft at gamma 4 compiles 1, 2, 4, 8 for the target and 1, 2 for a model draft, not 12."""
    top = bucket_for(width) if width is not None else None
    return WIDTH_BUCKETS if top is None else tuple(b for b in WIDTH_BUCKETS if b <= top)


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
    """The captured step to run ``width`` tokens with: that of its bucket (:func:`bucket_for`). A prepared
    cache never captures: a width without a graph returns None (run eagerly); an unprepared one captures
    the bucket on first use.

    A one-token step (plain decoding, a model draft) has its own bucket: run padded in the verification's
    graph it would cost what gamma + 1 tokens cost (2.52 against 2.37 ms for the compiled 1.5B on an
    H100, k = 8 against 1), on every token.
    """
    bucket = bucket_for(width)
    if bucket is None:
        return None
    step = cache.graphs.get(bucket)
    if step is None and not cache.prepared:
        step = cache.graphs[bucket] = make(cache, bucket)
    return step
