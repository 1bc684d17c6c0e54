"""Writes tests/fixtures/zoo/{mobilenet_v3_small,efficientnet}.safetensors:
torchvision models shrunk to fixture size by their own constructor
arguments, with their seeded default init (BatchNorm affine params and
running stats perturbed so eval mode is non-trivial), in eval mode on one
1x3x64x64 image. Keys: state/<key> (the state_dict), input/x, eval/out.

  mobilenet_v3_small(num_classes=10, width_mult=0.5)   (full size: 2.5M params)
  EfficientNet(_efficientnet_conf("efficientnet_b0", width_mult=0.5, depth_mult=0.5),
               dropout=0.2, num_classes=10)            (efficientnet_b0: 5.3M params)

Run with a Python that has torch, torchvision and safetensors:
    /opt/torchvenv/bin/python scripts/torchvision-zoo-fixtures.py
"""
import json

import torch
import torch.nn as nn
import torchvision
from safetensors.torch import save_file
from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

torch.set_num_threads(2)


def perturb_bn(m):
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) + 0.5)


def mobilenet_v3_small():
    return torchvision.models.mobilenet_v3_small(num_classes=10, width_mult=0.5), \
        "torchvision mobilenet_v3_small(num_classes=10, width_mult=0.5)"


def efficientnet():
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.5, depth_mult=0.5)
    return EfficientNet(setting, 0.2, last_channel=last, num_classes=10), \
        "torchvision EfficientNet(_efficientnet_conf('efficientnet_b0', width_mult=0.5, depth_mult=0.5), dropout=0.2, num_classes=10)"


def main():
    for name, build in [("mobilenet_v3_small", mobilenet_v3_small), ("efficientnet", efficientnet)]:
        torch.manual_seed(0)
        m, what = build()
        perturb_bn(m)
        m.eval()
        x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            y = m(x)
        t = {f"state/{k}": v.detach().clone().contiguous() for k, v in m.state_dict().items()}
        t["input/x"] = x
        t["eval/out"] = y
        meta = {"model": what, "params": sum(p.numel() for p in m.parameters()),
                "tolerance": "rtol 1e-4, atol 1e-5", "torch": torch.__version__,
                "torchvision": torchvision.__version__}
        save_file(t, f"tests/fixtures/zoo/{name}.safetensors", metadata={"meta": json.dumps(meta)})
        print(name, meta["params"], "params")


if __name__ == "__main__":
    main()
