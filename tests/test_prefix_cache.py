"""The prefix cache across requests (specdec.batch.prefix_cache, the batch engine's prefix_cache_bytes): a request whose
prompt begins as a finished one's sequence reuses its keys and values, target and draft, and gets what an uncached
request gets, bit for bit (a block-invariant target); least recently used entries go first under the budget."""

import pytest
import torch

import specdec
from specdec.batch.engine import MODEL, BatchEngine
from specdec.config import GenerationConfig
from specdec.batch.prefix_cache import MIN_REUSE, PrefixCache
from specdec.models.kernels import int8_matmul
from specdec.models.native.row_attention import KERNEL_ATTRIBUTE
from test_batching import quantizations
from test_quantize import quantized_copy
from tiny import load_tiny, perturbed, tiny_gemma3

SYSTEM = [1] + [20 + i % 17 for i in range(30)]  # a shared "system prompt" of 31 tokens


def kv(n: int, value: float = 0.0, layers: int = 2):
    return [(torch.full((1, 2, n, 4), value), torch.full((1, 2, n, 4), value)) for _ in range(layers)]


def test_lookup_store_and_eviction_least_recently_used_first():
    per_token = 2 * 2 * (2 * 4 * 4)  # layers x (keys, values) x [1, 2, 1, 4] float32 (bytes a position)
    cache = PrefixCache(budget_bytes=2 * 40 * per_token)  # two entries of 40 positions
    a, b, c = list(range(40)), list(range(100, 140)), list(range(200, 240))
    assert cache.store(a, kv(40, 1.0)) and cache.store(b, kv(40, 2.0))
    hit = cache.lookup(a[:30] + [999])
    assert hit.length == 30 and torch.equal(hit.target[0][0], kv(40, 1.0)[0][0])  # the shared prefix only
    assert cache.lookup(a, limit=len(a) - 1).length == 39  # a token is always left to feed
    assert cache.lookup(a[: MIN_REUSE - 1]) is None  # too short to pay
    assert cache.store(c, kv(40, 3.0))  # over the budget: b, the least recently used, goes (a was looked up)
    assert cache.lookup(b) is None and cache.lookup(a).length == 40 and cache.evicted == 1
    assert not cache.store(list(range(500, 600)), kv(100))  # one entry over the whole budget: not kept
    assert cache.store(a + [7, 8], kv(42, 4.0))  # a sequence that extends an entry replaces it
    assert tuple(a) not in cache.entries and tuple(a + [7, 8]) in cache.entries  # (c made room: 42 + 40 > 80)
    assert cache.size <= cache.budget and cache.lookup(a + [7, 8, 9]).length == 42
    stored = kv(40, 5.0)
    cache.store(list(range(300, 340)), stored)
    stored[0][0].fill_(9.0)  # the engine's buffers go on being written: the cache keeps copies
    assert cache.lookup(list(range(300, 340))).target[0][0].max() == 5.0


def engine_outputs(target, draft, requests, budget, max_batch=2):
    """Each request (prompt ids, config) through one engine in turn; per request (first logits, output, cached)."""
    engine = BatchEngine(target, draft, max_batch=max_batch, prefix_cache_bytes=budget, speculation="rows")
    results = []
    for prompt, config in requests:
        row = engine.add(prompt, config)
        engine._join()
        first = row.carried.clone()  # the prompt's last logits, from its (partly cached) prefill
        engine.run()
        results.append((first, row.output))
    return results, engine


@pytest.mark.parametrize("method", quantizations())
def test_a_conversations_next_turn_reuses_the_last_one_bit_for_bit(method):
    """Turn 2's prompt is turn 1's sequence plus a new message: cached, its first logits and its tokens equal an
    uncached run's (torch.equal), after turn 1 rejected drafts (its caches rolled back in between)."""
    base = load_tiny(eos=None, hidden=128)
    target, draft = quantized_copy(base, method), quantized_copy(perturbed(base, 0.3), method)
    config = GenerationConfig(max_new_tokens=24, gamma=4)
    (first, turn1), = engine_outputs(target, draft, [(SYSTEM + [3, 4, 5], config)], 0)[0]
    assert turn1.stats.accepted < turn1.stats.drafted  # rejected drafts: rollbacks before the sequence was kept
    turn2 = SYSTEM + [3, 4, 5] + turn1.token_ids + [6, 7]
    sampled = GenerationConfig(max_new_tokens=20, gamma=3, temperature=1.0, seed=5)
    for budget in (0, 1 << 24):
        results, engine = engine_outputs(target, draft, [(SYSTEM + [3, 4, 5], config), (turn2, sampled)], budget)
        if budget == 0:
            uncached = results[1]
            assert engine.prefix_cache is None and uncached[1].stats.cached_tokens == 0
    first_cached, out = results[1]
    assert out.stats.cached_tokens == len(SYSTEM) + 3 + len(turn1.token_ids) - 1  # all but the newest tokens
    assert torch.equal(first_cached, uncached[0])
    assert out.token_ids == uncached[1].token_ids == specdec.generate(target, turn2, draft=draft, config=sampled).token_ids
    assert engine.prefix_cache.hits == 1


@pytest.mark.parametrize("method", quantizations())
def test_batched_rows_sharing_a_system_prompt_equal_their_generation_alone(method):
    """Rows joining a running batch (not alone) reuse the system prompt a finished row left; ragged lengths,
    plain and drafted rows; a small budget evicts as they go; every row equals specdec.generate."""
    base = load_tiny(eos=None, hidden=128)
    target, draft = quantized_copy(base, method), quantized_copy(perturbed(base, 0.05), method)
    prompts = [SYSTEM + [40 + i] * (1 + i % 3) for i in range(6)]
    configs = [GenerationConfig(max_new_tokens=8 + 3 * i, gamma=2 + i % 2) for i in range(6)]
    engine = BatchEngine(target, draft, max_batch=2, prefix_cache_bytes=1 << 20, speculation="rows")
    rows = [engine.add(p, c, draft=None if i == 3 else MODEL) for i, (p, c) in enumerate(zip(prompts, configs))]
    engine.run()
    alone = [specdec.generate(target, p, draft=None if i == 3 else draft, config=c)
             for i, (p, c) in enumerate(zip(prompts, configs))]
    assert [r.output.token_ids for r in rows] == [a.token_ids for a in alone]
    assert sum(r.output.stats.cached_tokens > 0 for r in rows) >= 3 and engine.prefix_cache.evicted == 0
    small = BatchEngine(target, draft, max_batch=2, prefix_cache_bytes=engine.prefix_cache.size // 3, speculation="rows")
    rows = [small.add(p, c) for p, c in zip(prompts, configs)]
    small.run()
    assert [r.output.token_ids for r in rows] == [a.token_ids for a in alone] and small.prefix_cache.evicted > 0
    assert small.prefix_cache.size <= small.prefix_cache.budget


def test_no_prefix_cache_where_a_reused_prefix_could_differ():
    """A float target (its passes round by their shape) and a sliding window (a one-pass prefill over the window
    rounds otherwise than a prefill and steps) keep no prefix cache."""
    assert BatchEngine(load_tiny(eos=None), None, prefix_cache_bytes=1 << 20).prefix_cache is None
    gemma = quantized_copy(tiny_gemma3(sliding_window=6, eos=None), "int8")
    assert BatchEngine(gemma, None, prefix_cache_bytes=1 << 20).prefix_cache is None
    llama = quantized_copy(load_tiny(eos=None, hidden=128), "int8")
    assert BatchEngine(llama, None, prefix_cache_bytes=1 << 20).prefix_cache is not None
    assert BatchEngine(llama, None).prefix_cache is None  # off unless asked (specdec serve asks: --prefix-cache)
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1)


@pytest.mark.skipif("fbgemm" not in int8_matmul.available(), reason="no fbgemm in this torch build")
def test_no_prefix_cache_or_chunks_for_an_int8_target_without_specdecs_kernels():
    """On fbgemm (no specdec kernels: SPECDEC_KERNELS=off, a failed build) a one-pass prefill is torch's causal SDPA
    and a later chunk's rows are not, so neither a kept prefix nor prefill chunks would give its bits."""
    before = int8_matmul._chosen
    int8_matmul.use("fbgemm")
    try:
        llama = quantized_copy(load_tiny(eos=None, hidden=128), "int8")
    finally:
        int8_matmul._chosen = before
    assert llama.block_invariant and getattr(llama.hf_model, KERNEL_ATTRIBUTE) is None
    engine = BatchEngine(llama, None, prefix_cache_bytes=1 << 20, prefill_chunk=16)
    assert engine.prefix_cache is None and engine.prefill_chunk == 0


def test_the_server_reports_cached_tokens_and_a_cached_turn_answers_as_a_fresh_one(monkeypatch):
    """specdec serve (its batch engine, --prefix-cache): a conversation's second turn reports the reused positions in
    usage.prompt_tokens_details.cached_tokens, OpenAI's field, and answers what a server without the cache does."""
    from starlette.testclient import TestClient

    from serving import wait_until
    from specdec import cli
    from specdec.cli import serve
    from specdec.serve.app import create_app

    base = load_tiny(eos=None, hidden=128)
    target, draft = quantized_copy(base, "int8"), quantized_copy(perturbed(base, 0.05), "int8")
    monkeypatch.setattr(serve, "load_models", lambda args, tokenizer=None: (target, draft))
    turn1 = SYSTEM + [3, 4]
    answers = {}
    for size in ("0", "64"):
        args = cli.build_parser().parse_args(["serve", "--target", "tiny", "--max-batch", "2", "--prefix-cache", size])
        with TestClient(create_app(lambda: cli.load_served(args), max_batch=2)) as http:
            wait_until(lambda: http.get("/health").status_code == 200, 60, "the server to be ready")
            first = http.post("/v1/completions", json={"model": "tiny", "prompt": turn1, "max_tokens": 12}).json()
            said = target.encode(first["choices"][0]["text"])[1:]  # (BOS dropped; the text need not give back its ids)
            second = http.post("/v1/completions", json={"model": "tiny", "prompt": turn1 + said + [5, 6],
                                                        "max_tokens": 12}).json()
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        answers[size] = (second["choices"][0]["text"], second["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert answers["0"][1] == 0 and answers["64"][1] >= len(turn1)  # turn 1's prompt at least
    assert answers["64"][0] == answers["0"][0]
    assert cli.main(["serve", "--prefix-cache", "-1"]) == 2
