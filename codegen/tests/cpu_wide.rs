//! Kernels whose rows call the wide-vector helpers (AVX2/AVX-512 on tiles,
//! or one pass over a chain) against the same kernels compiled to plain
//! f32x4 Cranelift code: the results must be the same bits (NaN equal to
//! NaN) for every supported op, chains of them, broadcast, scalar and
//! in-place operands, rows shorter and longer than a tile and thread splits
//! of dim 0. Also the Cranelift IR of a tiled row and of a chain row, as
//! snapshots.

use kiln_codegen::cpu::{wide, wide::Uses, CompiledKernel, CpuJit};
use kiln_codegen::{Inner, Kernel, KernelBuilder, Operand, ValueId};
use kiln_ir::{BinaryOp, DType, UnaryOp};
use std::sync::Mutex;

static JITS: Mutex<Option<[CpuJit; 3]>> = Mutex::new(None);

/// Machine code of `k`: every wide use (chains included), tiled rows
/// without chains, plain f32x4.
fn compile_all(k: &Kernel) -> [CompiledKernel; 3] {
    let mut g = JITS.lock().unwrap_or_else(|e| e.into_inner());
    let jits = g.get_or_insert_with(|| {
        let uses = [
            Uses::all(true),
            Uses {
                chains: false,
                ..Uses::all(true)
            },
            Uses::all(false),
        ];
        uses.map(|u| {
            let mut j = CpuJit::new().unwrap();
            j.set_wide_uses(u);
            j
        })
    });
    assert_eq!(jits[2].wide_isa(), None);
    [0, 1, 2].map(|i| jits[i].compile(k).unwrap())
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let edges = [
        0.0,
        -0.0,
        1e-40,
        88.7,
        -88.7,
        100.0,
        -110.0,
        2.5,
        -2.6,
        4.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -1.0,
    ];
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 7 == 3 {
                edges[(s as usize >> 5) % edges.len()]
            } else {
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 16.0
            }
        })
        .collect()
}

fn f32_op(inner: Inner) -> Operand {
    Operand {
        dtype: DType::F32,
        inner,
    }
}

/// A rank-2 pointwise kernel with output 0 and `ins` f32 inputs.
fn kernel(ins: &[Inner], body: impl Fn(&mut KernelBuilder) -> ValueId) -> Kernel {
    let mut b = KernelBuilder::default();
    let out = body(&mut b);
    let mut operands = vec![f32_op(Inner::Contiguous)];
    operands.extend(ins.iter().map(|&i| f32_op(i)));
    Kernel {
        name: "wide".into(),
        rank: 2,
        operands,
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out,
        extra_out: vec![],
        rows: None,
    }
}

/// Runs `k` over `[rows, cols]` (output preset to `init`, scalars as f64 bits),
/// with dim 0 split in two calls.
fn run(
    ck: &CompiledKernel,
    k: &Kernel,
    rows: usize,
    cols: usize,
    init: &[f32],
    scalars: &[u64],
) -> Vec<f32> {
    let mut bufs: Vec<Vec<f32>> = vec![init.to_vec()];
    let mut strides = vec![cols as isize, 1];
    for (i, o) in k.operands.iter().enumerate().skip(1) {
        let (len, st) = match o.inner {
            Inner::Contiguous => (rows * cols, [cols as isize, 1]),
            Inner::Broadcast => (rows, [1, 0]),
            Inner::Strided => (rows * cols, [1, rows as isize]),
        };
        bufs.push(values(len, 97 * i as u64 + cols as u64));
        strides.extend_from_slice(&st);
    }
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr() as *mut u8).collect();
    let sizes = [rows, cols];
    let mid = rows / 2;
    // SAFETY: buffers cover every index the strides reach.
    unsafe {
        ck.call(&ptrs, &strides, &sizes, scalars, 0, mid);
        ck.call(&ptrs, &strides, &sizes, scalars, mid, rows);
    }
    bufs.swap_remove(0)
}

fn check_same(name: &str, k: &Kernel) {
    check_same_with(name, k, &[]);
}

fn check_same_with(name: &str, k: &Kernel, scalars: &[u64]) {
    let [chains, tiles, plain] = compile_all(k);
    for (rows, cols) in [(1, 1), (2, 255), (3, 256), (2, 257), (3, 700), (1, 4099)] {
        let init = values(rows * cols, 5);
        let want = run(&plain, k, rows, cols, &init, scalars);
        for (how, ck) in [("chains", &chains), ("tiles", &tiles)] {
            let got = run(ck, k, rows, cols, &init, scalars);
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(
                    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                    "{name} [{rows}x{cols}] at {i}: wide ({how}) {x:e} vs f32x4 {y:e}\n{}",
                    k.to_text()
                );
            }
        }
    }
}

#[test]
fn every_wide_op_matches_f32x4_bit_for_bit() {
    eprintln!("wide ISA here: {:?}", kiln_codegen::cpu::wide::detect());
    for op in wide::SUPPORTED {
        let k = kernel(&[Inner::Contiguous], |b| {
            let x = b.load(1, DType::F32);
            b.unary(op, x, DType::F32)
        });
        check_same(&format!("{op:?}"), &k);
    }
}

#[test]
fn gelu_chain_matches_f32x4() {
    // W1: gelu(x*a + b) * 0.5 + x
    let k = kernel(&[Inner::Contiguous; 3], |b| {
        let x = b.load(1, DType::F32);
        let a = b.load(2, DType::F32);
        let c = b.load(3, DType::F32);
        let m = b.binary(BinaryOp::Mul, x, a, DType::F32);
        let s = b.binary(BinaryOp::Add, m, c, DType::F32);
        let g = b.unary(UnaryOp::Gelu, s, DType::F32);
        let h = b.constant(0.5, DType::F32);
        let gh = b.binary(BinaryOp::Mul, g, h, DType::F32);
        b.binary(BinaryOp::Add, gh, x, DType::F32)
    });
    check_same("gelu chain", &k);
}

#[test]
fn chained_and_broadcast_wide_ops_match_f32x4() {
    // tanh(exp(x) * s) + sigmoid(x), s broadcast along the row; a softmax-style
    // exp((x - shift) - logsum) with both broadcast; strided rows stay scalar
    let k = kernel(&[Inner::Contiguous, Inner::Broadcast], |b| {
        let x = b.load(1, DType::F32);
        let s = b.load(2, DType::F32);
        let e = b.unary(UnaryOp::Exp, x, DType::F32);
        let es = b.binary(BinaryOp::Mul, e, s, DType::F32);
        let t = b.unary(UnaryOp::Tanh, es, DType::F32);
        let g = b.unary(UnaryOp::Sigmoid, x, DType::F32);
        b.binary(BinaryOp::Add, t, g, DType::F32)
    });
    check_same("exp-tanh-sigmoid", &k);
    let k = kernel(
        &[Inner::Contiguous, Inner::Broadcast, Inner::Broadcast],
        |b| {
            let x = b.load(1, DType::F32);
            let c = b.load(2, DType::F32);
            let l = b.load(3, DType::F32);
            let d = b.binary(BinaryOp::Sub, x, c, DType::F32);
            let z = b.binary(BinaryOp::Sub, d, l, DType::F32);
            b.unary(UnaryOp::Exp, z, DType::F32)
        },
    );
    check_same("softmax exp", &k);
    let k = kernel(&[Inner::Strided], |b| {
        let x = b.load(1, DType::F32);
        b.unary(UnaryOp::Erf, x, DType::F32)
    });
    check_same("strided erf", &k);
}

#[test]
fn in_place_wide_update_matches_f32x4() {
    // out = out + silu(x): the output is read before it is stored
    let k = kernel(&[Inner::Contiguous], |b| {
        let o = b.load(0, DType::F32);
        let x = b.load(1, DType::F32);
        let s = b.unary(UnaryOp::Silu, x, DType::F32);
        b.binary(BinaryOp::Add, o, s, DType::F32)
    });
    check_same("in-place silu", &k);
}

#[test]
fn chains_with_flipped_steps_scalars_and_broadcasts_match_f32x4() {
    // (3 / ((s - x) / c)) through gelu_tanh, then s + (c - g) * x: every
    // step kind, both operand orders, a scalar, a broadcast and a constant
    let mut k = kernel(&[Inner::Contiguous, Inner::Broadcast], |b| {
        let x = b.load(1, DType::F32);
        let c = b.load(2, DType::F32);
        let s = b.scalar(0, DType::F32);
        let three = b.constant(3.0, DType::F32);
        let d = b.binary(BinaryOp::Sub, s, x, DType::F32);
        let q = b.binary(BinaryOp::Div, d, c, DType::F32);
        let r = b.binary(BinaryOp::Div, three, q, DType::F32);
        let g = b.unary(UnaryOp::GeluTanh, r, DType::F32);
        let u = b.binary(BinaryOp::Sub, c, g, DType::F32);
        let m = b.binary(BinaryOp::Mul, u, x, DType::F32);
        b.binary(BinaryOp::Add, s, m, DType::F32)
    });
    k.scalars = vec![DType::F32];
    check_same_with("flipped chain", &k, &[0.1f64.to_bits()]);
    // each chain op with a step before and after it, and one computed
    // operand (not a chain: tiles)
    for op in wide::CHAIN_OPS {
        let k = kernel(&[Inner::Contiguous; 2], |b| {
            let x = b.load(1, DType::F32);
            let a = b.load(2, DType::F32);
            let m = b.binary(BinaryOp::Mul, x, a, DType::F32);
            let g = b.unary(op, m, DType::F32);
            b.binary(BinaryOp::Sub, g, x, DType::F32)
        });
        check_same(&format!("{op:?} chain"), &k);
        let k = kernel(&[Inner::Contiguous; 2], |b| {
            let x = b.load(1, DType::F32);
            let a = b.load(2, DType::F32);
            let g = b.unary(op, x, DType::F32);
            let xa = b.binary(BinaryOp::Add, x, a, DType::F32);
            b.binary(BinaryOp::Mul, g, xa, DType::F32)
        });
        check_same(&format!("{op:?} times a sum"), &k);
    }
}

#[test]
fn tiled_row_clif_snapshot() {
    // two wide ops are not one chain: the row keeps its tiles
    let k = kernel(&[Inner::Contiguous], |b| {
        let x = b.load(1, DType::F32);
        let e = b.unary(UnaryOp::Exp, x, DType::F32);
        let t = b.unary(UnaryOp::Tanh, x, DType::F32);
        b.binary(BinaryOp::Mul, e, t, DType::F32)
    });
    let text = CpuJit::clif_text_wide(&k).unwrap();
    assert!(text.contains("explicit_slot"), "{text}");
    insta::assert_snapshot!("tiled_exp_tanh_clif", text);
}

#[test]
fn chain_row_clif_snapshot() {
    // sigmoid(x - c) * x, c broadcast: the whole tiles are one helper call
    let k = kernel(&[Inner::Contiguous, Inner::Broadcast], |b| {
        let x = b.load(1, DType::F32);
        let c = b.load(2, DType::F32);
        let d = b.binary(BinaryOp::Sub, x, c, DType::F32);
        let g = b.unary(UnaryOp::Sigmoid, d, DType::F32);
        b.binary(BinaryOp::Mul, g, x, DType::F32)
    });
    let text = CpuJit::clif_text_wide(&k).unwrap();
    insta::assert_snapshot!("chain_sigmoid_mul_clif", text);
}

/// Median milliseconds of `f` over `reps` runs.
fn time_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[reps / 2]
}

/// Not a test: one-thread times of W1's kernel and softmax's exp kernel,
/// f32x4, tiles and chains, alternating (`cargo test --release -p kiln-codegen --test
/// cpu_wide -- --ignored --nocapture`).
#[test]
#[ignore]
fn time_wide_vs_f32x4() {
    let w1 = kernel(&[Inner::Contiguous; 3], |b| {
        let x = b.load(1, DType::F32);
        let a = b.load(2, DType::F32);
        let c = b.load(3, DType::F32);
        let m = b.binary(BinaryOp::Mul, x, a, DType::F32);
        let s = b.binary(BinaryOp::Add, m, c, DType::F32);
        let g = b.unary(UnaryOp::Gelu, s, DType::F32);
        let h = b.constant(0.5, DType::F32);
        let gh = b.binary(BinaryOp::Mul, g, h, DType::F32);
        b.binary(BinaryOp::Add, gh, x, DType::F32)
    });
    let sm = kernel(
        &[Inner::Contiguous, Inner::Broadcast, Inner::Broadcast],
        |b| {
            let x = b.load(1, DType::F32);
            let c = b.load(2, DType::F32);
            let l = b.load(3, DType::F32);
            let d = b.binary(BinaryOp::Sub, x, c, DType::F32);
            let z = b.binary(BinaryOp::Sub, d, l, DType::F32);
            b.unary(UnaryOp::Exp, z, DType::F32)
        },
    );
    for (name, k, rows, cols) in [
        ("W1 gelu chain", &w1, 4096, 1024),
        ("softmax exp", &sm, 4096, 1024),
    ] {
        let [c, t, p] = compile_all(k);
        let mut bufs: Vec<Vec<f32>> = vec![vec![0f32; rows * cols]];
        let mut strides = vec![cols as isize, 1];
        for (i, o) in k.operands.iter().enumerate().skip(1) {
            let bc = o.inner == Inner::Broadcast;
            bufs.push(values(if bc { rows } else { rows * cols }, i as u64));
            strides.extend_from_slice(&if bc { [1, 0] } else { [cols as isize, 1] });
        }
        let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr() as *mut u8).collect();
        let go =
            |ck: &CompiledKernel| unsafe { ck.call(&ptrs, &strides, &[rows, cols], &[], 0, rows) };
        for round in 0..3 {
            let tp = time_ms(9, || go(&p));
            let tt = time_ms(9, || go(&t));
            let tc = time_ms(9, || go(&c));
            eprintln!(
                "{name} ({rows}x{cols}, 1 thread) round {round}: f32x4 {tp:.3} ms, \
                 tiles {tt:.3} ms, chains {tc:.3} ms"
            );
        }
    }
}
