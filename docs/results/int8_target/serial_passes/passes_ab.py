"""Run: OMP_WAIT_POLICY=PASSIVE .venv/bin/python passes_ab.py (and =ACTIVE for the reference); README, "Where the threads sleep anyway"."""
import specdec, sys, torch, time, statistics, os; print("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY"))
from specdec.models.batch_session import BatchSession
from specdec.models import threads
from specdec.tasks import load_humaneval
torch.set_num_threads(2)
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
target = specdec.load(name, quantize="int8")
prompts = [target.encode(p.text) for p in load_humaneval(8)]
sessions = {B: BatchSession(target, B, 512) for B in (1, 8)}
for B, s in sessions.items():
    for i in range(B): s.prefill(i, prompts[i])
def once(B, k):
    s = sessions[B]
    t0 = time.perf_counter(); s.extend([torch.tensor(prompts[i][-k:]) for i in range(B)], [k] * B); dt = time.perf_counter() - t0
    for i in range(B): s.rollback(i, len(prompts[i]))
    return dt
res = {}
cases = ((1, 1), (1, 8), (8, 1), (8, 5))
for rep in range(8):
    for on in (False, True):
        threads.SERIAL_WIDTH = 64 if on else 0
        for c in cases:
            once(*c)
            res.setdefault((on,) + c, []).append(once(*c))
for c in cases:
    a = statistics.median(res[(False,) + c]) * 1000; b = statistics.median(res[(True,) + c]) * 1000
    print(f"B{c[0]}x{c[1]}: before {a:.1f} ms, after {b:.1f} ms, after/before {b/a:.3f}")
print("threads after", torch.get_num_threads())
