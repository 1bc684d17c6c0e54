"""Checks an ONNX file kiln exported: onnx.checker (full check, with shape
inference), then onnxruntime on each input against kiln's eager output.

    python tests/onnx_check.py MODEL.onnx TOL IN_0.pb[,IN_0b.pb...]:OUT_0.pb[,OUT_1.pb...] [...]

Each pair is one call's inputs (comma-separated, in the model's input
order) and kiln's eager outputs for it, the first ones in the model's
output order (ONNX TensorProto files). Prints one line per pair and exits 1
on any disagreement.
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def read(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


model_path, tol = sys.argv[1], float(sys.argv[2])
model = onnx.load(model_path)
onnx.checker.check_model(model, full_check=True)
sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
names = [i.name for i in sess.get_inputs()]
worst = 0.0
for pair in sys.argv[3:]:
    x_paths, y_path = pair.split(":")
    xs = [read(p) for p in x_paths.split(",")]
    x, wants = xs[0], [read(p) for p in y_path.split(",")]
    gots = sess.run(None, dict(zip(names, xs)))
    err = 0.0
    for got, want in zip(gots, wants):
        if got.shape != want.shape:
            print(f"shape {got.shape} from onnxruntime, kiln {want.shape}")
            sys.exit(1)
        err = max(err, float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))))
    worst = max(worst, err)
    print(f"{model_path}: checker ok, onnxruntime {ort.__version__} on {list(x.shape)}: max |ort - kiln| = {err:.3e}")
sys.exit(0 if worst <= tol else 1)
