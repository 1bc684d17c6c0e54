#!/usr/bin/env bash
# gpu-check.sh: the one prepared command for the H200 machine (issue 6 item 5).
#
# Two stages:
#   scripts/gpu-check.sh build [--dry-run]
#       Here (CPU, Rust toolchain): `cargo test --release --no-run -p kiln-codegen`,
#       copies the test binaries the device needs into .gpu/bin/ and the PyTorch
#       baseline into .gpu/bench/, and makes sure .git/info/exclude ignores .gpu/.
#       With --dry-run it then also runs the device stage in dry mode (every
#       command is printed, nothing GPU-side is executed) to check the paths.
#   scripts/gpu-check.sh device [--dry-run]
#       There (device tool `run`, carry [".gpu"], no Rust toolchain, no network):
#       finds NVRTC (CUDA toolkit lib64 or python3's nvidia/cu13/lib), records
#       nvidia-smi, runs the NVRTC test binary (`nvrtc: N kernels compiled,
#       0 failed`) and `torch_baseline.py --device cuda --json`, logs under
#       $OUT (or .gpu/out when $OUT is unset). Budget: about 5 minutes.
#
# Typical use: `scripts/gpu-check.sh build`, then the device tool's
#   run(command="bash scripts/gpu-check.sh device", carry=[".gpu"], timeout_s=420)
#
# NOT POSSIBLE YET (extend here when kiln has them):
#   - kiln has no Device::Cuda, CUDA launches or CUDA tensors yet, so there are
#     no `cuda SUITE: P/T` fixture runs on the GPU, no compiled modules on CUDA
#     and no `kiln bench --device cuda` (W1-W4, W7). When they land: add the
#     fixture test binaries to TEST_TARGETS (or a `kiln` binary to build) and
#     run them in run_device beside the torch baseline.
#   - The CPU-shim test (tests/cuda_shim.rs) is not run there: it needs a C++
#     compiler and caches under this machine's target dir; it runs in CI here.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 3>&1 # the console, for lines of commands whose output goes to a log

STAGE="${1:-}"
DRY=0
for a in "$@"; do [ "$a" = "--dry-run" ] && DRY=1; done
GPU_DIR=.gpu
# Test targets of kiln-codegen whose release binaries the device runs.
TEST_TARGETS=(cuda_nvrtc)

say() { echo "gpu-check: $*"; }
run() {
  if [ "$DRY" = 1 ] && [ "${DEVICE_DRY:-0}" = 1 ]; then
    echo "+ (dry) $*" >&3
  else
    echo "+ $*" >&3
    "$@"
  fi
}

build_here() {
  command -v cargo >/dev/null || { say "cargo not found: the build stage runs on the CPU machine"; exit 1; }
  mkdir -p "$GPU_DIR/bin" "$GPU_DIR/bench"
  local excl
  excl="$(git rev-parse --git-path info/exclude)"
  grep -qxF '.gpu/' "$excl" 2>/dev/null || echo '.gpu/' >>"$excl"
  local json="$GPU_DIR/build.json"
  cargo test --release --no-run -p kiln-codegen --message-format=json >"$json"
  for t in "${TEST_TARGETS[@]}"; do
    local exe
    exe="$(jq -r --arg t "$t" 'select(.reason == "compiler-artifact" and .target.name == $t
        and (.target.kind | index("test")) and .executable != null) | .executable' "$json" | tail -1)"
    [ -n "$exe" ] && [ -x "$exe" ] || { say "no release test binary for $t"; exit 1; }
    cp -f "$exe" "$GPU_DIR/bin/$t"
    say "carried $t <- $exe"
  done
  local tb=""
  for c in ../shared/bench/torch_baseline.py shared/bench/torch_baseline.py; do
    [ -f "$c" ] && { tb="$c"; break; }
  done
  if [ -n "$tb" ]; then cp -f "$tb" "$GPU_DIR/bench/torch_baseline.py"; else say "torch_baseline.py not found"; fi
  du -sh "$GPU_DIR" | sed 's/^/gpu-check: carry size /'
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

run_device() {
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
  local status=0 t
  for t in "${TEST_TARGETS[@]}"; do
    run timeout 180 "$GPU_DIR/bin/$t" --nocapture >"$out/$t.log" 2>&1 || status=1
    grep -E 'nvrtc:|cuda-shim|cuda |test result' "$out/$t.log" || true
  done
  local tb="$GPU_DIR/bench/torch_baseline.py"
  [ -f "$tb" ] || tb=../shared/bench/torch_baseline.py
  if [ -f "$tb" ]; then
    run timeout 240 python3 "$tb" --device cuda --json >"$out/torch_baseline_cuda.txt" 2>&1 || status=1
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
