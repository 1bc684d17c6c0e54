#!/usr/bin/env python3
"""PyTorch side of scripts/torch-checkpoint-check.sh: full-size checkpoints in
f32, f16 and bf16 for kiln to load (issue #16 item 3). Not run in CI.

For torchvision resnet18, mobilenet_v3_small, efficientnet_b0, vit_b_16
(weights=None, torch.manual_seed(0), eval; BatchNorm parameters and statistics
and the ViT head then set from a seeded generator so outputs are O(1), see
informative()) and transformers
GPT2LMHeadModel(GPT2Config()) (GPT-2 small, random init, eval), writes into OUT:

  MODEL.DTYPE.safetensors  the state_dict in DTYPE (f32, f16, bf16): torchvision
                           models as safetensors.torch.save_file(state_dict) with
                           floating tensors cast (integer buffers such as
                           num_batches_tracked stay int64, as model.half() leaves
                           them); GPT-2 through save_pretrained(safe_serialization),
                           which leaves out the tied lm_head.weight
  MODEL.io.safetensors     `input` (a seeded batch of 2 images at 224x224, or
                           token ids (1, 16)) and `out/DTYPE`: the f32 model's
                           output after loading the DTYPE weights upcast to f32,
                           i.e. PyTorch computing in f32 with exactly the weights
                           that the DTYPE file holds

    python scripts/torch_checkpoint_check.py OUT [MODEL ...]
"""
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import save_file

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
VISION = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16"]
MODELS = VISION + ["gpt2"]


def build(name):
    """The model (f32, eval) and its fixed input."""
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config())
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, 50257, (1, 16), generator=g)
    else:
        import torchvision
        m = getattr(torchvision.models, name)(weights=None)
        informative(m)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 3, 224, 224, generator=g)
    return m.eval(), x


def informative(m):
    """Random init leaves outputs that compare nothing: vit_b_16 zero-inits its
    head (all-zero logits), and with BatchNorm's fresh statistics the deep CNNs
    end near 1e-12. Seeded BN affine parameters and statistics (as
    tests/fixtures/real/gen_real.py's perturb_bn) and a normal(0, 0.02) ViT head
    make every output O(1)."""
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) + 0.5)
        if hasattr(m, "heads"):
            m.heads.head.weight.normal_(0.0, 0.02, generator=g)


def forward(m, x):
    with torch.no_grad():
        y = m(input_ids=x).logits if hasattr(m, "transformer") else m(x)
    return y.float().contiguous()


def cast(sd, dt):
    return {k: (v.to(dt) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}


def save(name, m, dt, path):
    """Writes m's weights in dt as a PyTorch user would."""
    if name == "gpt2":
        tmp = tempfile.mkdtemp(prefix="kiln-ckpt-")
        try:
            m.to(dt).save_pretrained(tmp, safe_serialization=True)
            shutil.move(os.path.join(tmp, "model.safetensors"), path)
        finally:
            m.to(torch.float32)
            shutil.rmtree(tmp)
    else:
        save_file(cast(m.state_dict(), dt), path)


def main():
    out, names = sys.argv[1], sys.argv[2:] or MODELS
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    for name in names:
        m, x = build(name)
        f32 = {k: v.clone() for k, v in m.state_dict().items()}
        io = {"input": x}
        for tag, dt in DTYPES.items():
            save(name, m, dt, os.path.join(out, f"{name}.{tag}.safetensors"))
            # the reference: f32 compute on the weights the file holds
            m.load_state_dict({k: v.to(dt).to(v.dtype) if v.is_floating_point() else v
                               for k, v in f32.items()})
            io[f"out/{tag}"] = forward(m, x)
            m.load_state_dict(f32)
        save_file(io, os.path.join(out, f"{name}.io.safetensors"))
        print(f"torch {name}: wrote f32, f16, bf16 checkpoints; output {tuple(io['out/f32'].shape)}",
              flush=True)


if __name__ == "__main__":
    main()
