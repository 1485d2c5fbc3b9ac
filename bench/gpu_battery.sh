#!/usr/bin/env bash
# The GPU measurement battery of issue 18 point 5 (and issue 20's NVIDIA figure), sized for one
# call of at most ~9 minutes on an NVIDIA host with no network. Every stage has its own time limit,
# cut to what is left of the whole, and writes its log as it goes, so a stage that fails or hangs
# leaves the others' figures intact. Run in the project root after `source .gpu/setup.sh`
# (`bash ../shared/gpu/bundle.sh` makes .gpu/ here):
#
#   BATTERY_SECONDS=330 bash bench/gpu_battery.sh   # logs under ${OUT:-/tmp/gpu-out}, 13 files and the tuning cache,
#                                                   # then summary.md (bench/battery_summary.ts: the figures against the goals)
#
# Stages, most valuable first: adapter; bench:model (prefill 128/512, decode batch 1/8/64, host and
# GPU time per step, per-kernel breakdown of decode and of prefill 512) under the gpu profile, then again with the default kernel
# choices (--kernel-tuning off: what the measured tuning changes), and decode without the fused
# decode attention (--fused-decode off); the PyTorch peer on the same
# checkpoint on CUDA; every matmul kernel and tile shape (bench/matmul_tune.ts, f16 and int4) and the attention
# kernels; the host's time per decode step call by call (bench/host_calls.ts); the test suite on the GPU (greedy parity with the float64 reference; its auto
# profile there is the gpu one), less the files importing the client SDKs the bundle leaves out;
# bench:model --quantization none,int8,int4 in two rounds (with the int4 runner's breakdown at decode batch 1 and
# prefill 512); bench:serve at concurrency 1/16/64; prompt scoring (bench:prompt-logprobs).
# The matmul tuning (engine/kernel_tuning.ts) is measured by the first bench:model into a fresh cache
# under the output directory (matmul_tuning.json: the choices, for the docs) and re-used by the
# later stages with the same call sites; the test stage runs with WEBGPU_LLM_KERNEL_TUNING=off
# (defaults; the tuning's own tests force a measurement).
set -u
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
budget=${BATTERY_SECONDS:-540}
t0=$(date +%s)
log() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$out/progress.txt"; }
# left MAX: seconds a stage may take, at most MAX, never past the whole battery's budget.
left() {
  local rest=$((budget - ($(date +%s) - t0)))
  ((rest < $1)) && echo $((rest > 5 ? rest : 5)) || echo "$1"
}
run_stage() { # name max-seconds file command...
  local name=$1 max=$2 file=$3
  shift 3
  local limit
  limit=$(left "$max")
  log "$name: start (limit $limit s)"
  echo "\$ $*" >> "$out/$file"
  timeout -k 5 "$limit" "$@" >> "$out/$file" 2>&1
  log "$name: rc $?"
}
preset=${BATTERY_PRESET:-qwen3-0.6b}
model=/tmp/battery-$preset
gpu="--kernel-profile gpu"
export WEBGPU_LLM_CACHE_DIR="$out"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)"
  deno --version | head -1
  # The device copy's .git may be older than its working tree: the caller names the commit.
  echo "commit ${BATTERY_COMMIT:-$(git log -1 --format=%H 2> /dev/null)}"
} > "$out/info.txt" 2>&1
run_stage info 60 info.txt deno run --cached-only -A main.ts info
run_stage make-model 120 info.txt deno run --cached-only -A tools/make_model.ts --out $model \
  --preset "$preset" --dtype bf16

# 120 s: the first run also measures the kernel tuning (15 tiles, 4 gemv kernels per shape).
run_stage bench-model 120 model.txt deno run --cached-only -A bench/model_bench.ts --model $model \
  --batches 1,8,64 --prefill 128,512 --steps 64 --breakdown-batches 1,8,64 $gpu

# The same decode and prefill with the default kernel choices (A/B of the measured tuning, same run).
run_stage bench-model-untuned 60 model_untuned.txt deno run --cached-only -A bench/model_bench.ts \
  --model $model --batches 1,8,64 --prefill 512 --steps 32 --no-breakdown --kernel-tuning off $gpu

# Decode with rope_and_cache's own dispatch per layer instead of the fused decode attention (A/B of
# the fusion: 177 against 149 dispatches per step, same run).
run_stage bench-model-unfused 30 model_unfused.txt deno run --cached-only -A bench/model_bench.ts \
  --model $model --batches 1,64 --prefill 128 --steps 64 --no-breakdown --fused-decode off $gpu

if python3 -c "import torch, transformers" 2> /dev/null; then
  run_stage torch 60 torch.txt env PYTHONUNBUFFERED=1 python3 bench/torch_reference.py \
    --model $model --dtype bfloat16 --device cuda --batches 1,8,64 --prefill 128,512 --steps 32
fi

run_stage kernels 60 kernels.txt deno run --cached-only -A bench/matmul_tune.ts --m 1,8,16,64,512 \
  --shapes qkv,down
# The same at prefill and decode rows with int4 weights: why int4 prefill ran 2x slower than f16
# (the tiled kernel's W staging unpacks and scales inside its K loop).
run_stage kernels-int4 40 kernels_int4.txt deno run --cached-only -A bench/matmul_tune.ts \
  --m 1,64,512 --shapes qkv,down --format int4
run_stage attention 40 kernels.txt env DECODE_CONTEXTS=160,2048 DECODE_PARTITIONS=16,64,512 \
  deno bench --cached-only --no-check -A --filter "/^zz$/" \
  bench/attention_bench.ts bench/attention_prefill_bench.ts

# The host's cost of a decode step call by call (device work stubbed out; a few seconds each).
run_stage host 20 host.txt deno run --cached-only -A bench/host_calls.ts --model $model --batch 1 $gpu
run_stage host 20 host.txt deno run --cached-only -A bench/host_calls.ts --model $model --batch 64 $gpu

tests=$(grep -L "npm:openai\|@langchain\|npm:ai\|ai-sdk\|kubernetes-models" tests/*_test.ts)
run_stage tests 100 tests.txt env WEBGPU_LLM_KERNEL_TUNING=off deno test --cached-only --no-check -A --parallel $tests

run_stage bench-quant 90 quant.txt deno run --cached-only -A bench/model_bench.ts --model $model \
  --batches 1,8,32 --prefill 512 --steps 32 --breakdown-batches 1 --quantization none,int8,int4 \
  --rounds 2 $gpu

run_stage serve 90 serve.txt deno run --cached-only -A bench/serve.ts --model $model \
  --concurrency 1,16,64 --input-len 128 --output-len 128 --out-dir /tmp/gpu-serve --no-progress \
  -- $gpu

run_stage prompt-logprobs 40 prompt_logprobs.txt deno run --cached-only -A \
  bench/prompt_logprobs_bench.ts --model $model --prompts 16 --len 512 --rounds 3 $gpu
log "done"
# The figures against issue 18's and issue 20's goals, read from the logs above (no GPU work).
deno run --cached-only -A bench/battery_summary.ts "$out" > "$out/summary.md" 2>&1
