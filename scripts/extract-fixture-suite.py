#!/usr/bin/env python3
"""Copies one suite of ../shared/fixtures into tests/fixtures (a fresh clone
tests without ../shared): SUITE.safetensors as it is, and the suite's
manifest entries as tests/fixtures/manifest_SUITE.json (the format
tests/fixture_support reads beside manifest.json).

    python3 scripts/extract-fixture-suite.py SRC_FIXTURES_DIR SUITE [SUITE ...]
"""
import json
import os
import shutil
import sys

src, suites = sys.argv[1], sys.argv[2:]
dst = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
m = json.load(open(os.path.join(src, "manifest.json")))
for suite in suites:
    cases = [c for c in m["cases"] if c["suite"] == suite]
    files = sorted({c["file"] for c in cases})
    for f in files:
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
    out = {"torch_version": m["torch_version"], "format": m["format"], "cases": cases}
    with open(os.path.join(dst, f"manifest_{suite}.json"), "w") as fh:
        fh.write(json.dumps(out, indent=1))
    print(suite, len(cases), "cases,", ", ".join(files))
