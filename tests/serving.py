"""A real `specdec serve` process on 127.0.0.1 over tiny models saved to local folders (test_serve.py, the
playground's browser tests). Every wait is bounded in time."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Iterator

import httpx
import torch

from tiny import CHAR_VOCAB, char_tokenizer, tiny_model, tiny_tokenizer

# The tiny word-level tokenizer has no chat template of its own; this one uses words of its vocabulary.
CHAT_TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
                 "{% if add_generation_prompt %}w3{% endif %}")
CHAR_CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}")
CONTEXT = 4096  # long enough for a request that is still running when a test needs it to be


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_tiny(folder, seed: int, noise: float = 0.0, chars: bool = False) -> str:
    """A tiny model saved to ``folder``; ``noise`` > 0: Gaussian noise of that relative scale on every weight
    (with the target's seed, a draft that agrees with it often: tiny.perturbed). ``chars``: over the character
    vocabulary (tiny.char_tokenizer, any text expressible: structured output), with an EOS token."""
    if chars:
        model, tokenizer = tiny_model(vocab=len(CHAR_VOCAB), seed=seed, sharp=3.0), char_tokenizer()
        tokenizer.chat_template = CHAR_CHAT_TEMPLATE
    else:
        model, tokenizer = tiny_model(eos=None, seed=seed), tiny_tokenizer()  # no EOS: every run hits max_tokens
        tokenizer.chat_template = CHAT_TEMPLATE
    model.config.max_position_embeddings = CONTEXT
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters() if noise else ():
            param.add_(torch.randn(param.shape, generator=g) * noise * param.std())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def wait_until(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


@contextlib.contextmanager
def tiny_server(root, *options: str, draft_noise: float = 0.0, chars: bool = False) -> Iterator[SimpleNamespace]:
    """Serve a tiny target (seed 0) in fp32 with a tiny int8 draft: another random model (seed 1), or with
    ``draft_noise`` the target's weights plus that much noise (``chars``: over the character vocabulary).
    Yields (url, model: the target's folder, log)."""
    target = save_tiny(root / "target", 0, chars=chars)
    draft = save_tiny(root / "draft", 0, draft_noise, chars) if draft_noise else save_tiny(root / "draft", 1, chars=chars)
    port = free_port()
    # One thread: tiny models gain nothing from more, and two processes spinning on two shared cores ran 10x slower.
    env = {**{k: v for k, v in os.environ.items() if k != "SPECDEC_API_KEY"}, "OMP_NUM_THREADS": "1"}
    log_path = root / "server.log"
    log = open(log_path, "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdec.cli", "serve", "--target", target, "--draft", draft + ":int8", "--dtype", "fp32",
         "--port", str(port), "--log-level", "warning", *options],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    url = f"http://127.0.0.1:{port}"

    def ready():
        assert proc.poll() is None, f"the server exited: {open(log_path).read()}"
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, 120, "the server to load the models")
        yield SimpleNamespace(url=url, model=target, log=log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()
