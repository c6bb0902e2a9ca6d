"""Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python generate_batch_ab.py (and =ACTIVE for the reference); README, "Where the threads sleep anyway"."""
import os
import torch
import time
import specdec
from specdec.models import threads
from specdec.tasks import load_humaneval
torch.set_num_threads(2)
print("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY"), "threads sleep:", threads.threads_sleep(), flush=True)
target = specdec.load("qwen2.5-coder-1.5b", quantize="int8")
draft = specdec.load("qwen2.5-coder-0.5b", quantize="int8")
prompts = [p.text for p in load_humaneval(8)]
specdec.generate_batch(target, prompts[:2], max_new_tokens=4)
modes = (("serial", 64), ("torch", 0)) if threads.threads_sleep() else (("spinning", 64),)
res = {}
for rep in range(2):
    for m, width in modes:
        threads.SERIAL_WIDTH = width
        for kind, d in (("plain", None), ("spec", draft)):
            t0 = time.perf_counter(); outs = specdec.generate_batch(target, prompts, draft=d, max_new_tokens=64); dt = time.perf_counter() - t0
            r = res.setdefault((m, kind), [0, 0.0]); r[0] += sum(o.stats.new_tokens for o in outs); r[1] += dt
for (m, kind), (n, t) in res.items():
    print(m, kind, f"{n / t:.2f} tokens/s")
