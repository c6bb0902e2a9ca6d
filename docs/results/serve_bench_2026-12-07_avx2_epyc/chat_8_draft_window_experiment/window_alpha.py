import sys, json, time, torch
sys.path.insert(0, "/work/main/scripts")
import specdec
from serve_bench import jobs
torch.set_num_threads(2)
target = specdec.load("qwen2.5-coder-1.5b")
draft = specdec.load("qwen2.5-coder-0.5b", quantize="int4")
tok = target.tokenizer
print("target", target.quantization, "draft", draft.quantization, flush=True)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 12
work = jobs("chat", 40)[:N] if N <= 40 else None
res = []
for j in work:
    ids = tok.apply_chat_template(j["messages"], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"]) if isinstance(ids, dict) or hasattr(ids, "keys") else list(ids)
    # head: up to and including "<|im_start|>user\n"
    user_start = next(i for i in range(len(ids)) if tok.decode(ids[:i+1]).endswith("<|im_start|>user\n"))
    h = user_start + 1
    # target greedy answer
    s, _ = target.start(ids, len(ids) + 200)
    t0 = time.perf_counter()
    logits = s.extend(ids, 1)[0]
    t_pre = time.perf_counter() - t0
    ans = []
    for _ in range(192):
        x = int(logits.argmax())
        ans.append(x)
        if x in (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")):
            break
        logits = s.extend([x], 1)[0]
    s.close()
    row = {"prompt": len(ids), "answer": len(ans), "head": h, "target_prefill_s": t_pre}
    for W in (0, 16, 32, 64, 128, None):
        ctx = ids if W is None else ids[:h] + ids[max(h, len(ids) - W):]
        d, _ = draft.start(ctx, len(ctx) + 200)
        t0 = time.perf_counter()
        lg = d.extend(ctx + ans[:-1], len(ans))  # [len(ans), V]
        dt = time.perf_counter() - t0
        d.close()
        match = (lg.argmax(-1).tolist() == ans) if False else sum(int(a == b) for a, b in zip(lg.argmax(-1).tolist(), ans))
        row[f"W{W}"] = match / len(ans)
    res.append(row)
    print(json.dumps(row), flush=True)
import statistics as st
for k in res[0]:
    if k.startswith("W"):
        tot = sum(r[k] * r["answer"] for r in res) / sum(r["answer"] for r in res)
        print(k, round(tot, 3))
print("mean prompt", st.mean(r["prompt"] for r in res), "mean answer", st.mean(r["answer"] for r in res))
