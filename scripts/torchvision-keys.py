"""Writes tests/fixtures/zoo/torchvision_keys.json: the state_dict key names
and shapes of torchvision's resnet18/34/50, mobilenet_v3_small/large and
efficientnet_b0 (num_classes=10, plus a mobilenet_v3_small with
width_mult=0.5, reduced_tail and dilated), which kiln::models must
reproduce. Run with a Python that has torchvision:
    /opt/torchvenv/bin/python scripts/torchvision-keys.py
"""
import json
import torchvision

MODELS = {
    "resnet18": ("resnet18", {}),
    "resnet34": ("resnet34", {}),
    "resnet50": ("resnet50", {}),
    "mobilenet_v3_small": ("mobilenet_v3_small", {}),
    "mobilenet_v3_large": ("mobilenet_v3_large", {}),
    "mobilenet_v3_small_w0.5_reduced_dilated": (
        "mobilenet_v3_small", {"width_mult": 0.5, "reduced_tail": True, "dilated": True}),
    "efficientnet_b0": ("efficientnet_b0", {}),
}

out = {}
for key, (name, kwargs) in MODELS.items():
    m = getattr(torchvision.models, name)(weights=None, num_classes=10, **kwargs)
    out[key] = [[k, list(v.shape)] for k, v in m.state_dict().items()]
with open("tests/fixtures/zoo/torchvision_keys.json", "w") as f:
    json.dump(out, f, indent=0)
