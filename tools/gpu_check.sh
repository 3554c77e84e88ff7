#!/usr/bin/env bash
# Build and run everything on a machine with a GPU: C++ tests, Python tests (GPU tests included,
# none may skip for want of a GPU), and a benchmark smoke run. Usage: bash tools/gpu_check.sh
# Each step is stopped after GRAPE_STEP_TIMEOUT seconds (300, a plain number; pytest's after three
# times that). On a machine with two GPUs or more, the tests run in two lanes side by side; on
# one GPU, the test files run GRAPE_CHECK_LANES (6) at a time, a pytest each, and the fault files
# alone after them (GRAPE_CHECK_SHARDS=1: one pytest over every file, one file after another).
# GRAPE_CHECK_PART=tests runs the build and the tests only,
# GRAPE_CHECK_PART=smokes the build and the benchmark smokes only (the two halves fit one device
# call each; the build is incremental on a machine that ran the other).
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
  timeout --signal=ABRT "${step_timeout:-${GRAPE_STEP_TIMEOUT:-300}}" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: rc=$rc"
  [ "$rc" -eq 0 ] || status=1
}
# The GPU machine has no network: build in place through setup.py (no pip build environment).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ "${GRAPE_CHECK_BUILD:-1}" = 0 ] || step build env GRAPE_CUDA_ARCHS="${GRAPE_CUDA_ARCHS:-90}" python3 setup.py -q build_ext --inplace
[ "$status" -eq 0 ] || exit 1
if [ "$part" != smokes ]; then
# The slowest tests are listed; where pytest-timeout is installed, a test that hangs fails alone.
timeout_flag=$(python3 -c "import pytest_timeout" 2>/dev/null && echo --timeout=300)
pytest_step() {  # pytest_step NAME FILES...: the suite's pytest run over FILES, logged as NAME
  local name=$1 step_timeout=$(( 3 * ${GRAPE_STEP_TIMEOUT:-300} )); shift
  step "$name" python3 -m pytest "$@" -q -rs -p no:cacheprovider --durations=25 $timeout_flag \
    --junitxml="$out/$name.xml"
}
tests_step() {  # ctest, then pytest over FILES, then the 10,000-call fuzz
  step ctest ctest --test-dir build/cmake --output-on-failure
  pytest_step "$@"
  step fuzz env GRAPE_FUZZ_CALLS=10000 python3 -m pytest tests/python/test_fuzz_gpu.py -q -rs -p no:cacheprovider
}
rm -f "$out"/pytest*.xml "$out"/pytest*.log "$out"/pytest*.out  # an earlier run's, which the checks
# below would read
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -ge 2 ] && [ "${GRAPE_CHECK_SHARDS:-2}" != 1 ]; then
  # Two lanes side by side, so that the suite fits a device call: the fault and distributed tests
  # (they fill a GPU's memory, or use two GPUs) with every GPU visible; ctest, the other tests
  # and the fuzz on the last GPU alone, which only the 2-rank tests share.
  visible=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((gpus - 1)))}
  machine=(tests/python/test_faults*.py tests/python/test_distributed*.py)
  mapfile -t rest < <(ls tests/python/test_*.py | grep -v -e /test_faults -e /test_distributed)
  (pytest_step pytest-machine "${machine[@]}"; exit $status) > "$out/lane-machine.out" 2>&1 &
  machine_lane=$!
  (export CUDA_VISIBLE_DEVICES=${visible##*,}; tests_step pytest "${rest[@]}"; exit $status) \
    > "$out/lane-last-gpu.out" 2>&1 &
  last_gpu_lane=$!
  wait "$machine_lane" || status=1
  wait "$last_gpu_lane" || status=1
  grep -h '^== ' "$out/lane-machine.out" "$out/lane-last-gpu.out"
elif [ "${GRAPE_CHECK_SHARDS:-2}" != 1 ]; then
  # One GPU, shared by files side by side (the suite passes on a loaded GPU), so that the tests
  # half fits a device call: the longest files first, each in a pytest of its own (the fuzz at
  # 10,000 calls), so that no lane waits behind another's; then the fault files alone, as they
  # fill the GPU's memory.
  step ctest ctest --test-dir build/cmake --output-on-failure
  mapfile -t by_length < <(ls tests/python/test_*.py | grep -v /test_faults | xargs wc -l |
                           grep -v ' total$' | sort -rn | awk '{print $2}')
  lanes=${GRAPE_CHECK_LANES:-6}
  running=0
  for file in "${by_length[@]}"; do
    if [ "$running" -ge "$lanes" ]; then wait -n; running=$((running - 1)); fi
    name=pytest-$(basename "$file" .py)
    calls=1000; [ "$name" = pytest-test_fuzz_gpu ] && calls=10000
    (GRAPE_FUZZ_CALLS=$calls pytest_step "$name" "$file" > "$out/$name.out" 2>&1
     grep '^== .*rc=' "$out/$name.out") &
    running=$((running + 1))
  done
  wait
  for file in "${by_length[@]}"; do  # a pytest stopped before its end wrote no counts
    name=pytest-$(basename "$file" .py)
    [ -f "$out/$name.xml" ] || { echo "$name: no results (stopped?)"; status=1; }
  done
  pytest_step pytest-faults tests/python/test_faults*.py
else
  tests_step pytest tests/python
fi
python3 - "$out" <<'PY' || status=1  # the counts of the whole suite, over the lanes' pytest runs
import glob, sys, xml.etree.ElementTree as ET
totals = dict(tests=0, failures=0, errors=0, skipped=0)
paths = sorted(glob.glob(f"{sys.argv[1]}/pytest*.xml"))  # a lane stopped before its end wrote none
for path in paths:
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
print(f"pytest, all lanes: {passed} passed, {totals['failures']} failed, {totals['errors']} errors, "
      f"{totals['skipped']} skipped (from {', '.join(p.rsplit('/', 1)[1] for p in paths) or 'no run'})")
sys.exit(1 if totals["failures"] or totals["errors"] or not paths else 0)
PY
if grep -q 'skipped="[1-9]' "$out"/pytest*.xml && grep -q "no CUDA device" "$out"/pytest*.log; then
  echo "GPU tests were skipped on a GPU machine"; status=1
fi
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
