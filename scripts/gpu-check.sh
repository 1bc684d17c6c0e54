#!/usr/bin/env bash
# gpu-check.sh: the one prepared command for the H200 machine (issue 6 item 5).
#
# Two stages:
#   scripts/gpu-check.sh build [--dry-run]
#       Here (CPU, Rust toolchain; honours CARGO_TARGET_DIR): builds in release
#       the NVRTC test of kiln-codegen (cuda_nvrtc), kiln's device tests
#       (cuda_device: every forward fixture suite on a CUDA device, eager and
#       compiled; cuda_modules: modules moved with to_device, a training step,
#       compile on the device, Conv+BN+ReLU and Linear+ReLU as one launch;
#       cuda_ops: pooling, embedding, conv_transpose2d against the CPU) and the
#       `kiln` binary; copies them, stripped,
#       into .gpu/bin/ and the PyTorch baseline into .gpu/bench/, and makes sure
#       .git/info/exclude ignores .gpu/. With --dry-run it then also runs the
#       device stage in dry mode (every command is printed, nothing GPU-side is
#       executed) to check the paths.
#   scripts/gpu-check.sh device [--dry-run]
#       There (device tool `run`, carry [".gpu"], no Rust toolchain, no network;
#       the working tree is a copy at the cwd, so the tests read their fixtures
#       from ./tests/fixtures via KILN_FIXTURES): finds NVRTC (CUDA toolkit
#       lib64 or python3's nvidia/cu13/lib), records nvidia-smi, then with
#       KILN_CUDA=driver runs
#         cuda_nvrtc    `nvrtc: N kernels compiled, 0 failed`
#         cuda_device   `cuda SUITE: P/T` and `cuda compiled SUITE: P/T` per
#                       suite, and the ops that ran on the host
#         cuda_modules  `cuda modules mlp|cnn: ...` and its test result
#         cuda_ops      pooling/embedding/conv_transpose2d on the device
#         kiln bench --device cuda --only W1,W2,W3,W4,W7 (eager and compiled)
#       and `torch_baseline.py --device cuda --json` for the same workloads;
#       logs under $OUT (or .gpu/out when $OUT is unset). Every step has its
#       own `timeout`, and all of them share a budget of GPU_CHECK_BUDGET
#       seconds (default 300).
#
# Typical use: `scripts/gpu-check.sh build`, then the device tool's
#   run(command="bash scripts/gpu-check.sh device", carry=[".gpu"], timeout_s=420)
#
# NOT POSSIBLE YET (extend here when kiln has them):
#   - GEMM and convolution are tiled template kernels (64x64 tiles, 4x4 per
#     thread, CUDA cores only): no tensor-core (mma/wgmma) path and no cuBLAS
#     or cuDNN, so large GEMMs and convs stay well below the H200's peak.
#   - `kiln bench --device cuda` times the inference workloads only; the
#     training steps W5/W6 (and W8, the host copy reference) are CPU-only.
#   - The CPU-shim tests (codegen/tests/cuda_shim.rs, cuda_templates.rs, and
#     the emulator runs of cuda_device/cuda_modules/cuda_bench) are not run
#     there: they need a C++ compiler and cache under this machine's target
#     dir; they run in CI here.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 3>&1 # the console, for lines of commands whose output goes to a log

STAGE="${1:-}"
DRY=0
for a in "$@"; do [ "$a" = "--dry-run" ] && DRY=1; done
GPU_DIR=.gpu
# Test targets of kiln-codegen whose release binaries the device runs.
TEST_TARGETS=(cuda_nvrtc)
# Test targets of the kiln package (tests/*.rs) whose release binaries the device runs.
KILN_TEST_TARGETS=(cuda_device cuda_modules cuda_ops)
# Workloads `kiln bench --device cuda` and the torch baseline time there.
DEVICE_WORKLOADS=W1,W2,W3,W4,W7
# Seconds the device stage may take in all (each step gets what is left, at most its own cap).
BUDGET="${GPU_CHECK_BUDGET:-300}"

say() { echo "gpu-check: $*"; }
run() {
  if [ "$DRY" = 1 ] && [ "${DEVICE_DRY:-0}" = 1 ]; then
    echo "+ (dry) $*" >&3
  else
    echo "+ $*" >&3
    "$@"
  fi
}

# carry_exe BUILD_JSON TARGET KIND: copies the newest executable cargo built
# for TARGET of KIND (test or bin) into .gpu/bin, stripped (a release binary
# with line tables is ~65 MB, stripped ~10 MB; the carry limit is 64 MiB).
carry_exe() {
  local json="$1" t="$2" kind="$3" exe
  exe="$(jq -r --arg t "$t" --arg k "$kind" 'select(.reason == "compiler-artifact" and .target.name == $t
      and (.target.kind | index($k)) and .executable != null) | .executable' "$json" | tail -1)"
  [ -n "$exe" ] && [ -x "$exe" ] || { say "no release $kind binary for $t"; exit 1; }
  cp -f "$exe" "$GPU_DIR/bin/$t"
  if command -v strip >/dev/null; then strip "$GPU_DIR/bin/$t"; fi
  say "carried $t <- $exe ($(du -h "$GPU_DIR/bin/$t" | cut -f1))"
}

build_here() {
  command -v cargo >/dev/null || { say "cargo not found: the build stage runs on the CPU machine"; exit 1; }
  mkdir -p "$GPU_DIR/bin" "$GPU_DIR/bench"
  local excl
  excl="$(git rev-parse --git-path info/exclude)"
  grep -qxF '.gpu/' "$excl" 2>/dev/null || echo '.gpu/' >>"$excl"
  local json="$GPU_DIR/build.json"
  cargo test --release --no-run -p kiln-codegen --message-format=json >"$json"
  local tests=() t
  for t in "${KILN_TEST_TARGETS[@]}"; do tests+=(--test "$t"); done
  cargo test --release --no-run -p kiln "${tests[@]}" --message-format=json >>"$json"
  cargo build --release -p kiln --bin kiln --message-format=json >>"$json"
  for t in "${TEST_TARGETS[@]}" "${KILN_TEST_TARGETS[@]}"; do carry_exe "$json" "$t" test; done
  carry_exe "$json" kiln bin
  local tb=""
  for c in ../shared/bench/torch_baseline.py shared/bench/torch_baseline.py; do
    [ -f "$c" ] && { tb="$c"; break; }
  done
  if [ -n "$tb" ]; then cp -f "$tb" "$GPU_DIR/bench/torch_baseline.py"; else say "torch_baseline.py not found"; fi
  du -sh "$GPU_DIR" | sed 's/^/gpu-check: carry size /'
  local kib
  kib="$(du -sk "$GPU_DIR" | cut -f1)"
  [ "$kib" -lt $((60 * 1024)) ] || say "WARNING: $GPU_DIR is over 60 MiB; the device tool carries at most 64 MiB"
  say "next: run(command=\"bash scripts/gpu-check.sh device\", carry=[\".gpu\"], timeout_s=420)"
}

find_nvrtc() {
  local d
  for d in "$PWD"/.venv-nvrtc/lib/python3*/site-packages/nvidia/cu13/lib \
    /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then echo "$d"; return 0; fi
  done
  if command -v python3 >/dev/null; then
    d="$(python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
for p in site.getsitepackages() + [site.getusersitepackages()]:
    for g in glob.glob(p + "/nvidia/cu1*/lib") + glob.glob(p + "/nvidia/cuda_nvrtc/lib"):
        if glob.glob(g + "/libnvrtc.so*"):
            print(g); sys.exit(0)
PY
)"
    [ -n "$d" ] && { echo "$d"; return 0; }
  fi
  d="$(ldconfig -p 2>/dev/null | awk '/libnvrtc\.so/ {print $NF; exit}')"
  [ -n "$d" ] && { dirname "$d"; return 0; }
  return 1
}

# left CAP: seconds for the next step: CAP, or what is left of BUDGET if less (at least 5).
left() {
  local rest=$((DEADLINE - SECONDS))
  [ "$rest" -gt 5 ] || rest=5
  [ "$1" -lt "$rest" ] && echo "$1" || echo "$rest"
}

run_device() {
  DEADLINE=$((SECONDS + BUDGET))
  local out="${OUT:-$GPU_DIR/out}"
  mkdir -p "$out"
  say "logs in $out"
  [ -d "$GPU_DIR/bin" ] || { say "no $GPU_DIR/bin: run the build stage here and carry .gpu"; exit 1; }
  { nvidia-smi || true; } >"$out/nvidia-smi.txt" 2>&1 || true
  local nv
  if nv="$(find_nvrtc)"; then
    say "NVRTC in $nv"
    export LD_LIBRARY_PATH="$nv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    say "NVRTC not found (the nvrtc test will skip)"
  fi
  export KILN_CUDA=driver
  # the carried tree is a copy at the cwd, not where the tests were built
  export KILN_FIXTURES="$PWD/tests/fixtures"
  # CUBINs cached outside $OUT, so they do not travel back
  export KILN_CACHE_DIR="${TMPDIR:-/tmp}/kiln-gpu-check"
  local status=0 t
  local cap
  for t in "${TEST_TARGETS[@]}" "${KILN_TEST_TARGETS[@]}"; do
    # cuda_device compiles a few hundred kernels with NVRTC on first launch
    case "$t" in cuda_device) cap=100 ;; *) cap=45 ;; esac
    run timeout "$(left "$cap")" "$GPU_DIR/bin/$t" --nocapture >"$out/$t.log" 2>&1 || status=1
    grep -E 'nvrtc:|cuda |test result|panicked' "$out/$t.log" || true
  done
  run timeout "$(left 60)" "$GPU_DIR/bin/kiln" bench --device cuda --only "$DEVICE_WORKLOADS" \
    >"$out/kiln_bench_cuda.txt" 2>&1 || status=1
  cat "$out/kiln_bench_cuda.txt" || true
  local tb="$GPU_DIR/bench/torch_baseline.py"
  [ -f "$tb" ] || tb=../shared/bench/torch_baseline.py
  if [ -f "$tb" ]; then
    run timeout "$(left 120)" python3 "$tb" --device cuda --json --only "$DEVICE_WORKLOADS" \
      >"$out/torch_baseline_cuda.txt" 2>&1 || status=1
    tail -n 40 "$out/torch_baseline_cuda.txt" || true
  else
    say "torch_baseline.py not carried"
  fi
  say "device stage done (status $status)"
  return "$status"
}

case "$STAGE" in
  build)
    build_here
    if [ "$DRY" = 1 ]; then
      say "dry run of the device stage:"
      DEVICE_DRY=1 OUT="$GPU_DIR/dry-out" run_device
    fi
    ;;
  device)
    if [ "$DRY" = 1 ]; then DEVICE_DRY=1 run_device; else run_device; fi
    ;;
  *)
    echo "usage: $0 build [--dry-run] | device [--dry-run]" >&2
    exit 2
    ;;
esac
