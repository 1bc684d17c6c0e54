"""Writes tests/fixtures/zoo/torchvision_keys.json: the state_dict key names
and shapes of torchvision's resnet18/34/50 (num_classes=10), which
kiln::models::resnet must reproduce. Run with a Python that has torchvision:
    /opt/torchvenv/bin/python scripts/torchvision-keys.py
"""
import json
import torchvision

out = {}
for name in ["resnet18", "resnet34", "resnet50"]:
    m = getattr(torchvision.models, name)(weights=None, num_classes=10)
    out[name] = [[k, list(v.shape)] for k, v in m.state_dict().items()]
with open("tests/fixtures/zoo/torchvision_keys.json", "w") as f:
    json.dump(out, f, indent=0)
