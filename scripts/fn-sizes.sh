#!/usr/bin/env bash
# Lists the largest Rust functions of the workspace: lines from `fn` to its
# closing brace, largest first.
#   scripts/fn-sizes.sh [-n COUNT] [PATH...]   (default: 20, the workspace crates)
# Braces are counted outside strings, chars and comments, so the sizes are
# exact for ordinary code; a function inside a macro body counts too.
set -euo pipefail
count=20
if [[ "${1:-}" == "-n" ]]; then count=$2; shift 2; fi
cd "$(dirname "$0")/.."
paths=("$@")
[[ ${#paths[@]} -eq 0 ]] && paths=(ir passes codegen runtime frontend derive src tests benches)
find "${paths[@]}" -name '*.rs' -not -path '*/target/*' -print0 2>/dev/null |
python3 -c '
import re, sys
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?((const|async|unsafe|extern\s+\"[^\"]*\")\s+)*fn\s+(\w+)")
def strip(line, state):
    """The line without strings, chars and comments; state carries /* */ and raw strings."""
    out, i = [], 0
    while i < len(line):
        if state["block"]:
            j = line.find("*/", i)
            if j < 0: return "".join(out)
            state["block"], i = False, j + 2
            continue
        if state["raw"]:
            j = line.find(state["raw"], i)
            if j < 0: return "".join(out)
            i, state["raw"] = j + len(state["raw"]), None
            continue
        c = line[i]
        if line.startswith("//", i): break
        if line.startswith("/*", i): state["block"] = True; i += 2; continue
        m = re.match(r"b?r(#*)\"", line[i:])
        if m and (i == 0 or not (line[i-1].isalnum() or line[i-1] == "_")):
            state["raw"], i = "\"" + m.group(1), i + m.end(); continue
        if c == "\"":
            i += 1
            while i < len(line) and line[i] != "\"":
                i += 2 if line[i] == "\\" else 1
            if i >= len(line): state["raw"] = "\""  # a string running on
            i += 1; continue
        if c == "\x27":
            m = re.match(r"\x27(\\.|[^\\\x27])\x27", line[i:]) or re.match(r"\x27\\u\{[0-9a-fA-F]+\}\x27", line[i:])
            if m: i += m.end(); continue
        out.append(c); i += 1
    return "".join(out)
rows = []
for path in sys.stdin.read().split("\0"):
    if not path: continue
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    state = {"block": False, "raw": None}
    code = [strip(l, state) for l in lines]
    for n, l in enumerate(code):
        m = FN.match(l)
        if not m: continue
        depth, opened = 0, False
        for k in range(n, len(code)):
            for ch in code[k]:
                if ch == "{": depth += 1; opened = True
                elif ch == "}": depth -= 1
                elif ch == ";" and not opened and depth == 0: break
            else:
                if opened and depth <= 0:
                    rows.append((k - n + 1, path, n + 1, m.group(5)))
                    break
                continue
            break
rows.sort(key=lambda r: (-r[0], r[1], r[2]))
for size, path, line, name in rows[:int(sys.argv[1])]:
    print(f"{size:5}  {name}  {path}:{line}")
' "$count"
