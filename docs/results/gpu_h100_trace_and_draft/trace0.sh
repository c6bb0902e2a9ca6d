sleep 2; while pgrep -f 'bench[0-9]+.sh' > /dev/null; do sleep 1; done
exec 9> /tmp/specdec-gpu/bench.lock; flock 9
. /tmp/specdec-gpu/env.sh
echo "# trace0: gpu_trace.py --compile --gamma 4 --draft prompt-lookup"
python3 /tmp/specdec-gpu/tree/scripts/gpu_trace.py --compile --gamma 4 --draft prompt-lookup --out /tmp/specdec-gpu/trace0 
echo trace0 exit $?
