#!/usr/bin/env bash
# The one-command device check (issue 14): on a machine with an NVIDIA GPU, build what the check
# needs, run the GPU tests, then the GPU benchmarks and train_gpt on the GPU, and write a JSON
# summary with each figure beside its target.
#
#   tools/device_check.sh [--out DIR] [--bin DIR] [--skip-bench] [--no-profile]
#
# --out DIR     where the logs, the benchmark JSON and summary.json go (default: device-check/
#               in the repository)
# --bin DIR     use binaries built elsewhere (test_gpu_*, bench_gpu_kernels, train_gpt and its
#               libtrain_gpt_cuda.so in DIR) instead of building; the machine then needs only the
#               driver and the shared libraries they use
# --skip-bench  no kernel benchmarks
# --no-profile  no per-kernel profile of two 124M steps (taken where Nsight Compute's ncu is
#               installed, ~45 s on an H200; tools/ncu_summary.py groups it into kernel families)
# Exit status: 0 when every GPU test passed and every benchmark and training run finished (the
# targets are reported in the summary, not enforced), 1 otherwise, 2 for a bad argument.
set -uo pipefail

out=""
bin=""
skip_bench=0
profile=1
while (($#)); do
  case "$1" in
    --out) out="$(realpath -m "$2")"; shift 2 ;;
    --bin) bin="$(realpath -m "$2")"; shift 2 ;;
    --skip-bench) skip_bench=1; shift ;;
    --no-profile) profile=0; shift ;;
    *) echo "device_check: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
[[ -n "$out" ]] || out="$(pwd)/device-check"
mkdir -p "$out"
started=$(date +%s)
elapsed() { echo $(($(date +%s) - started)); }

if ! nvidia-smi -L > "$out/gpu.txt" 2>&1; then
  echo "device_check: nvidia-smi finds no GPU:" >&2
  cat "$out/gpu.txt" >&2
  exit 1
fi
# The first GPU (the one the check uses) last: the summary reads that line.
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,clocks.max.sm \
  --format=csv,noheader | head -1 >> "$out/gpu.txt"
cat "$out/gpu.txt"
# The first GPU's compute capability, e.g. 9.0 -> 90: the architecture nvcc builds for (CMake's
# "native" where the driver does not report it).
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
[[ "$arch" =~ ^[0-9]+$ ]] || arch=native

if [[ -z "$bin" ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
  build=build-device
  echo "device_check: building for CUDA architecture $arch in $build ($(elapsed) s)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    > "$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; exit 1; }
  targets="$(ninja -C "$build" -t targets all | sed -n 's/^\(test_gpu_[a-z_]*\|bench_gpu_kernels\): .*/\1/p' | sort -u) train_gpt bench_pipeline_runtime"
  # shellcheck disable=SC2086
  ninja -C "$build" $targets > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  tests=$(find "$build/test/gpu" -maxdepth 1 -name 'test_gpu_*' -type f -perm -u+x | sort)
  bench="$build/bench/bench_gpu_kernels"
  pipeline_bench="$build/bench/bench_pipeline_runtime"
  train_gpt="$build/examples/train_gpt"
else
  tests=$(find "$bin" -maxdepth 1 -name 'test_gpu_*' -type f -perm -u+x | sort)
  bench="$bin/bench_gpu_kernels"
  pipeline_bench="$bin/bench_pipeline_runtime"
  train_gpt="$bin/train_gpt"
fi
echo "device_check: built ($(elapsed) s)"
if [[ -z "$tests" ]]; then
  echo "device_check: no test_gpu_* binaries (built without nvcc, or a wrong --bin)" >&2
  exit 1
fi

status=0
: > "$out/tests.txt"
for test in $tests; do
  name=$(basename "$test")
  log="$out/$name.log"
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "$test" "[device]" > "$log" 2>&1
  code=$?
  result=$(grep -E "^(All tests passed|test cases:)" "$log" | tail -1)
  echo "$name $code $result" | tee -a "$out/tests.txt"
  ((code == 0)) || status=1
done
echo "device_check: tests done ($(elapsed) s)"

if ((skip_bench == 0)); then
  if [[ -x "$bench" ]]; then
    timeout 300 "$bench" --benchmark_format=console \
      --benchmark_out="$out/bench_gpu_kernels.json" --benchmark_out_format=json \
      > "$out/bench_gpu_kernels.log" 2>&1 || status=1
    grep -E "^(copy|layer|softmax|matmul|attention)" "$out/bench_gpu_kernels.log" | cut -c1-160
  else
    echo "device_check: no $bench" >&2
    status=1
  fi
fi
# On the host cores, not the GPU: BPipe and its base at p = 6 (bench_pipeline_runtime's p6 rows,
# 6 thread ranks, ~5 s), each step against the simulator's prediction; and DualPipeV's pairs with
# experts over ep, overlapped against in sequence (the dualpipe_v_moe rows, 4 thread ranks, ~15 s),
# where the ranks' progress threads have cores of their own. The development VM's 2 cores cannot
# run 6 ranks at once; this machine is the many-core one a session gets.
if ((skip_bench == 0)) && [[ -x "$pipeline_bench" ]] && (($(nproc) >= 8)); then
  timeout 150 "$pipeline_bench" --benchmark_filter='p6|dualpipe_v_moe' \
    --benchmark_out="$out/bench_pipeline_runtime.json" --benchmark_out_format=json \
    > "$out/bench_pipeline_runtime.log" 2>&1 || status=1
  grep -E "^pipeline" "$out/bench_pipeline_runtime.log" | cut -c1-200
fi
echo "device_check: benchmarks done ($(elapsed) s)"

# Training on the GPU: the default run (the small model on the Markov source, fp32) to its floor,
# the same with 4 experts (top-2) in every block (the MoE layer's routing, permutations and
# grouped products on the GPU), then the GPT-2 124M shape (12 layers, d 768, 12 heads, vocabulary 50304, seq 1024) in bf16 for
# 20 steps of 16 x 1024 tokens: tokens/s and MFU against the device's dense bf16 peak.
gpt2_124m=(--device cuda --dtype bf16 --layers 12 --d-model 768 --heads 12 --vocab 50304 --order 1
           --seq 1024 --batch 16)
if [[ -x "$train_gpt" ]]; then
  timeout 300 "$train_gpt" --device cuda --report "$out/train_gpt_default.json" \
    > "$out/train_gpt_default.log" 2>&1 || status=1
  tail -2 "$out/train_gpt_default.log"
  timeout 300 "$train_gpt" --device cuda --experts 4 --moe-every 1 --report "$out/train_gpt_moe.json" \
    > "$out/train_gpt_moe.log" 2>&1 || status=1
  tail -1 "$out/train_gpt_moe.log"
  timeout 300 "$train_gpt" "${gpt2_124m[@]}" --steps 20 --warmup 5 --lr 6e-4 --min-lr 6e-5 \
    --eval-every 0 --log-every 5 --report "$out/train_gpt_report.json" \
    > "$out/train_gpt_124m.log" 2>&1 || status=1
  grep -E "^(quintet|step|summary)|error" "$out/train_gpt_124m.log" | cut -c1-200
  # Generation on the GPU (nn::gpt_decoder and its KV cache; train_gpt samples there only when
  # asked): the default model samples after 300 steps, serially, with 4 experts over ep on 2
  # thread ranks, and over 2 pipeline ranks (zb-v); the summary keeps each sample's share of
  # transitions the source allows.
  sample_run() {  # name, flags...
    local name=$1
    shift
    timeout 120 "$train_gpt" --device cuda --steps 300 --sample-tokens 48 "$@" \
      --report "$out/train_gpt_$name.json" > "$out/train_gpt_$name.log" 2>&1 || status=1
    grep -hE "^sample|error" "$out/train_gpt_$name.log" | cut -c1-200
  }
  sample_run sample
  sample_run sample_ep --world 2 --dp 2 --ep 2 --experts 4 --moe-every 1 --capacity-factor 0
  sample_run sample_pp --world 2 --pp 2 --schedule zb-v --layers 4 --micro-batches 4
  # The plans on the GPU, each against the serial run on the GPU step by step (the CTest entries
  # example_train_gpt_cuda_*_matches_serial, here without CTest so --bin works too): thread ranks
  # sharing the device (tp x ring sp; dp x pp, 1f1b, ZeRO-1) and one NCCL rank under mpirun.
  short=(--device cuda --peak-tflops 1 --steps 12 --warmup 2 --log-every 4 --layers 1 --d-model 32
         --seq 16 --batch 4)
  short_pp=(--device cuda --peak-tflops 1 --steps 12 --warmup 2 --log-every 4 --layers 4
            --d-model 32 --seq 16 --batch 8 --micro-batches 4)
  plans_ok=1
  plan_run() {  # name, launcher ("" or mpirun ...), flags...
    local name=$1 launcher=$2
    shift 2
    # shellcheck disable=SC2086
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 180 $launcher \
      "$train_gpt" "$@" --report "$out/plan_$name.json" > "$out/plan_$name.log" 2>&1 || plans_ok=0
  }
  plan_compare() {  # reference, candidate
    python3 tools/compare_train_reports.py "$out/plan_$1.json" "$out/plan_$2.json" \
      > "$out/plan_$2.compare.txt" 2>&1 || plans_ok=0
    echo "train_gpt_cuda $2 against $1: $(cat "$out/plan_$2.compare.txt")"
  }
  plan_run serial "" "${short[@]}"
  plan_run tp_ring "" "${short[@]}" --world 4 --tp 2 --sp 2 --sp-style ring
  plan_compare serial tp_ring
  plan_run serial_pp "" "${short_pp[@]}"
  plan_run dp_pp "" "${short_pp[@]}" --world 4 --dp 2 --pp 2 --schedule 1f1b --zero 1
  plan_compare serial_pp dp_pp
  if command -v mpirun > /dev/null; then
    plan_run nccl "mpirun -np 1 --allow-run-as-root" "${short[@]}"
    plan_compare serial nccl
  fi
  echo "train_gpt_cuda_plans $((1 - plans_ok))" >> "$out/tests.txt"
  ((plans_ok)) || status=1
else
  echo "device_check: no $train_gpt" >&2
  status=1
fi
echo "device_check: training done ($(elapsed) s)"

# Where the 124M step's GPU time goes: Nsight Compute times every kernel of 2 steps (alone, clocks
# locked), tools/ncu_summary.py groups them into families (profile.json, in the summary).
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if ((profile)) && [[ -x "$ncu" && -x "$train_gpt" ]]; then
  timeout 240 "$ncu" --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$train_gpt" "${gpt2_124m[@]}" --steps 2 --warmup 1 --eval-every 0 --sample-tokens 0 \
    > "$out/ncu.txt" 2>&1 || status=1
  # A failed summary leaves no profile.json (device_summary.py reports "not run"), not an empty one.
  python3 tools/ncu_summary.py "$out/ncu.txt" --steps 2 > "$out/profile.json" ||
    { status=1; rm -f "$out/profile.json"; }
  echo "device_check: profile done ($(elapsed) s)"
elif ((profile)); then
  echo "device_check: no ncu (Nsight Compute): the step profile is skipped"
fi

python3 tools/device_summary.py "$out" --seconds "$(elapsed)" --status "$status" > "$out/summary.json"
cat "$out/summary.json"
exit $status
