import contextlib
import json
import os
import sys
from pathlib import Path

# Threads that sleep between parallel regions (specdec's own default, ACTIVE, spins): two test workers and
# the servers and commands they start share two cores. Set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # for `tiny`

pytest_plugins = ["memory_report"]  # each test process's peak memory, printed after the tests


# Two torch threads in one process; one per process under pytest-xdist (`make test` runs two workers on
# two cores: more threads than cores makes OpenMP's spinning threads wait on each other).
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(THREADS)
    yield


@pytest.fixture(scope="module")
def tiny_pair():
    """A tiny Llama target and a perturbed copy of it as its draft (the bench and results tests' pair)."""
    from tiny import load_tiny, perturbed

    target = load_tiny("llama", sharp=4.0)
    return target, perturbed(target, 0.3)


@pytest.fixture()
def task_file(tmp_path):
    """A task of three (prompt, reference) rows as JSONL, in the tiny models' words."""
    path = tmp_path / "task.jsonl"
    rows = [("w1 w2 w3 w4", "w5 w6 w7"), ("w5 w6 w7 w8 w5 w6", "w7 w8"), ("w11 w12", "w13 w14")]
    path.write_text("".join(json.dumps({"prompt": p, "reference": r}) + "\n" for p, r in rows))
    return path


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# -- CUDA graphs, emulated on CPU -----------------------------------------------------------------------------


class ReplayByRunningAgain:
    """A CUDA graph's contract, on CPU: ``replay()`` recomputes the captured step from the same input
    buffers and writes the same output tensor, which the caller must copy before the next replay."""

    def __init__(self, run, pool=None):
        self.run = run
        self.pool = pool  # the memory pool it was captured into (an EmulatedPool)
        self.output = run()

    def replay(self):
        self.output.copy_(self.run())

    @classmethod
    def capture(cls, run, pool=None):
        graph = cls(run, pool)
        return graph, graph.output


class EmulatedPool:
    """Stands in for a CUDA graph memory pool handle: its identity says which graphs share one."""


@pytest.fixture
def emulated_graphs(monkeypatch):
    """CapturedStep's two CUDA calls replaced by ReplayByRunningAgain; every captured call recorded as
    (tokens asked, width of the graph that ran them)."""
    from specdec.models.sessions import graphs

    monkeypatch.setattr(graphs, "side_stream", contextlib.nullcontext)
    monkeypatch.setattr(graphs, "capture", ReplayByRunningAgain.capture)
    monkeypatch.setattr(graphs, "memory_pool", EmulatedPool)
    calls = []
    real_call = graphs.CapturedStep.__call__

    def recorded(self, tokens, start):
        calls.append((tokens.shape[0], self.width))
        return real_call(self, tokens, start)

    monkeypatch.setattr(graphs.CapturedStep, "__call__", recorded)
    return calls
