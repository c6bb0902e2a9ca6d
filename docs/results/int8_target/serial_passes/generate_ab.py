"""Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python generate_ab.py (and =ACTIVE for the reference); README, "Where the threads sleep anyway"."""
import os
import torch  # first, as many programs do: specdec then leaves OMP_WAIT_POLICY alone
import time
import specdec
from specdec.models import threads
from specdec.tasks import load_humaneval
from specdec.sweeps.machine import where_measured
torch.set_num_threads(2)
print("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY"), "threads sleep:", threads.threads_sleep(), flush=True)
target = specdec.load("qwen2.5-coder-1.5b", quantize="int8")
draft = specdec.load("qwen2.5-coder-0.5b", quantize="int8")
prompts = [p.text for p in load_humaneval(6)]
specdec.generate(target, prompts[0], draft=draft, max_new_tokens=8)
modes = (("serial", 64), ("torch", 0)) if threads.threads_sleep() else (("spinning", 64),)
res = {m: {"plain": [0, 0.0], "spec": [0, 0.0]} for m, _ in modes}
same = 0
for p in prompts:
    for m, width in modes:
        threads.SERIAL_WIDTH = width
        for kind, d in (("plain", None), ("spec", draft)):
            t0 = time.perf_counter(); out = specdec.generate(target, p, draft=d, max_new_tokens=96); dt = time.perf_counter() - t0
            res[m][kind][0] += out.stats.new_tokens; res[m][kind][1] += dt
            if kind == "plain": ref = out.token_ids
            else: same += out.token_ids == ref
for m in res:
    print(m, {k: round(v[0] / v[1], 2) for k, v in res[m].items()}, "tokens/s")
print("speculative == plain:", same, "/", len(prompts) * len(modes), where_measured()["cpu_kind"])
