"""Chunked prefill in the batch engine (specdec.batch.fill): a prompt joining running rows goes in a chunk a round,
so the running rows wait at most one chunk; every row still equals the same request alone, bit for bit (ragged
lengths, rows joining and leaving, model-drafted, plain and prompt-lookup rows, with the prefix cache), and a row
cancelled while its prompt goes in leaves the others untouched."""

import pytest

import specdec
from specdec.batch.engine import MODEL, BatchEngine
from specdec.config import GenerationConfig
from test_batching import quantizations
from test_quantize import quantized_copy
from tiny import load_tiny, perturbed

CHUNK = 3
SYSTEM = [1] + [20 + i % 17 for i in range(30)]  # a shared system prompt (the prefix cache keeps it)


def run_logged(engine: BatchEngine) -> list[tuple[int, int]]:
    """Step the engine to the end; per step (rows running when it began, prompt tokens fed in it)."""
    engine.fills, log = [], []
    while engine.busy:
        running, before = len(engine.rows), len(engine.fills)
        engine.step()
        log.append((running, sum(engine.fills[before:])))
    return log


@pytest.mark.parametrize("cache", [0, 1 << 20])
@pytest.mark.parametrize("method", quantizations())
def test_rows_joining_with_chunked_prompts_equal_their_generation_alone(method, cache):
    base = load_tiny(eos=None, hidden=128)
    target, draft = quantized_copy(base, method), quantized_copy(perturbed(base, 0.05), method)
    prompts = [SYSTEM + [40 + i] * (2 + 5 * (i % 3)) for i in range(7)]  # 33 to 43 tokens: many chunks each
    # two long rows run while the others join one after another, each its prompt in chunks beside them
    configs = [GenerationConfig(max_new_tokens=60 if i < 2 else 4 + 2 * i, gamma=2 + i % 2) for i in range(7)]
    drafts = [MODEL, None, "prompt-lookup", MODEL, MODEL, None, MODEL]
    engine = BatchEngine(target, draft, max_batch=3, prefix_cache_bytes=cache, speculation="rows",
                         prefill_chunk=CHUNK)
    assert engine.prefill_chunk == CHUNK
    rows = [engine.add(p, c, draft=d) for p, c, d in zip(prompts, configs, drafts)]
    log = run_logged(engine)
    alone = [specdec.generate(target, p, draft={MODEL: draft}.get(d, d), config=c)
             for p, c, d in zip(prompts, configs, drafts)]
    assert [r.output.token_ids for r in rows] == [a.token_ids for a in alone]
    # while rows ran, a round fed at most one chunk of prompt; prompts did go in beside running rows
    assert all(fed <= CHUNK for running, fed in log if running)
    if cache:  # the prefix cache beside the chunks: the system prompt kept, the rest fed in chunks
        assert sum(r.output.stats.cached_tokens > 0 for r in rows) >= 3
        assert sum(running > 0 and fed > 0 for running, fed in log) >= 3
    else:
        assert sum(fed for running, fed in log if running) > 3 * len(SYSTEM)


def test_a_row_cancelled_while_its_prompt_goes_in_leaves_the_others_as_they_were():
    base = load_tiny(eos=None, hidden=128)
    target = quantized_copy(base, "int8")
    engine = BatchEngine(target, None, max_batch=2, prefill_chunk=2)
    short = engine.add([1, 5, 6], GenerationConfig(max_new_tokens=20), draft=None)
    engine.step()  # it runs alone
    long = engine.add([1] + list(range(10, 40)), GenerationConfig(max_new_tokens=5), draft=None)
    engine.step()
    assert engine.filling is long and long.filled < len(long.sequence)
    engine.cancel(long, "the client left")
    engine.run()
    assert long.error is not None and long.output is None and engine.filling is None
    assert short.output.token_ids == specdec.generate(target, [1, 5, 6], max_new_tokens=20).token_ids


def test_a_float_target_prefills_in_one_pass():
    """A float target's passes round by their shape: chunks would change its bits, so it keeps one pass."""
    engine = BatchEngine(load_tiny(eos=None), None, max_batch=2, prefill_chunk=CHUNK)
    assert engine.prefill_chunk == 0


def test_the_server_option(capsys):
    from specdec import cli

    assert cli.main(["serve", "--prefill-chunk", "-1"]) == 2
    assert "--prefill-chunk is a number of tokens, >= 0 (0: a prompt in one pass), got -1" in capsys.readouterr().err
