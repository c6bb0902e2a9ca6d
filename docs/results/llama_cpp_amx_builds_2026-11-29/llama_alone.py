"""llama.cpp alone (no specdec imported): 20 HumanEval prompts x 128 tokens, greedy, 2 threads, prefill included."""
import gzip, json, sys, time
import llama_cpp
from llama_cpp import llama_cpp as low
extra = sys.argv[1] == "1"
path = sys.argv[2]
d = low.llama_model_default_params
def p():
    x = d(); x.use_extra_bufts = extra; return x
low.llama_model_default_params = p
llm = llama_cpp.Llama(model_path="/root/.cache/specdec/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", n_ctx=2048,
                      n_threads=2, n_threads_batch=2, seed=0, verbose=False, flash_attn=len(sys.argv) > 3 and sys.argv[3] == "fa")
probs = [json.loads(l) for l in gzip.open(path, "rt")][:20]
eos = {llm.token_eos()}
tot_t = tot_n = 0
for pr in probs:
    ids = llm.tokenize(pr["prompt"].encode(), add_bos=False)
    llm.reset(); t0 = time.perf_counter(); out = []
    for tok in llm.generate(ids, reset=True, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0):
        out.append(tok)
        if tok in eos or len(out) >= 128: break
    dt = time.perf_counter() - t0; tot_t += dt; tot_n += len(out)
    print(pr["task_id"], len(ids), len(out), f"{len(out)/dt:.2f}", flush=True)
print(f"{llama_cpp.__file__} fa={sys.argv[3:]} extra_bufts={extra}: {tot_n} tokens in {tot_t:.1f} s = {tot_n/tot_t:.2f} tok/s")
