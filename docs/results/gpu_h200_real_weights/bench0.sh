while [ -e /proc/$(cat /tmp/specdec-gpu/tests.pid 2>/dev/null || echo 0) ]; do sleep 1; done
exec 9> /tmp/specdec-gpu/bench.lock; flock 9
. /tmp/specdec-gpu/env.sh
echo "# bench0: --device cuda --drafts prompt-lookup --gammas 2,4 --n-prompts 5 --max-new-tokens 128 --temperatures 0 --methods specdec-plain,specdec-spec,hf-plain"
python3 -m specdec.cli bench --device cuda --drafts prompt-lookup --gammas 2\,4 --n-prompts 5 --max-new-tokens 128 --temperatures 0 --methods specdec-plain\,specdec-spec\,hf-plain --out /tmp/specdec-gpu/bench0 
echo bench0 exit $?
