#!/usr/bin/env bash
# Build and run everything on a machine with a GPU: C++ tests, Python tests (GPU tests included,
# none may skip for want of a GPU), and a benchmark smoke run. Usage: bash tools/gpu_check.sh
# Each step is stopped after GRAPE_STEP_TIMEOUT seconds (300). GRAPE_CHECK_PART=tests runs the build
# and the tests only, GRAPE_CHECK_PART=smokes the build and the benchmark smokes only (the two
# halves fit one device call each; the build is incremental on a machine that ran the other).
# GRAPE_CHECK_BUILD=0 skips the build, for halves run side by side on one machine after one build
# (a build copies the extension over the one a running half has loaded).
# With $OUT set, logs and the smoke results are written there. Set GRAPE_COMMIT where the tree
# has no .git (the device copy), so results name the commit.
set -uo pipefail
part="${GRAPE_CHECK_PART:-all}"
case "$part" in all|tests|smokes) ;; *) echo "GRAPE_CHECK_PART must be all, tests or smokes"; exit 2;; esac
export PYTHONFAULTHANDLER=1
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu-check}"
mkdir -p "$out"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
status=0
# A step that hangs (a fault can leave the GPU spinning) is stopped, so the rest still runs.
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, remembers failure
  local name=$1; shift
  echo "== $name"
  timeout --signal=ABRT "${GRAPE_STEP_TIMEOUT:-300}" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: rc=$rc"
  [ "$rc" -eq 0 ] || status=1
}
# The GPU machine has no network: build in place through setup.py (no pip build environment).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ "${GRAPE_CHECK_BUILD:-1}" = 0 ] || step build env GRAPE_CUDA_ARCHS="${GRAPE_CUDA_ARCHS:-90}" python3 setup.py -q build_ext --inplace
[ "$status" -eq 0 ] || exit 1
if [ "$part" != smokes ]; then
step ctest ctest --test-dir build/cmake --output-on-failure
# The slowest tests are listed; where pytest-timeout is installed, a test that hangs fails alone.
timeout_flag=$(python3 -c "import pytest_timeout" 2>/dev/null && echo --timeout=300)
step pytest python3 -m pytest tests/python -q -rs -p no:cacheprovider --durations=25 $timeout_flag \
  --junitxml="$out/pytest.xml"
if grep -q 'skipped="[1-9]' "$out/pytest.xml" && grep -q "no CUDA device" "$out/pytest.log"; then
  echo "GPU tests were skipped on a GPU machine"; status=1
fi
step fuzz env GRAPE_FUZZ_CALLS=10000 python3 -m pytest tests/python/test_fuzz_gpu.py -q -rs -p no:cacheprovider
fi
[ "$part" = tests ] && exit $status
step bench-smoke env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.gpt2_decode --quick
step bench-smoke-shapes env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.gpt2_decode --quick --shapes 64 --batch 1
step bench-smoke-sites env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.alias_sites --quick
step bench-smoke-hf-gpt2 env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.hf_gpt2 --tiny --quick --cases b1-greedy,b1-beam4
step bench-smoke-time-to-speed env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.time_to_speed --tiny --quick
step bench-smoke-hf-gptj env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.hf_gptj --tiny --quick \
  --modes eager,grape,grape_compact,grape_all_resident,grape_step,grape_inductor
step bench-smoke-hf-wav2vec2 env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.hf_wav2vec2 --tiny --quick
step bench-smoke-train-lm env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.train_lm --tiny --quick
step bench-smoke-hf-zoo env GRAPE_RESULTS_DIR="$out" python3 -m benchmarks.hf_zoo --quick \
  --cases llama,gemma3,qwen3_moe,whisper,bert
# Tensor parallel over two GPUs where there are two (tp2, then tp1), else tp1 alone.
ranks=$(python3 -c "import torch; print(min(2, torch.cuda.device_count()))")
step bench-smoke-hf-gptj-tp env GRAPE_RESULTS_DIR="$out" NCCL_NVLS_ENABLE=0 \
  python3 -m torch.distributed.run --standalone --nproc-per-node "$ranks" -m benchmarks.hf_gptj_tp --tiny --quick
# Data-parallel training over every GPU, up to two (one rank where there is one).
step bench-smoke-train-ddp env GRAPE_RESULTS_DIR="$out" NCCL_NVLS_ENABLE=0 \
  python3 -m torch.distributed.run --standalone --nproc-per-node "$ranks" -m benchmarks.train_ddp --tiny --quick
# The ecosystem's sharding and tensor parallelism (DTensor parameters): they work or fall back.
step bench-smoke-train-fsdp2 env GRAPE_RESULTS_DIR="$out" NCCL_NVLS_ENABLE=0 \
  python3 -m torch.distributed.run --standalone --nproc-per-node "$ranks" -m benchmarks.train_ddp \
  --tiny --quick --parallel fsdp2 --cases gpt2
step bench-smoke-hf-gptj-tp-dtensor env GRAPE_RESULTS_DIR="$out" NCCL_NVLS_ENABLE=0 \
  python3 -m torch.distributed.run --standalone --nproc-per-node "$ranks" -m benchmarks.hf_gptj_tp \
  --tiny --quick --split dtensor
exit $status
