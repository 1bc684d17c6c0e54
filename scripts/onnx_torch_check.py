"""Real PyTorch ONNX exports for checking kiln's importer (see
scripts/onnx-torch-check.sh, which runs this).

    python scripts/onnx_torch_check.py export OUT [NAME ...]
        exports each model with torch.onnx.export (opset 17, the TorchScript
        path), writes OUT/NAME.onnx, each case's inputs as
        OUT/NAME.caseK.INPUT.pb and onnxruntime's outputs as
        OUT/NAME.caseK.ort.OUTPUT.pb, and OUT/NAME.cases (one line per case
        onnxruntime ran: `K --input NAME=FILE ...`, for `kiln run`)
    python scripts/onnx_torch_check.py compare OUT NAME MODE TOL
        compares OUT/NAME.caseK.MODE.safetensors (what `kiln run --output`
        wrote) with onnxruntime's outputs; prints one table row

Needs torch, torchvision and transformers (the export) and onnx,
onnxruntime (the reference) importable; random weights, eval mode.
"""
import os
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")


def models():
    """name -> (make module, [case inputs], input names, dynamic_axes)."""
    import torch
    import torchvision

    g = torch.Generator().manual_seed(0)

    def randn(*s):
        return torch.randn(*s, generator=g)

    img = lambda: [(randn(1, 3, 224, 224),), (randn(2, 3, 224, 224),)]
    batch = {"x": {0: "batch"}}
    out = {}
    for name in ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16"]:
        out[name] = (lambda n=name: getattr(torchvision.models, n)(weights=None), img, ["x"], batch)

    def lstm():
        return torch.nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)

    def gru():
        return torch.nn.GRU(16, 32, num_layers=2)

    seq_bf = lambda: [(randn(2, 7, 16),), (randn(3, 11, 16),)]
    seq_tm = lambda: [(randn(7, 2, 16),), (randn(11, 3, 16),)]
    out["lstm"] = (lstm, seq_bf, ["x"], {"x": {0: "batch", 1: "seq"}})
    out["gru"] = (gru, seq_tm, ["x"], {"x": {0: "seq", 1: "batch"}})

    def encoder():
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    out["transformer_encoder"] = (
        encoder,
        lambda: [(randn(2, 10, 64),), (randn(3, 10, 64),)],
        ["x"],
        {"x": {0: "batch", 1: "seq"}},
    )

    def ids(b, t):
        return torch.randint(0, 1000, (b, t), generator=g)

    def gpt2():
        import transformers

        cfg = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4)
        return Logits(transformers.GPT2LMHeadModel(cfg))

    def bert():
        import transformers

        cfg = transformers.BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64,
        )
        return Logits(transformers.BertModel(cfg), "last_hidden_state")

    tokens = lambda: [(ids(1, 12),), (ids(2, 9),)]
    out["gpt2_tiny"] = (gpt2, tokens, ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}})
    out["bert_tiny"] = (bert, tokens, ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}})
    return out


def Logits(model, key="logits"):
    """A transformers model returning one tensor (no cache, no dict)."""
    import torch

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids):
            kw = {"use_cache": False} if key == "logits" else {}
            # an explicit mask: without one transformers looks for packed
            # sequences with aten::diff, which has no ONNX export
            mask = torch.ones_like(input_ids)
            out = self.m(input_ids=input_ids, attention_mask=mask, return_dict=True, **kw)
            return getattr(out, key)

    return Wrap()


def write_pb(path, a):
    from onnx import numpy_helper

    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(a).SerializeToString())


def export(out, names):
    import onnxruntime as ort
    import torch

    table = models()
    for name in names or list(table):
        make, cases, in_names, dyn = table[name]
        torch.manual_seed(0)
        try:
            m = make().eval()
            with torch.no_grad():
                # an all-zero parameter (ViT's head starts so) would make the check vacuous
                for p in m.parameters():
                    if p.numel() > 1 and not p.any():
                        p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
            cases = cases()
            path = os.path.join(out, f"{name}.onnx")
            # grad mode on and the fast path off: nn.MultiheadAttention's
            # fused inference kernels (_native_multi_head_attention) have no
            # ONNX export
            torch.backends.mha.set_fastpath_enabled(False)
            torch.onnx.export(
                m, cases[0], path, opset_version=17, dynamo=False,
                input_names=in_names, dynamic_axes=dyn,
            )
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        except Exception as e:  # a model torch cannot export is reported, not fatal
            print(f"{name}: torch.onnx.export failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        onames = [o.name for o in sess.get_outputs()]
        lines = []
        for k, xs in enumerate(cases):
            feeds = {n: x.numpy() for n, x in zip(in_names, xs)}
            args = []
            for n, a in feeds.items():
                p = os.path.join(out, f"{name}.case{k}.{n}.pb")
                write_pb(p, a)
                args.append(f"--input {n}={p}")
            with torch.no_grad():
                torch_out = m(*xs)
            torch_out = torch_out[0] if isinstance(torch_out, tuple) else torch_out
            try:
                ys = sess.run(None, feeds)
            except Exception as e:  # torch's trace baked a size in: not kiln's to check
                msg = str(e).replace("\n", " ")[:160]
                print(f"{name} case {k}: onnxruntime cannot run torch's file on {[list(x.shape) for x in xs]}: {msg}")
                continue
            torch_err = float(np.max(np.abs(ys[0] - torch_out.numpy())))
            print(f"{name} case {k}: max |onnxruntime - torch| = {torch_err:.2e}")
            for n, y in zip(onames, ys):
                write_pb(os.path.join(out, f"{name}.case{k}.ort.{n}.pb"), y)
            lines.append(f"{k} " + " ".join(args))
        with open(os.path.join(out, f"{name}.cases"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: exported ({len(cases)} cases, outputs {onames})")


def compare(out, name, mode, tol):
    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file

    cases = open(os.path.join(out, f"{name}.cases")).read().splitlines()
    model = onnx.load(os.path.join(out, f"{name}.onnx"))
    ops = sorted({n.op_type for n in model.graph.node})
    worst, shapes = 0.0, []
    for k in [int(c.split()[0]) for c in cases]:
        got = load_file(os.path.join(out, f"{name}.case{k}.{mode}.safetensors"))
        for o in model.graph.output:
            t = onnx.TensorProto()
            with open(os.path.join(out, f"{name}.case{k}.ort.{o.name}.pb"), "rb") as f:
                t.ParseFromString(f.read())
            want = numpy_helper.to_array(t).astype(np.float64)
            g = got[o.name].astype(np.float64)
            if g.shape != want.shape:
                print(f"| {name} | {mode} | FAIL: output {o.name} shape {g.shape} vs onnxruntime {want.shape} |")
                return 1
            worst = max(worst, float(np.max(np.abs(g - want))) if want.size else 0.0)
        shapes.append(str(list(got[model.graph.output[0].name].shape)))
    verdict = "ok" if worst <= tol else "FAIL"
    print(f"| {name} | {mode} | {verdict} | {worst:.2e} | {', '.join(shapes)} | {len(model.graph.node)} nodes, {len(ops)} op types |")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])))
