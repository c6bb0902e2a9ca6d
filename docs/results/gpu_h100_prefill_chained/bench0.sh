while [ -e /proc/$(cat /tmp/specdec-gpu/tests.pid 2>/dev/null || echo 0) ]; do sleep 1; done
exec 9> /tmp/specdec-gpu/bench.lock; flock 9
. /tmp/specdec-gpu/env.sh
echo "# bench0: --device cuda --compile --drafts prompt-lookup --gammas 4,7 --n-prompts 20 --max-new-tokens 128 --temperatures 0 --methods specdec-plain,specdec-spec"
python3 -m specdec.cli bench --device cuda --compile --drafts prompt-lookup --gammas 4\,7 --n-prompts 20 --max-new-tokens 128 --temperatures 0 --methods specdec-plain\,specdec-spec --out /tmp/specdec-gpu/bench0 
echo bench0 exit $?
