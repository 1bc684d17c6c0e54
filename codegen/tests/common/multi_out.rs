//! Multi-output pointwise kernels shared by the CPU, shim and NVRTC tests.

use kiln_codegen::{Inner, Kernel, KernelBuilder, Operand};
use kiln_ir::{BinaryOp, DType, UnaryOp};

/// Scalars of [`adam_step`], in order.
pub const ADAM_SCALARS: [f64; 7] = [0.9, 0.1, 0.999, 0.001, 0.0123, 0.0447, 1e-8];

/// One Adam update in place: out0 = p, out1 = m, out2 = v, in3 = g;
/// scalars b1, 1 - b1, b2, 1 - b2, step size, sqrt(bias correction 2), eps.
/// `outs` is the inner pattern of the three outputs, `g` the gradient's.
pub fn adam_step(dt: DType, rank: usize, outs: Inner, g: Inner) -> Kernel {
    let mut b = KernelBuilder::default();
    let p = b.load(0, dt);
    let m = b.load(1, dt);
    let v = b.load(2, dt);
    let gr = b.load(3, dt);
    let s: Vec<usize> = (0..ADAM_SCALARS.len()).map(|n| b.scalar(n, dt)).collect();
    let m1 = b.binary(BinaryOp::Mul, m, s[0], dt);
    let g1 = b.binary(BinaryOp::Mul, gr, s[1], dt);
    let m2 = b.binary(BinaryOp::Add, m1, g1, dt);
    let v1 = b.binary(BinaryOp::Mul, v, s[2], dt);
    let gg = b.binary(BinaryOp::Mul, gr, gr, dt);
    let g2 = b.binary(BinaryOp::Mul, gg, s[3], dt);
    let v2 = b.binary(BinaryOp::Add, v1, g2, dt);
    let sq = b.unary(UnaryOp::Sqrt, v2, dt);
    let sd = b.binary(BinaryOp::Div, sq, s[5], dt);
    let den = b.binary(BinaryOp::Add, sd, s[6], dt);
    let r = b.binary(BinaryOp::Div, m2, den, dt);
    let rs = b.binary(BinaryOp::Mul, r, s[4], dt);
    let p2 = b.binary(BinaryOp::Sub, p, rs, dt);
    let o = |inner| Operand { dtype: dt, inner };
    Kernel {
        name: "adam_step".into(),
        rank,
        operands: vec![o(outs), o(outs), o(outs), o(g)],
        scalars: vec![dt; ADAM_SCALARS.len()],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: p2,
        extra_out: vec![m2, v2],
        rows: None,
    }
}

/// Swaps two buffers and writes their sum to a third, of dtype `sum_dt`:
/// out0 = old out1, out1 = old out0, out2 = old out0 + old out1. Correct
/// only if every value is computed before any store.
pub fn swap(dt: DType, sum_dt: DType, rank: usize, inner: Inner) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(0, dt);
    let y = b.load(1, dt);
    let s = b.binary(BinaryOp::Add, x, y, dt);
    let s = b.cast(s, sum_dt);
    let o = |dtype| Operand { dtype, inner };
    Kernel {
        name: "swap".into(),
        rank,
        operands: vec![o(dt), o(dt), o(sum_dt)],
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: y,
        extra_out: vec![x, s],
        rows: None,
    }
}

/// One LSTM step's gate math storing two values from one shared body, as
/// the compiled LSTM's step kernel does: in2..in5 the gate pre-activations
/// (i, f, g, o), in6 the previous cell state; out0 = `c = sigmoid(f) * c0 +
/// sigmoid(i) * tanh(g)`, out1 = `h = sigmoid(o) * tanh(c)` (c computed once).
/// `inner` is every operand's pattern except in6's, which is `c0`.
pub fn lstm_cell(dt: DType, rank: usize, inner: Inner, c0: Inner) -> Kernel {
    let mut b = KernelBuilder::default();
    let gate = |b: &mut KernelBuilder, k: usize, op: UnaryOp| {
        let x = b.load(k, dt);
        b.unary(op, x, dt)
    };
    let i = gate(&mut b, 2, UnaryOp::Sigmoid);
    let f = gate(&mut b, 3, UnaryOp::Sigmoid);
    let g = gate(&mut b, 4, UnaryOp::Tanh);
    let o = gate(&mut b, 5, UnaryOp::Sigmoid);
    let c_prev = b.load(6, dt);
    let fc = b.binary(BinaryOp::Mul, f, c_prev, dt);
    let ig = b.binary(BinaryOp::Mul, i, g, dt);
    let c = b.binary(BinaryOp::Add, fc, ig, dt);
    let tc = b.unary(UnaryOp::Tanh, c, dt);
    let h = b.binary(BinaryOp::Mul, o, tc, dt);
    let o = |inner| Operand { dtype: dt, inner };
    let mut operands = vec![o(inner); 6];
    operands.push(o(c0));
    Kernel {
        name: "lstm_cell".into(),
        rank,
        operands,
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: c,
        extra_out: vec![h],
        rows: None,
    }
}
