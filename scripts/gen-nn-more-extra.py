#!/usr/bin/env python3
"""Adds the nn_more cases issue #15 asked for after the suite was cut:
antialiased bicubic interpolate and max_pool3d with return_indices.

Run with a torch of the fixtures' version (/opt/torchvenv/bin/python); it
rewrites tests/fixtures/manifest_nn_more.json and nn_more.safetensors in
place, replacing cases of the same name, so a second run changes nothing.
Conventions are the suite's (tests/fixtures/README.md): CASE/in0, out0..,
gout0, grad_in0 = d/d in0 of sum(out0 * gout0).
"""
import json
import pathlib

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
MANIFEST = ROOT / "manifest_nn_more.json"
TENSORS = ROOT / "nn_more.safetensors"


def case(name, op, fn, x, attrs, note):
    x = x.clone().requires_grad_(True)
    outs = fn(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator().manual_seed(len(name))
    gout = torch.randn(outs[0].shape, generator=g, dtype=outs[0].dtype)
    (grad,) = torch.autograd.grad(outs[0], x, grad_outputs=gout)
    t = {f"{name}/in0": x.detach(), f"{name}/gout0": gout, f"{name}/grad_in0": grad}
    for i, o in enumerate(outs):
        t[f"{name}/out{i}"] = o.detach()
    entry = {
        "suite": "nn_more", "file": "nn_more.safetensors", "case": name, "op": op,
        "attrs": attrs, "meta": {}, "inputs": [f"{name}/in0"], "roles": ["input"],
        "outputs": [f"{name}/out{i}" for i in range(len(outs))],
        "gouts": [f"{name}/gout0"], "grads": [f"{name}/grad_in0"], "dtype": "float32",
        "dtypes": {k: str(v.dtype).replace("torch.", "") for k, v in t.items() if "/gout" not in k and "/grad" not in k},
        "shapes": {k: list(v.shape) for k, v in t.items()},
        "rtol": 1e-4, "atol": 1e-5, "note": note, "grad_rtol": 1e-4, "grad_atol": 1e-5,
    }
    return entry, t


def main():
    torch.manual_seed(15)
    interp = lambda size=None, scale=None: {
        "size": size, "scale_factor": scale, "mode": "bicubic", "align_corners": False,
        "recompute_scale_factor": None, "antialias": True,
    }
    p3 = lambda k, s, p, ri: {
        "kernel_size": k, "stride": s, "padding": p, "dilation": 1, "ceil_mode": False, "return_indices": ri,
    }
    cases = [
        case("interpolate_bicubic_antialias_down", "torch.nn.functional.interpolate",
             lambda x: F.interpolate(x, size=[3, 4], mode="bicubic", antialias=True),
             torch.randn(1, 2, 8, 9), interp(size=[3, 4]),
             "antialias=True bicubic: Keys' cubic with a=-0.5 (PIL's), support 2 widened by the downscale"),
        case("interpolate_bicubic_antialias_scale", "torch.nn.functional.interpolate",
             lambda x: F.interpolate(x, scale_factor=0.4, mode="bicubic", antialias=True),
             torch.randn(1, 1, 10, 7), interp(scale=0.4),
             "antialias bicubic by scale_factor (the given scale, not recomputed)"),
        case("max_pool3d_indices", "torch.nn.functional.max_pool3d",
             lambda x: F.max_pool3d(x, 3, 2, 1, return_indices=True),
             torch.randn(2, 2, 5, 6, 4), p3(3, 2, 1, True),
             "out1 = int64 flat d*H*W + h*W + w index into each input plane"),
        case("max_pool3d_indices_ties", "torch.nn.functional.max_pool3d",
             lambda x: F.max_pool3d(x, 2, return_indices=True),
             torch.randint(0, 3, (1, 2, 4, 4, 4)).float(), p3(2, None, 0, True),
             "integer-valued input: ties go to the first position in (d, h, w) order"),
    ]
    m = json.loads(MANIFEST.read_text())
    tensors = load_file(str(TENSORS))
    names = {e["case"] for e, _ in cases}
    m["cases"] = [c for c in m["cases"] if c["case"] not in names] + [e for e, _ in cases]
    tensors = {k: v for k, v in tensors.items() if k.split("/")[0] not in names}
    for _, t in cases:
        tensors.update({k: v.contiguous() for k, v in t.items()})
    save_file(tensors, str(TENSORS), metadata={"suite": "nn_more"})
    MANIFEST.write_text(json.dumps(m, indent=1) + "\n")
    print(f"nn_more: {len(m['cases'])} cases")


if __name__ == "__main__":
    main()
