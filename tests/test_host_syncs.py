"""No host synchronization inside a decoding round but the one read-back (issue 15, point 4), checked on CPU.

On a GPU the host waits for the device whenever it reads a value computed there: a scalar (``.item()``,
``int(t)``, ``bool(t)``, a Python ``if`` on a tensor) or the result of an op whose output shape depends
on values (``nonzero``, boolean-mask indexing, ``unique``). One such read inside a round drains the
queue of kernels that the round is meant to keep full. On CPU the same reads reach PyTorch's
dispatcher as the same ops, so :class:`HostReads` counts them here, where CI runs; copies to the host
(``tolist``, ``cpu``, ``numpy``) do not reach it on CPU and are counted where they are called. The
loop's one intended read is :meth:`Verification.read` (one ``tolist`` of n, the tokens and the betas),
counted separately: it must happen once per round (and once per round of a hierarchy's level 1, which
verifies its own draft before it can go on).

Not covered, because their work is on the host by design: prompt lookup (it searches the host copy of
the sequence), a draft with another tokenizer (it decodes text), and the ``confidence`` schedule (it
reads the draft's top probability to decide whether to stop drafting).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec
from specdec.acceptance import Verification
from tiny import load_tiny, perturbed, tiny_gemma3

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]

# Ops that make the host wait for the device's result.
SYNCING_OPS = {
    "aten._local_scalar_dense.default",  # .item(), int(t), float(t), bool(t), `if t:`
    "aten.is_nonzero.default",
    "aten.equal.default",  # torch.equal returns a Python bool
    "aten.allclose.default",
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten._unique2.default",
    "aten.unique_consecutive.default",
    "aten.unique_dim.default",
    "aten.repeat_interleave.Tensor",
}
# Indexing with a boolean mask (t[mask], t[mask] = v): a nonzero underneath, on a GPU.
INDEX_OPS = {"aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default", "aten._index_put_impl_.default"}


def _has_mask(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


class HostReads(TorchDispatchMode):
    """Counts the host reads of device values made while it is active: {op name: count}."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in SYNCING_OPS or (name in INDEX_OPS and _has_mask(args[1])):
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class Uploads:
    """Counts host-to-device copies that specdec's own code makes: tensors built from host data for a device
    (``torch.tensor(..., device=...)``, ``torch.as_tensor(..., device=...)``) by a function of the specdec
    package. On a GPU each is a copy from host memory; on CPU the same calls are counted where they are
    made. (A tensor built on the host for host work, prompt lookup's search, is not an upload.)"""

    def __init__(self, monkeypatch):
        import sys

        self.calls: list[str] = []
        for name in ("tensor", "as_tensor"):
            real = getattr(torch, name)

            def counted(*args, _real=real, **kwargs):
                caller = sys._getframe(1).f_code
                if "/specdec/" in caller.co_filename and kwargs.get("device") is not None:
                    self.calls.append(f"{caller.co_filename.rsplit('/specdec/', 1)[1]}:{caller.co_name}")
                return _real(*args, **kwargs)

            monkeypatch.setattr(torch, name, counted)


def test_the_counter_sees_the_reads_it_looks_for():
    x = torch.tensor([0.5, -1.0, 2.0])
    with HostReads() as reads:
        int(x.argmax())
        if (x > 1).any():
            x[x < 0] = 0.0
        x[x > 0].sum()
        x.nonzero()
        x[torch.tensor([0, 2])]  # integer indices: no read
    assert reads.counts == {"aten._local_scalar_dense.default": 2, "aten.index_put_.default": 1,
                            "aten.index.Tensor": 1, "aten.nonzero.default": 1}


@pytest.fixture(scope="module", params=["qwen2", "gemma3"])
def pair(request):
    target = tiny_gemma3(sliding_window=4, eos=None) if request.param == "gemma3" else load_tiny("qwen2", eos=None)
    return target, perturbed(target, 0.05), perturbed(target, 0.3, seed=5)


def engine(model, name):
    return specdec.load(model.hf_model, tokenizer=model.tokenizer, name=f"{model.name}-{name}", engine=name)


@pytest.mark.parametrize("engine_name", ["static", "dynamic"])
@pytest.mark.parametrize("settings", [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 0.8, "top_k": 20, "top_p": 0.9},
    {"temperature": 1.0, "lenience": 0.5},
    {"temperature": 0.0, "gamma_schedule": "adaptive"},
], ids=["greedy", "sampled", "top-k-top-p", "lenient", "adaptive"])
def test_a_generation_reads_the_device_once_per_round(pair, engine_name, settings, monkeypatch):
    target, close, far = (engine(m, engine_name) for m in pair)
    read_backs = []
    real_read = Verification.read

    def counted_read(self):
        read_backs.append(1)
        return real_read(self)

    monkeypatch.setattr(Verification, "read", counted_read)
    copies = []  # copies to the host, which never reach the dispatcher on CPU: counted where they are called
    for method in ("tolist", "cpu", "numpy"):
        real = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method, lambda self, *a, _m=method, _real=real, **k:
                            (copies.append(_m), _real(self, *a, **k))[1])
    for draft in (None, close, "random", [close, far]):
        read_backs.clear()
        copies.clear()
        with HostReads() as reads:
            out = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=24, seed=3, **settings)
        assert len(out.token_ids) == 24
        label = getattr(draft, "name", draft)
        assert reads.counts == {}, label  # no scalar read or value-shaped op anywhere in the generation
        # and one read-back per round; a hierarchy's level 1 reads once per round of its own too
        inner_rounds = sum(level["calls"] for level in out.stats.levels)
        assert len(read_backs) == out.stats.target_calls + inner_rounds, label
        assert inner_rounds > 0 if isinstance(draft, list) else inner_rounds == 0
        assert copies == ["tolist"] * len(read_backs), label  # the read-back's one copy, and no other


@pytest.mark.parametrize("settings", [{"temperature": 0.0}, {"temperature": 1.0}], ids=["greedy", "sampled"])
def test_tokens_stay_on_the_device(pair, settings, monkeypatch):
    """A round uploads nothing: the target's token, the drafted tokens and a hierarchy's pending tokens stay
    where they were computed (issue 29, point 4). Uploads happen once per generation (the prompt for the
    target's and each draft model's cache, and the sequence's device copy), so a longer generation makes no
    more of them. Random tokens are drawn on the device; prompt lookup, which searches the host copy of the
    sequence by design, uploads each proposal it finds, one per round that drafts."""
    target, close, far = (engine(m, "static") for m in pair)
    uploads = Uploads(monkeypatch)
    for draft, setup in ((None, 2), (close, 3), ([close, far], 4), ("random", 2)):
        counts = []
        for n in (8, 32):
            uploads.calls.clear()
            out = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=n, seed=3, **settings)
            assert len(out.token_ids) == n
            counts.append(len(uploads.calls))
        label = getattr(draft, "name", draft)
        assert counts == [setup, setup], (label, uploads.calls)
    uploads.calls.clear()
    out = specdec.generate(target, PROMPT * 3, draft="prompt-lookup", gamma=4, max_new_tokens=16, seed=3, **settings)
    found = uploads.calls.count("drafters/base.py:from_ids")
    assert 0 < found <= out.stats.target_calls and out.stats.drafted > 0
    assert len(uploads.calls) == 2 + found, uploads.calls
