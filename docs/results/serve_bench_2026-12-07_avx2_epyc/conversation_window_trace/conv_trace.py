"""Per-turn stats of the conversation (and chat) workloads through `specdec serve` at one client."""
import sys, json, time
from pathlib import Path
sys.path.insert(0, "/work/main/scripts")
import httpx
from serve_bench import jobs, warm_up, MAX_TOKENS
from load_test import Server

workload, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = Server(["--max-batch", "8", "--max-queue", "64"], Path(f"/tmp/exp/{tag}.log"))
model = server.health["model"]
warm_up(server.url, model)
client = httpx.Client(base_url=server.url, timeout=3600)
total_t = total_n = 0
for job in jobs(workload, n):
    messages = list(job["messages"])
    last = None
    for turn in [None, *job["turns"]]:
        if turn is not None:
            messages += [{"role": "assistant", "content": last}, {"role": "user", "content": turn}]
        t0 = time.perf_counter()
        doc = client.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": MAX_TOKENS[workload], "temperature": 0}).json()
        dt = time.perf_counter() - t0
        last = doc["choices"][0]["message"]["content"]
        st = doc.get("specdec", {})
        u = doc["usage"]
        lv = (st.get("levels") or [{}])[0]
        total_t += dt; total_n += u["completion_tokens"]
        print(json.dumps({"tag": tag, "prompt": u["prompt_tokens"], "cached": (u.get("prompt_tokens_details") or {}).get("cached_tokens"),
                          "out": u["completion_tokens"], "s": round(dt, 2), "calls": st.get("target_calls"),
                          "m1_calls": lv.get("calls"), "copies": lv.get("copy_rounds"), "copied_acc": lv.get("copied_accepted"),
                          "m1_s": round(lv.get("time_total_s", 0), 2), "prefill_s": round(st.get("prefill_seconds") or st.get("time_prefill_s") or 0, 2)}), flush=True)
print(tag, "tokens/s", round(total_n / total_t, 2))
server.close()
