#!/usr/bin/env bash
# Full-size PyTorch checkpoints in f32, f16 and bf16 load into kiln::models
# with a strict report and compute PyTorch's output (issue #16 item 3). Not
# part of CI (CI's torch-free check is tests/zoo_checkpoint_dtypes.rs).
#
#   scripts/torch-checkpoint-check.sh [-p TORCH_PYTHON] [-o OUT_DIR] [-t TOL] [MODEL ...]
#
# scripts/torch_checkpoint_check.py saves torchvision resnet18,
# mobilenet_v3_small, efficientnet_b0, vit_b_16 (weights=None, seed 0, eval)
# and transformers GPT2LMHeadModel(GPT2Config()) (GPT-2 small, save_pretrained,
# so without the tied lm_head.weight) as safetensors in f32, f16 and bf16 under
# torchvision's / Hugging Face's key names, with a fixed input and PyTorch's
# output for each dtype; examples/checkpoint_check.rs loads each file into the
# kiln model strictly (no missing or unexpected key) and prints
# `ckpt MODEL DTYPE: ok max_abs=...`.
#
# What is compared: for f16 and bf16, kiln's f32 model holding the file's
# weights (upcast exactly on load) against PyTorch's f32 model holding the
# same reduced-precision weights upcast to f32; so all three dtypes are held
# to the f32 tolerance max|kiln - torch| <= TOL * max|torch|, TOL 1e-4
# by default. `vs_f32=` on each line is the distance to the f32 checkpoint's
# output (the cost of rounding the weights), shown, not checked.
#
# Needs a Python with torch, torchvision, transformers and safetensors
# (default /opt/torchvenv/bin/python); skips with a message, exit 0, without.
# The checkpoints take about 2 GB in OUT_DIR (default $TMPDIR/kiln-ckpt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/opt/torchvenv/bin/python
OUT=${TMPDIR:-/tmp}/kiln-ckpt
TOL=1e-4
while getopts "p:o:t:" opt; do
    case $opt in
        p) PY=$OPTARG ;;
        o) OUT=$OPTARG ;;
        t) TOL=$OPTARG ;;
        *) sed -n '2,27p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if ! [ -x "$PY" ] || ! "$PY" -c "import torch, torchvision, transformers, safetensors" 2>/dev/null; then
    echo "torch-checkpoint-check: SKIPPED (no $PY with torch, torchvision, transformers and safetensors)"
    exit 0
fi
mkdir -p "$OUT"
"$PY" scripts/torch_checkpoint_check.py "$OUT" "$@"
cargo run --release --quiet --example checkpoint_check -- "$OUT" "$TOL" "$@"
