#!/usr/bin/env bash
# Checks kiln's ONNX importer against real PyTorch exports (issue #21: "we
# hold back real exported models to check the importer"). Not part of CI.
#
#   scripts/onnx-torch-check.sh [-p TORCH_PYTHON] [-o OUT_DIR] [-t TOL] [MODEL ...]
#
# torch.onnx.export (opset 17, the TorchScript path) writes torchvision's
# resnet18, mobilenet_v3_small, efficientnet_b0, vit_b_16, an nn.LSTM and
# nn.GRU with a dynamic sequence, an nn.TransformerEncoder and tiny
# transformers GPT-2/BERT (random weights, eval; scripts/onnx_torch_check.py);
# onnxruntime runs each file on two inputs (two batch sizes, and two
# sequence lengths for the sequence models); `kiln run` loads it with
# kiln::onnx::load and runs the same inputs eagerly and with --compile; one
# table row per model and mode compares kiln with onnxruntime (max abs
# difference over every output; ok at TOL, default 1e-4).
#
# Needs a Python with torch, torchvision and transformers (default
# /opt/torchvenv/bin/python) and the onnx + onnxruntime of .venv-onnx (added
# to its path); skips with a message, exit 0, when either is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/opt/torchvenv/bin/python
OUT=${TMPDIR:-/tmp}/kiln-onnx-torch-check
TOL=1e-4
while getopts "p:o:t:" opt; do
    case $opt in
        p) PY=$OPTARG ;;
        o) OUT=$OPTARG ;;
        t) TOL=$OPTARG ;;
        *) sed -n '2,19p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
ONNX_SITE=$(ls -d "$PWD"/.venv-onnx/lib/python3*/site-packages 2>/dev/null | head -1 || true)
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ONNX_SITE"
if ! [ -x "$PY" ] || ! "$PY" -c "import torch, torchvision, onnx, onnxruntime, safetensors" 2>/dev/null; then
    echo "onnx-torch-check: SKIPPED (no $PY with torch, torchvision, and onnx/onnxruntime from .venv-onnx)"
    exit 0
fi
mkdir -p "$OUT"
cargo build --workspace --features kiln/mpi --bin kiln 2>&1 | tail -1
KILN=target/debug/kiln
"$PY" scripts/onnx_torch_check.py export "$OUT" "$@" 2>"$OUT/export.log" || {
    echo "onnx-torch-check: the export failed, see $OUT/export.log"; exit 1; }
echo
echo "| model | mode | result | max abs diff vs onnxruntime | output shapes | graph |"
echo "|---|---|---|---|---|---|"
status=0
for cases in "$OUT"/*.cases; do
    name=$(basename "$cases" .cases)
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
    for mode in eager compiled; do
        flag=""
        [ $mode = compiled ] && flag="--compile"
        failed=""
        while read -r k args; do
            # shellcheck disable=SC2086
            if ! err=$("$KILN" run "$OUT/$name.onnx" $args $flag --output "$OUT/$name.case$k.$mode.safetensors" 2>&1 >/dev/null); then
                failed=$(echo "$err" | grep -m1 -i "error" || echo "$err" | tail -1)
                break
            fi
        done <"$cases"
        if [ -n "$failed" ]; then
            echo "| $name | $mode | FAIL: ${failed//|/\\|} | | | |"
            status=1
        elif ! "$PY" scripts/onnx_torch_check.py compare "$OUT" "$name" $mode "$TOL"; then
            status=1
        fi
    done
done
exit $status
