#!/usr/bin/env bash
# Two variants of `kiln bench --json` run alternately, REPEATS times each, on a
# shared (noisy) machine: per workload and mode, the median over repeats of
# each variant's median_ms, in ms and in µs per call, and the ratio B/A.
# A variant is an environment (`-a`/`-b`, e.g. KILN_PROGRAM=0) and a kiln
# binary (`-A`/`-B`, e.g. a release build of another commit). Never run in CI.
#
#   scripts/alternate-bench.sh -o CNN-b1 -a KILN_PROGRAM=0 -b KILN_PROGRAM=1
#       # per-call overhead of the digits CNN at batch 1: eager, compiled node
#       # by node (A) and compiled replaying its launch list (B)
#   scripts/alternate-bench.sh -o W2,W2F,W3 -A /tmp/kiln-before -B target/release/kiln
#
# -o LIST     comma-separated workloads (default CNN-b1)
# -r REPEATS  alternating repeats (default 5)
# -a ENV      variant A's environment, VAR=VALUE[,VAR=VALUE...] (default none)
# -b ENV      variant B's environment (default none)
# -A KILN     variant A's binary (default target/release/kiln, built here)
# -B KILN     variant B's binary (default target/release/kiln)
# -i ITERS    kiln bench --iters (default: kiln's own)
set -euo pipefail
cd "$(dirname "$0")/.."
ONLY=CNN-b1
REPEATS=5
ENV_A=""
ENV_B=""
BIN_A=target/release/kiln
BIN_B=target/release/kiln
ITERS=()
while getopts "o:r:a:b:A:B:i:" opt; do
  case $opt in
    o) ONLY=$OPTARG ;;
    r) REPEATS=$OPTARG ;;
    a) ENV_A=$OPTARG ;;
    b) ENV_B=$OPTARG ;;
    A) BIN_A=$OPTARG ;;
    B) BIN_B=$OPTARG ;;
    i) ITERS=(--iters "$OPTARG") ;;
    *) sed -n '2,19p' "$0"; exit 2 ;;
  esac
done
if [ "$BIN_A" = target/release/kiln ] || [ "$BIN_B" = target/release/kiln ]; then
  cargo build --release --quiet
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "ISA: $(grep -o -m1 -w 'avx512f\|avx2' /proc/cpuinfo | sort -u | tail -1 || echo unknown); $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # variant env binary repeat
  local envs=()
  [ -n "$2" ] && IFS=, read -ra envs <<< "$2"
  env "${envs[@]}" "$3" bench --json --only "$ONLY" "${ITERS[@]}" | grep '^{' > "$OUT/$1.$4.json"
}
for r in $(seq 1 "$REPEATS"); do
  echo "repeat $r/$REPEATS" >&2
  run A "$ENV_A" "$BIN_A" "$r"
  run B "$ENV_B" "$BIN_B" "$r"
done
python3 - "$OUT" "$REPEATS" "A: $ENV_A $BIN_A" "B: $ENV_B $BIN_B" <<'EOF'
import json, statistics, sys
out, repeats, name_a, name_b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = {}
for v in "AB":
    for r in range(1, repeats + 1):
        for line in open(f"{out}/{v}.{r}.json"):
            row = json.loads(line)
            runs.setdefault((row["workload"], row["mode"]), {}).setdefault(v, []).append(row["median_ms"])
print(name_a)
print(name_b)
print(f"{'workload':10} {'mode':9} {'A ms':>9} {'A us':>9} {'B ms':>9} {'B us':>9} {'B/A':>6}  (medians of {repeats} alternating repeats)")
for (w, mode), vs in runs.items():
    a, b = (statistics.median(vs[v]) if v in vs else float("nan") for v in "AB")
    print(f"{w:10} {mode:9} {a:9.4f} {a * 1e3:9.1f} {b:9.4f} {b * 1e3:9.1f} {b / a:6.3f}")
EOF
