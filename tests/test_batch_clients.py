"""scripts/batch_clients.py's driver: C clients over the server's batch engine, each sending its next request as its
last finishes."""

import importlib.util
from pathlib import Path

from specdec.batch.engine import MODEL, BatchEngine
from specdec.config import GenerationConfig
from test_batching import PROMPTS
from tiny import load_tiny, perturbed

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "batch_clients.py"


def load_script():
    spec = importlib.util.spec_from_file_location("batch_clients", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_clients_keep_their_requests_in_flight_and_the_texts_are_plain_decodings():
    script = load_script()
    target = load_tiny(eos=None)
    engine = BatchEngine(target, perturbed(target, 0.05), max_batch=4)
    held, step = [], engine.step

    def counting_step():
        finished = step()
        held.append(len(engine.rows) + len(engine.waiting) + len(finished))  # requests in flight this round
        return finished

    engine.step = counting_step
    texts = {}
    for draft in (MODEL, None):
        held.clear()
        rate, texts[draft] = script.run(engine, PROMPTS[:5], 2, 9, draft, 0)
        assert rate > 0 and [len(t) for t in texts[draft]] == [9] * 5
        assert max(held) == 2 and held.count(2) > len(held) // 2  # two clients: never more than two, mostly two
    assert texts[MODEL] == texts[None]
    alone = []
    for prompt in PROMPTS[:5]:  # each text is its own prompt's, in the order the clients sent them
        row = engine.add(prompt, GenerationConfig(max_new_tokens=9), draft=None)
        engine.run()
        alone.append(row.output.token_ids)
    assert texts[None] == alone
