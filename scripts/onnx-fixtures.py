#!/usr/bin/env python3
"""Copies the ONNX backend test data kiln's importer tests use into
tests/fixtures/onnx/ (from the `onnx` wheel: onnx/backend/test/data/{simple,
pytorch-converted,pytorch-operator}), skipping models over 500 KB so the
fixtures stay a few MB.

    /opt/onnxvenv/bin/python scripts/onnx-fixtures.py
"""
import os
import shutil
import sys

import onnx

SUITES = ["simple", "pytorch-converted", "pytorch-operator"]
MAX_BYTES = 500 * 1024

src_root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
dst_root = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "onnx")
skipped = []
for suite in SUITES:
    for case in sorted(os.listdir(os.path.join(src_root, suite))):
        src = os.path.join(src_root, suite, case)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
        if size > MAX_BYTES:
            skipped.append(f"{suite}/{case} ({size // 1024} KB)")
            continue
        dst = os.path.join(dst_root, suite, case)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
print(f"onnx {onnx.__version__}: copied into {os.path.normpath(dst_root)}")
for s in skipped:
    print("skipped (too large):", s)
sys.exit(0)
