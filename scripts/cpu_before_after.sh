#!/usr/bin/env bash
# CPU speed before and after a change, by the same `specdec bench` command on two checkouts' sources,
# alternated (before, after, before, after, ...) so that drift of a shared machine hits both alike.
#
#   scripts/cpu_before_after.sh BEFORE_SRC BEFORE_CACHE AFTER_SRC AFTER_CACHE OUT_DIR [ROUNDS] [-- BENCH ARGS]
#
# BEFORE_SRC / AFTER_SRC: a checkout's src/ folder (e.g. from `git worktree add /tmp/before COMMIT`);
# *_CACHE: the SPECDEC_CACHE each version converts its presets into (the cache layout changed with issue 18).
# Each run writes OUT_DIR/{before,after}_N/ (bench.json, bench.md, bench.csv) and its log. Every run of
# one round sees the same prompts; compare tokens/s per method, and each specdec method against
# transformers' plain generate of the same run (hf-plain is the same code in both versions).
set -euo pipefail
if [ $# -lt 5 ]; then
    sed -n '2,12p' "$0"; exit 2
fi
before_src=$1 before_cache=$2 after_src=$3 after_cache=$4 out=$5
rounds=${6:-2}
shift $(( $# >= 6 ? 6 : 5 ))
[ "${1:-}" = "--" ] && shift
bench_args=("$@")
if [ ${#bench_args[@]} -eq 0 ]; then
    bench_args=(--n-prompts 6 --max-new-tokens 64 --drafts qwen2.5-coder-0.5b:int8 --gamma 6
                --methods specdec-plain,specdec-spec,hf-plain --warmup 1)
fi
python=${PYTHON:-python3}
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
    for side in before after; do
        if [ $side = before ]; then src=$before_src cache=$before_cache; else src=$after_src cache=$after_cache; fi
        dir=$out/${side}_$round
        echo "== round $round, $side ($src), load average $(cut -d' ' -f1-3 /proc/loadavg)"
        SPECDEC_CACHE=$cache PYTHONPATH=$src "$python" -m specdec.cli bench "${bench_args[@]}" --out "$dir" \
            > "$dir.log" 2>&1
        grep -E '^\| [0-9.]+ \| (specdec|hf)' "$dir/bench.md" || true
    done
done
