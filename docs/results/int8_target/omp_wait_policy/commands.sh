cd /work/main
for pol in DEFAULT ACTIVE; do
  if [ $pol = ACTIVE ]; then export OMP_WAIT_POLICY=ACTIVE; else unset OMP_WAIT_POLICY; fi
  .venv/bin/specdec bench --task humaneval --n-prompts 10 --max-new-tokens 128 --quantize int8 --methods specdec-plain,specdec-spec,llama-cpp \
    --drafts qwen2.5-coder-0.5b:int8 qwen2.5-coder-0.5b:llama-cpp --gamma 6 --gamma-schedules adaptive --threads 2 \
    --out /tmp/omp/$pol > /tmp/omp/$pol.log 2>&1
done
