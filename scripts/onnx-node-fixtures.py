#!/usr/bin/env python3
"""Writes the ONNX node test cases (onnx.backend.test.case.node.collect_testcases)
whose every op kiln's importer supports into tests/fixtures/onnx/node/, as the
backend test data is laid out (model.onnx, test_data_set_N/{input,output}_K.pb).
Cases with inputs or outputs kiln has no dtype for (strings, uint16/32/64,
float8, complex), ragged sequences, or over 20 KB are left out.

    /opt/onnxvenv/bin/python scripts/onnx-node-fixtures.py [OP ...]

With OPs, only the cases using one of them are (re)written and the others
are left as they are (a newly supported op adds its cases without
regenerating the random data of every other case).
"""
import os
import re
import shutil
import sys

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "..", "src", "onnx", "import", "ops.rs")).read()
block = src[src.index("pub(crate) const SUPPORTED"):]
block = block[: block.index("];")]
supported = set(re.findall(r'"([A-Za-z0-9]+)"', block))
ok_types = {np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8, np.bool_}



def dtype_of(v):
    """The element type of a data-set value; None for a ragged sequence
    (a list of tensors of different shapes), which is left out."""
    try:
        return np.asarray(v).dtype.type
    except ValueError:
        return None


dst = os.path.join(here, "..", "tests", "fixtures", "onnx", "node")
only = set(sys.argv[1:])
if not only:
    shutil.rmtree(dst, ignore_errors=True)
kept = 0
for case in collect_testcases():
    model = case.model
    ops = {n.op_type for n in model.graph.node}
    if not ops <= supported or any(n.domain not in ("", "ai.onnx") for n in model.graph.node):
        continue
    if only and not ops & only:
        continue
    if case.data_sets is None or any(
        dtype_of(v) not in ok_types for ins, outs in case.data_sets for v in list(ins) + list(outs)
    ):
        continue
    out = os.path.join(dst, case.name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    with open(os.path.join(out, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    for k, (ins, outs) in enumerate(case.data_sets):
        d = os.path.join(out, f"test_data_set_{k}")
        os.makedirs(d)
        for i, v in enumerate(ins):
            with open(os.path.join(d, f"input_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(np.asarray(v)).SerializeToString())
        for i, v in enumerate(outs):
            with open(os.path.join(d, f"output_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(np.asarray(v)).SerializeToString())
    size = sum(os.path.getsize(os.path.join(a, b)) for a, _, fs in os.walk(out) for b in fs)
    if size > 20 * 1024:
        shutil.rmtree(out)
        continue
    kept += 1
print(f"onnx {onnx.__version__}: {kept} node cases in {os.path.normpath(dst)}")
