#!/usr/bin/env python3
"""PyTorch side of the kiln benchmark workloads (see WORKLOADS.md).

Times W1-W8 in-process on the CPU, in eager mode and with torch.compile (default
mode, inductor), and prints a markdown table. Needs torch and numpy (the venv).

    python torch_baseline.py            # all workloads, eager + compiled
    python torch_baseline.py --eager    # skip torch.compile
    python torch_baseline.py --threads 2
    python torch_baseline.py --device cuda   # same workloads on a GPU (synchronised timing)
    python torch_baseline.py --only ResNet18,MobileNetV3 --no-wait --json

(kiln's copy of ../shared/bench/torch_baseline.py, plus ResNet18 and MobileNetV3 rows:
torchvision's resnet18 and mobilenet_v3_small, random weights, eval, batch 8, 224x224,
under no_grad; ResNet34, ResNet50, MobileNetV3Large, EfficientNetB0 and ViTB16 rows the
same way, run only when named in --only; a GPT2 row: a transformers GPT2LMHeadModel training step, which needs
transformers; and --no-wait, which times without waiting for an idle machine.)

Method: each timed function is called 3 times to warm up, then timed in batches
(k calls per batch, k chosen so a batch lasts >= 50 ms) until at least 10 batches
and 1 s have passed; the median time per call is reported. The load average is
printed before and after: other processes on the machine distort the numbers.
For compiled functions the first call (tracing + inductor code generation + C++
compile) is reported separately as compile time. Training steps compile the model
(forward and, through AOTAutograd, backward); the optimizer step stays eager.
"""
import argparse
import math
import os
import statistics
import tempfile
import time

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:   # cold compile times: a fresh inductor cache per run
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cache-")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MiB = 1 << 20


SYNC = lambda: None   # torch.cuda.synchronize on a GPU, so the timer sees finished work


def timeit(fn, warmup=3, min_reps=10, min_time=1.0, max_reps=200, batch_s=0.05):
    """Median seconds per call. Calls faster than batch_s are timed in batches of k calls."""
    for _ in range(warmup):
        fn()
    SYNC()
    t0 = time.perf_counter()
    fn()
    SYNC()
    one = time.perf_counter() - t0
    k = max(1, math.ceil(batch_s / max(one, 1e-9)))
    ts = []
    start = time.perf_counter()
    while len(ts) < max_reps and (len(ts) < min_reps or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        SYNC()
        ts.append((time.perf_counter() - t0) / k)
    return statistics.median(ts), len(ts)


def _cpu():
    """(busy ticks of the whole machine, total ticks, this process's ticks); None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = list(map(int, f.readline().split()[1:9]))
    except OSError:
        return None
    t = os.times()
    return sum(v) - v[3] - v[4], sum(v), (t.user + t.system) * os.sysconf("SC_CLK_TCK")


def others_load(a, b):
    """Share of all CPU time used by other processes between two _cpu() samples, in %.

    Taken over the timed loops only: inductor's compile workers are child processes and would count."""
    if a is None or b is None or b[1] == a[1]:
        return float("nan")
    return max(0.0, 100.0 * ((b[0] - a[0]) - (b[2] - a[2])) / (b[1] - a[1]))


def wait_idle(max_wait=600, limit=5.0):
    """Wait until other processes use < limit % of the CPUs for 2 s (at most max_wait s)."""
    t_end = time.time() + max_wait
    while time.time() < t_end:
        a = _cpu()
        time.sleep(2.0)
        if not others_load(a, _cpu()) >= limit:
            return
    print("  (machine still busy; timing anyway)", flush=True)


def compiled(fn, first_call):
    """torch.compile(fn); returns (compiled fn, seconds of the first call)."""
    cf = torch.compile(fn)
    t0 = time.perf_counter()
    first_call(cf)
    return cf, time.perf_counter() - t0


# (workload, torchvision constructor, run without --only): the same names and
# models as the rows of kiln's src/bench/vision.rs
VISION = [
    ("ResNet18", "resnet18", True),
    ("ResNet34", "resnet34", False),
    ("ResNet50", "resnet50", False),
    ("MobileNetV3", "mobilenet_v3_small", True),
    ("MobileNetV3Large", "mobilenet_v3_large", False),
    ("EfficientNetB0", "efficientnet_b0", False),
    ("ViTB16", "vit_b_16", False),
]


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eager", action="store_true", help="skip torch.compile")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--json", action="store_true",
                    help="also print one JSON object per row, in kiln bench --json's shape")
    ap.add_argument("--only", default="", help="comma-separated workload ids to run (default: all)")
    ap.add_argument("--no-wait", action="store_true",
                    help="do not wait for other processes to go idle before each timing")
    args = ap.parse_args()
    if args.no_wait:
        global wait_idle
        wait_idle = lambda *a, **k: None
    global SYNC
    if args.device != "cpu":
        torch.set_default_device(args.device)   # every tensor and module below is made there
        SYNC = torch.cuda.synchronize
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    do_compile = not args.eager
    rows = []   # (id, what, eager_s, compiled_s, compile_s, metric_name, work, unit_div)

    only = {w.strip() for w in args.only.split(",") if w.strip()}

    def run(wid, what, fn, first_call=None, metric=None, work=None, compile_fn=None):
        if only and wid not in only:
            return
        wait_idle()
        a = _cpu()
        e, _ = timeit(fn)
        busy = others_load(a, _cpu())
        c = cs = None
        if do_compile:
            cf, cs = compile_fn() if compile_fn else compiled(fn, lambda f: f())
            wait_idle()
            a = _cpu()
            c, _ = timeit(cf)
            busy = max(busy, others_load(a, _cpu()))
        rows.append((wid, what, e, c, cs, metric, work, busy))
        print(f"  {wid}: eager {e * 1e3:.3f} ms" + (f", compiled {c * 1e3:.3f} ms (compile {cs:.1f} s)" if c else "")
              + f"; other processes {busy:.0f}% CPU", flush=True)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, numpy {np.__version__}", flush=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)

    # W1 elementwise chain
    n = 4 * MiB
    x, a, b = torch.randn(n), torch.randn(n), torch.randn(n)

    def w1():
        return F.gelu(x * a + b) * 0.5 + x
    run("W1", "gelu(x*a+b)*0.5+x, 4M f32", w1, metric="GB/s", work=4 * n * 4)

    # W2 softmax
    s = torch.randn(4096, 1024)

    def w2():
        return torch.softmax(s, dim=-1)
    run("W2", "softmax(4096x1024, dim=-1)", w2, metric="GB/s", work=2 * s.numel() * 4)

    # W3 layer_norm
    lw, lb = torch.randn(1024), torch.randn(1024)

    def w3():
        return F.layer_norm(s, (1024,), lw, lb)
    run("W3", "layer_norm(4096x1024) affine", w3, metric="GB/s", work=2 * s.numel() * 4)

    # W4 conv + bn + relu inference
    blk = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()).eval()
    with torch.no_grad():
        blk[1].running_mean.uniform_(-0.1, 0.1)
        blk[1].running_var.uniform_(0.5, 1.5)
    xi = torch.randn(8, 64, 56, 56)

    def w4():
        with torch.no_grad():
            return blk(xi)

    def w4c():
        cb = torch.compile(blk)

        def f():
            with torch.no_grad():
                return cb(xi)
        t0 = time.perf_counter()
        f()
        return f, time.perf_counter() - t0
    run("W4", "Conv2d(64,64,3,p1)+BN(eval)+ReLU on 8x64x56x56", w4, metric="GFLOP/s",
        work=2 * 8 * 64 * 64 * 9 * 56 * 56, compile_fn=w4c)

    # W5 small CNN training step
    def train_step_factory(make_model, make_opt, xb, yb, compile_model):
        torch.manual_seed(1)
        model = make_model()
        opt = make_opt(model)
        fwd = torch.compile(model) if compile_model else model

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(xb), yb)
            loss.backward()
            opt.step()
            return loss
        return step

    xc, yc = torch.randn(256, 1, 8, 8), torch.randint(0, 10, (256,))

    def sgd(mdl):
        return torch.optim.SGD(mdl.parameters(), lr=0.1, momentum=0.9)

    def w5c():
        st = train_step_factory(small_cnn, sgd, xc, yc, True)
        t0 = time.perf_counter()
        st()
        return st, time.perf_counter() - t0
    run("W5", "small CNN train step, batch 256, SGD momentum", train_step_factory(small_cnn, sgd, xc, yc, False),
        metric="steps/s", work=1, compile_fn=w5c)

    # W6 MLP training step, AdamW
    xm, ym = torch.randn(256, 784), torch.randint(0, 10, (256,))

    def adamw(mdl):
        return torch.optim.AdamW(mdl.parameters(), lr=1e-3, weight_decay=0.01)

    def w6c():
        st = train_step_factory(mlp, adamw, xm, ym, True)
        t0 = time.perf_counter()
        st()
        return st, time.perf_counter() - t0
    run("W6", "MLP 784-1024-1024-10 train step, batch 256, AdamW", train_step_factory(mlp, adamw, xm, ym, False),
        metric="GFLOP/s", work=3 * 2 * 256 * (784 * 1024 + 1024 * 1024 + 1024 * 10), compile_fn=w6c)

    # W7 matmul
    ma, mb = torch.randn(1024, 1024), torch.randn(1024, 1024)

    def w7():
        return ma @ mb
    run("W7", "matmul 1024x1024 @ 1024x1024", w7, metric="GFLOP/s", work=2 * 1024 ** 3)

    # torchvision vision models, eval, batch 8, 224x224 (kiln's src/bench/vision.rs WORKLOADS);
    # ResNet18 and MobileNetV3 run by default, the larger ones only when named in --only
    for wid, ctor, default in VISION:
        if (only and wid not in only) or (not only and not default):
            continue
        import torchvision
        net = getattr(torchvision.models, ctor)(weights=None).eval()
        xv = torch.randn(8, 3, 224, 224)

        def vision(net=net, xv=xv):
            with torch.no_grad():
                return net(xv)

        def vision_c(net=net, xv=xv):
            cn = torch.compile(net)

            def f():
                with torch.no_grad():
                    return cn(xv)
            t0 = time.perf_counter()
            f()
            return f, time.perf_counter() - t0
        run(wid, f"torchvision {ctor} eval, batch 8, 224x224", vision, compile_fn=vision_c)

    # GPT-2 training step (transformers GPT2LMHeadModel: 4 layers, d 256, 4 heads, vocab 8192,
    # seq 128, dropout 0), batch 8, AdamW; logits flattened to (batch * seq, vocab) as kiln's
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        GPT2LMHeadModel = None
        if not only or "GPT2" in only:
            print("  GPT2: skipped (needs transformers)", flush=True)
    if GPT2LMHeadModel is not None and (not only or "GPT2" in only):
        class FlatLogits(nn.Module):
            def __init__(self):
                super().__init__()
                self.lm = GPT2LMHeadModel(GPT2Config(
                    vocab_size=8192, n_positions=128, n_embd=256, n_layer=4, n_head=4,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))

            def forward(self, ids):
                return self.lm(input_ids=ids).logits.flatten(0, 1)

        ids, nxt = torch.randint(0, 8192, (8, 128)), torch.randint(0, 8192, (8 * 128,))

        def gpt2c():
            st = train_step_factory(FlatLogits, adamw, ids, nxt, True)
            t0 = time.perf_counter()
            st()
            return st, time.perf_counter() - t0
        run("GPT2", "GPT-2 4 layers d256 4 heads vocab 8192 train step, batch 8 x 128 tokens, AdamW",
            train_step_factory(FlatLogits, adamw, ids, nxt, False), metric="steps/s", work=1,
            compile_fn=gpt2c)

    if only and not ({"W8", "W8a", "W8b", "W8c"} & only):
        print_rows(rows, args, None)
        return

    # W8 bandwidth
    src = torch.randn(64 * MiB)
    dst = torch.empty_like(src)
    wait_idle()
    a0 = _cpu()
    tcopy, _ = timeit(lambda: dst.copy_(src))
    rows.append(("W8a", "torch copy_ 64M f32 (read+write)", tcopy, None, None, "GB/s", 2 * src.numel() * 4,
                 others_load(a0, _cpu())))
    ta, tb, tcc = torch.empty(32 * MiB), torch.randn(32 * MiB), torch.randn(32 * MiB)
    a0 = _cpu()
    ttri, _ = timeit(lambda: torch.add(tb, tcc, alpha=3.0, out=ta))
    rows.append(("W8b", "torch triad a=b+s*c 32M f32 (add(out=, alpha=))", ttri, None, None, "GB/s",
                 3 * ta.numel() * 4, others_load(a0, _cpu())))
    na = np.empty(32 * MiB, dtype=np.float32)
    nb = np.random.default_rng(0).standard_normal(32 * MiB, dtype=np.float32)
    nc = np.random.default_rng(1).standard_normal(32 * MiB, dtype=np.float32)

    def triad():
        np.multiply(nc, np.float32(3.0), out=na)
        np.add(na, nb, out=na)
    a0 = _cpu()
    tnp, _ = timeit(triad)
    rows.append(("W8c", "numpy triad a=b+s*c 32M f32 (2 passes, 1 thread)", tnp, None, None, "GB/s",
                 3 * na.size * 4, others_load(a0, _cpu())))
    del src, dst, ta, tb, tcc, na, nb, nc

    print_rows(rows, args, rows[[r[0] for r in rows].index("W8a")][6] / tcopy / 1e9)


def print_rows(rows, args, copy_gbs):
    """The markdown table (and --json rows); the copy-rate lines when W8 ran."""
    def metric(r, t):
        if t is None or r[5] is None:
            return ""
        if r[5] == "GB/s":
            return f"{r[6] / t / 1e9:.1f} GB/s"
        if r[5] == "GFLOP/s":
            return f"{r[6] / t / 1e9:.1f} GFLOP/s"
        return f"{1 / t:.1f} steps/s"

    print()
    print(f"torch {torch.__version__}, torch.get_num_threads() = {torch.get_num_threads()}, numpy {np.__version__}")
    print()
    print("| id | workload | eager median | eager rate | compiled median | compiled rate | compile time "
          "| other procs CPU |")
    print("|----|----------|-------------:|-----------:|----------------:|--------------:|-------------:"
          "|----------------:|")
    for r in rows:
        wid, what, e, c, cs = r[:5]
        print(f"| {wid} | {what} | {e * 1e3:.3f} ms | {metric(r, e)} | "
              + (f"{c * 1e3:.3f} ms | {metric(r, c)} | {cs:.1f} s |" if c is not None else "- | - | - |")
              + f" {r[7]:.0f}% |")
    if args.json:
        import json
        for r in rows:
            for mode, t, cs in (("torch-eager", r[2], None), ("torch-compiled", r[3], r[4])):
                if t is None:
                    continue
                o = {"workload": r[0], "mode": mode, "median_ms": round(t * 1e3, 4)}
                if r[5] in ("GB/s", "GFLOP/s"):
                    o["gbps" if r[5] == "GB/s" else "gflops"] = round(r[6] / t / 1e9, 2)
                if cs is not None:
                    o["compile_ms"] = round(cs * 1e3, 1)
                print(json.dumps(o, separators=(",", ":")))
    print()
    print(f"load average at end: {os.getloadavg()}")
    if copy_gbs is None:
        return
    print(f"copy bandwidth (W8a): {copy_gbs:.1f} GB/s")
    for r in rows:
        if r[0] in ("W1", "W2", "W3"):
            e, c = r[2], r[3]
            line = f"{r[0]} effective: eager {r[6] / e / 1e9:.1f} GB/s ({r[6] / e / 1e9 / copy_gbs * 100:.0f}% of copy)"
            if c is not None:
                line += f", compiled {r[6] / c / 1e9:.1f} GB/s ({r[6] / c / 1e9 / copy_gbs * 100:.0f}% of copy)"
            print(line)


if __name__ == "__main__":
    main()
