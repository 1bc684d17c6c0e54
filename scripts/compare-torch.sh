#!/usr/bin/env bash
# kiln beside PyTorch on the same machine: runs `kiln bench --json` and
# benches/torch_baseline.py --json alternately, one workload at a time,
# REPEATS times each, then prints
# per workload the median over repeats of (PyTorch best ms / kiln best ms):
# above 1 means kiln's best mode (eager or compiled) is faster than PyTorch's
# best (eager or torch.compile) in the same repeat. Never run in CI.
#
#   scripts/compare-torch.sh                      # W1-W7, ResNet18, MobileNetV3; 3 repeats
#   scripts/compare-torch.sh -r 5 -o ResNet18     # one workload, 5 repeats
#   scripts/compare-torch.sh -p /opt/torchvenv/bin/python -t 2
#
# -p PYTHON   a Python with torch and torchvision (default /opt/torchvenv/bin/python)
# -r REPEATS  alternating repeats (default 3)
# -o LIST     comma-separated workloads (default W1,W2,W3,W4,W5,W6,W7,ResNet18,MobileNetV3;
#             also GPT2, ResNet34, ResNet50, MobileNetV3Large, EfficientNetB0, ViTB16)
# -t THREADS  torch.set_num_threads (default: the number of CPUs)
# -k DIR      keep the raw JSON lines of every run in DIR
# KILN=PATH   the kiln binary (default target/release/kiln, built first)
# KILN_CACHE_DIR  kiln's cache (default: a fresh one for this run, so conv
#             algorithms are timed by this build, not remembered from an older one)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/opt/torchvenv/bin/python
REPEATS=3
ONLY=W1,W2,W3,W4,W5,W6,W7,ResNet18,MobileNetV3
THREADS=$(nproc)
KEEP=""
while getopts "p:r:o:t:k:" opt; do
  case $opt in
    p) PY=$OPTARG ;;
    r) REPEATS=$OPTARG ;;
    o) ONLY=$OPTARG ;;
    t) THREADS=$OPTARG ;;
    k) KEEP=$OPTARG ;;
    *) sed -n '2,18p' "$0"; exit 2 ;;
  esac
done
if ! "$PY" -c "import torch, torchvision" 2>/dev/null; then
  echo "compare-torch: $PY cannot import torch and torchvision (pip install torch torchvision in a venv outside the repository)" >&2
  exit 1
fi
if [ -z "${KILN:-}" ]; then
  cargo build --release --quiet
  KILN=target/release/kiln
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$OUT/kiln-cache}"
echo "ISA: $(grep -o -m1 -w 'avx512f\|avx2' /proc/cpuinfo | sort -u | tail -1 || echo unknown); $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
# Per repeat, each workload runs in a kiln process and a PyTorch process back
# to back, the side that goes first alternating by repeat, so the two
# figures of a pair are seconds apart: neighbours' load on a shared machine
# drifts over minutes. W1 brings its copy floor (W8-64MiB) along.
kiln_run() {
  local only=$1
  [ "$only" = W1 ] && only=W1,W8-64MiB
  "$KILN" bench --json --only "$only" | grep '^{' >> "$OUT/kiln.$r.json"
}
torch_run() {
  "$PY" benches/torch_baseline.py --json --no-wait --threads "$THREADS" --only "$1" \
    | grep '^{' >> "$OUT/torch.$r.json"
}
for r in $(seq 1 "$REPEATS"); do
  : > "$OUT/kiln.$r.json"
  : > "$OUT/torch.$r.json"
  for w in ${ONLY//,/ }; do
    echo "repeat $r/$REPEATS: $w" >&2
    if [ $((r % 2)) = 1 ]; then kiln_run "$w"; torch_run "$w"; else torch_run "$w"; kiln_run "$w"; fi
  done
done
[ -n "$KEEP" ] && mkdir -p "$KEEP" && cp "$OUT"/*.json "$KEEP"/
python3 - "$OUT" "$REPEATS" <<'EOF'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def best(path):
    b = {}
    for line in open(path):
        r = json.loads(line)
        w, ms = r["workload"], r["median_ms"]
        if r.get("mode", "").startswith("compile-"):
            continue  # compile-latency rows time no workload
        b.setdefault(w, {})[r["mode"]] = ms
    return b
ratios, kms, tms = {}, {}, {}
for i in range(1, repeats + 1):
    k, t = best(f"{out}/kiln.{i}.json"), best(f"{out}/torch.{i}.json")
    for w in k:
        if w in t:
            kb, tb = min(k[w].values()), min(t[w].values())
            ratios.setdefault(w, []).append(tb / kb)
            kms.setdefault(w, []).append(k[w])
            tms.setdefault(w, []).append(t[w])
def med_modes(rows):
    modes = sorted({m for r in rows for m in r})
    return ", ".join(f"{m} {statistics.median([r[m] for r in rows if m in r]):.3f}" for m in modes)
print(f"| workload | kiln best / PyTorch best (median of {repeats}; >1 = kiln faster) | per repeat | kiln ms (median) | PyTorch ms (median) |")
print("|---|---:|---|---|---|")
for w, rs in ratios.items():
    print(f"| {w} | {statistics.median(rs):.2f}x | {' '.join(f'{x:.2f}' for x in rs)} | {med_modes(kms[w])} | {med_modes(tms[w])} |")
# W1 against the copy floor measured beside it: kiln's best W1 / the 64 MiB copy
floor = []
for i in range(1, repeats + 1):
    k = best(f"{out}/kiln.{i}.json")
    if "W1" in k and "W8-64MiB" in k:
        floor.append(min(k["W1"].values()) / k["W8-64MiB"]["eager"])
if floor:
    print()
    print(f"W1 / copy floor (W8-64MiB, same process): median {statistics.median(floor):.2f}x; per repeat {' '.join(f'{x:.2f}' for x in floor)}")
# compile() to first output and kiln's peak memory of one call, medians over repeats
extra = {}
for side in ("kiln", "torch"):
    for i in range(1, repeats + 1):
        for line in open(f"{out}/{side}.{i}.json"):
            r = json.loads(line)
            for key in ("compile_ms", "peak_mb"):
                if key in r and not r.get("mode", "").startswith("compile-"):
                    extra.setdefault(r["workload"], {}).setdefault(f"{side} {r['mode']} {key}", []).append(r[key])
print()
print("| workload | compile ms (first output) and peak MiB, median |")
print("|---|---|")
for w in ratios:
    e = extra.get(w, {})
    print(f"| {w} | {', '.join(f'{k} {statistics.median(v):.1f}' for k, v in sorted(e.items()))} |")
EOF
