#!/usr/bin/env bash
# The GPU measurement battery of issue 18 point 5 (and issue 20's NVIDIA figure), for calls of at
# most ~9 minutes on an NVIDIA host with no network. Every stage has its own time limit,
# cut to what is left of the whole, and writes its log as it goes, so a stage that fails or hangs
# leaves the others' figures intact. Run in the project root after `source .gpu/setup.sh`
# (`bash bench/gpu_bundle.sh` makes .gpu/ here, small enough to carry):
#
#   BATTERY_SECONDS=420 bash bench/gpu_battery.sh   # logs under ${OUT:-/tmp/gpu-out}, then summary.md
#                                                   # (bench/battery_summary.ts: the figures against the goals)
#   BATTERY_STAGES="make-model kernels host" ...    # some stages only, in that order
#
# A device call brings back at most 8 files: pack the folder (tar) in the same command. On an H200
# (2026-11-27) every stage but tests took ~320 s together (quant ~100 s; readback, retune and
# dispatch, added since, ~60 s more) and tests ~260 s (the cpu-profile kernels' tests in tests/quant_matmul_test.ts
# took minutes there); with 15 minutes of device time, two calls fit: BATTERY_STAGES without tests,
# then BATTERY_STAGES="tests".
#
# Stages (names for BATTERY_STAGES), in the default order: info (adapter); make-model; bench-model
# (prefill 128/256/512, decode batch 1/8/64, host and GPU time per step, per-kernel breakdown of
# decode and of prefill 512, gpu profile); torch (the PyTorch peer on the same checkpoint on CUDA); quant
# (bench:model --quantization none,int8,int4, two rounds, the int4 runner's breakdown at decode
# batch 1 and prefill 512); serve (bench:serve at concurrency 1/16/64); readback (readbacks 6 at a
# time, 11 steps in flight: the GPU's idle time between steps); retune (a second start-up measuring
# its own tuning: how steady the choices are); kv-auto (a generate whose KV cache is sized from
# the GPU's memory: the start-up log's lines on it); untuned (--kernel-tuning off: what the measured
# tuning changes); unfused (--fused-decode off); kernels, kernels-int4 (every matmul kernel and
# tile shape, bench/matmul_tune.ts, f16 and int4); kernels-rms (the same with X read as the
# normed residual stream, as qkv and gate/up read it, and as down reads it, the SwiGLU of gate|up:
# kernels_swiglu.txt); kernels-xscalar (the gemv kernels of kernels-rms with X in 4-byte loads, as
# before 2026-11-29: the vec4 loads' A/B); attention; dispatch (the GPU time a dispatch
# adds, bench/dispatch_floor.ts); host (the host's time per decode step call by call,
# bench/host_calls.ts); prompt-logprobs; tests (the suite on the GPU: greedy parity with the
# float64 reference, its auto profile there the gpu one, less the files importing the client SDKs
# the bundle leaves out).
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
# One stage by name; BATTERY_STAGES picks which run and in what order (default: all, the figures
# issue 18 point 5 and issue 20 ask for from one run first, the A/B and per-kernel detail after).
# Stages after make-model need the checkpoint; a second call can run the rest with
# BATTERY_STAGES="make-model untuned unfused ..." and the first call's matmul_tuning.json in $out.
stage() {
  case $1 in
    info) run_stage info 60 info.txt deno run --cached-only -A main.ts info ;;
    make-model)
      run_stage make-model 120 info.txt deno run --cached-only -A tools/make_model.ts --out $model \
        --preset "$preset" --dtype bf16
      ;;
    # Prefills are timed 3 times after an untimed one of each length (--prefill-repeats, since
# 2026-11-30; before, once: on the H200 128 and 512 tokens took 47.6 and 76 ms, ~38 ms that did not
# scale with the prompt, part of it possibly first-use work).
# The first run also measures the kernel tuning (every tile at the prefill rows, the decode
    # batch and up to three row counts between since 2026-11-29; the gemv kernels per shape).
    bench-model)
      run_stage bench-model 180 model.txt deno run --cached-only -A bench/model_bench.ts \
        --model $model --batches 1,8,64 --prefill 128,256,512 --prefill-repeats 3 --steps 64 \
        --breakdown-batches 1,8,64 $gpu
      ;;
    torch)
      if python3 -c "import torch, transformers" 2> /dev/null; then
        run_stage torch 60 torch.txt env PYTHONUNBUFFERED=1 python3 bench/torch_reference.py \
          --model $model --dtype bfloat16 --device cuda --batches 1,8,64 --prefill 128,512 --steps 32
      else
        log "torch: no torch/transformers here"
      fi
      ;;
    # The test suite on the GPU (its auto profile there is the gpu one), less the files importing
    # the client SDKs the bundle leaves out.
    tests)
      local tests
      tests=$(grep -L "npm:openai\|@langchain\|npm:ai\|ai-sdk\|kubernetes-models" tests/*_test.ts)
      # shellcheck disable=SC2086
      run_stage tests 290 tests.txt env WEBGPU_LLM_KERNEL_TUNING=off deno test --cached-only \
        --no-check -A --parallel $tests
      ;;
    quant)
      run_stage bench-quant 130 quant.txt deno run --cached-only -A bench/model_bench.ts \
        --model $model --batches 1,8,32 --prefill 512 --steps 32 --breakdown-batches 1 \
        --quantization none,int8,int4 --rounds 2 $gpu
      ;;
    # A KV cache that holds 64 requests of 256 tokens at once (1,024 blocks of Qwen3-0.6B's 1.75
    # MiB; 4 GiB holds 2,340): the default 1 GiB holds 585, and the 2026-11-26/27 runs at
    # concurrency 64 preempted (the mock executor, same load: 72-77 preemptions in 256 requests,
    # 0.76x the throughput; docs/benchmarks.md). bench:serve prints each level's preemptions since.
    serve)
      run_stage serve 90 serve.txt deno run --cached-only -A bench/serve.ts --model $model \
        --concurrency 1,16,64 --input-len 128 --output-len 128 --out-dir /tmp/gpu-serve \
        --no-progress -- $gpu --kv-cache-memory 4096
      ;;
    # Readbacks started 6 at a time with 11 steps in flight instead of 3 and 7: the GPU waits for
    # the host once per batch (GPU idle between steps, against bench-model's).
    readback)
      run_stage bench-model-readback 40 model_readback.txt deno run --cached-only -A \
        bench/model_bench.ts --model $model --batches 1,8,64 --prefill 512 --steps 64 \
        --no-breakdown --max-in-flight 11 --readback-batch 6 $gpu
      ;;
    # A second start-up measuring its own tuning (is the tuner steady? the choices and figures
    # against bench-model's). Both start-ups measure 26 tiles (five split-K) and the attention's
    # split at four contexts since 2026-11-29 (15 tiles, one context before: ~23 s on the H200),
    # and the tiles at the row counts between the decode batch and the prefill rows since then too,
    # hence 180 / 110 s.
    retune)
      run_stage bench-model-retuned 110 model_retuned.txt deno run --cached-only -A \
        bench/model_bench.ts --model $model --batches 1,8,64 --prefill 512 --prefill-repeats 3 \
        --steps 32 --no-breakdown --kernel-tuning measure $gpu
      ;;
    # The same decode and prefill with the default kernel choices (A/B of the measured tuning).
    untuned)
      run_stage bench-model-untuned 60 model_untuned.txt deno run --cached-only -A \
        bench/model_bench.ts --model $model --batches 1,8,64 --prefill 128,512 --prefill-repeats 3 \
        --steps 32 --no-breakdown --kernel-tuning off $gpu
      ;;
    # The KV cache sized from the GPU's memory (nvidia-smi; --gpu-memory-utilization's default, 0.9
    # of the free memory: engine/kv_cache_plan.ts, since 2026-11-30, never run on a GPU before): the
    # start-up log's "KV cache sized from the GPU's memory" and "GPU memory in use" lines, 8 tokens.
    kv-auto)
      run_stage kv-auto 60 kv_auto.txt deno run --cached-only -A main.ts generate --model $model \
        --prompt "The capital of France is" --max-tokens 8 $gpu
      ;;
    # Decode with rope_and_cache's own dispatch per layer instead of the fused decode attention.
    unfused)
      run_stage bench-model-unfused 30 model_unfused.txt deno run --cached-only -A \
        bench/model_bench.ts --model $model --batches 1,64 --prefill 128 --steps 64 --no-breakdown \
        --fused-decode off $gpu
      ;;
    # Every matmul kernel in isolation: since 2026-11-29 26 tiles (five split-K) and the GEMV at
    # 64 and 32 invocations a row, ~1.5x the kernels before, hence 80 s.
    kernels)
      run_stage kernels 80 kernels.txt deno run --cached-only -A bench/matmul_tune.ts \
        --m 1,8,16,64,512 --shapes qkv,down
      ;;
    # The same at prefill and decode rows with int4 weights.
    kernels-int4)
      run_stage kernels-int4 40 kernels_int4.txt deno run --cached-only -A bench/matmul_tune.ts \
        --m 1,64,512 --shapes qkv,down --format int4
      ;;
    # X read as the engine's qkv and gate/up read it (the residual stream normed on the fly),
    # against the kernels stage's plain X: what the norm X form costs each kernel.
    kernels-rms)
      run_stage kernels-rms 40 kernels_rms.txt deno run --cached-only -A bench/matmul_tune.ts \
        --m 1,64,512 --shapes qkv,gate_up --x-form rms_residual
      # The down projection's X as the engine reads it: the SwiGLU of gate|up, computed in every
      # workgroup (its exp per element, against the kernels stage's plain X).
      run_stage kernels-swiglu 30 kernels_swiglu.txt deno run --cached-only -A \
        bench/matmul_tune.ts --m 1,8,64 --shapes down --x-form swiglu
      ;;
    # The gemv kernels reading X (the normed residual stream) in 4-byte loads, as before
    # 2026-11-29, against kernels-rms's vec4 loads at the same M.
    kernels-xscalar)
      run_stage kernels-xscalar 30 kernels_rms_scalar.txt deno run --cached-only -A \
        bench/matmul_tune.ts --m 1,64 --shapes qkv,gate_up --x-form rms_residual --x-loads scalar
      ;;
    attention)
      run_stage attention 70 kernels.txt env DECODE_CONTEXTS=160,2048 \
        DECODE_PARTITIONS=16,64,512 DECODE_KV_DTYPES=auto,fp8_e4m3 deno bench --cached-only --no-check -A --filter "/^zz$/" \
        bench/attention_bench.ts bench/attention_prefill_bench.ts
      ;;
    # The GPU time a dispatch adds, apart from its work (with and without a barrier before it).
    dispatch)
      run_stage dispatch 20 kernels.txt deno run --cached-only -A bench/dispatch_floor.ts \
        --dispatches 145 --workgroups 1,528
      ;;
    # The host's cost of a decode step call by call (device work stubbed out).
    host)
      run_stage host 20 host.txt deno run --cached-only -A bench/host_calls.ts --model $model \
        --batch 1 $gpu
      run_stage host 20 host.txt deno run --cached-only -A bench/host_calls.ts --model $model \
        --batch 64 $gpu
      ;;
    prompt-logprobs)
      run_stage prompt-logprobs 40 prompt_logprobs.txt deno run --cached-only -A \
        bench/prompt_logprobs_bench.ts --model $model --prompts 16 --len 512 --rounds 3 $gpu
      ;;
    *) log "unknown stage $1" ;;
  esac
}
# readback before retune: it reads bench-model's cached tuning (same call sites and context), which
# retune then replaces.
stages=${BATTERY_STAGES:-info make-model bench-model torch quant serve kv-auto readback retune \
untuned unfused kernels kernels-int4 kernels-rms kernels-xscalar attention dispatch host prompt-logprobs tests}
for name in $stages; do stage "$name"; done
log "done"
# The figures against issue 18's and issue 20's goals, read from the logs above (no GPU work).
deno run --cached-only -A bench/battery_summary.ts "$out" > "$out/summary.md" 2>&1
