//! Float Sum along a contiguous row adds in PyTorch's order (`SumKernel.cpp`):
//! rows shorter than 8 (f32) keep 4 interleaved partial sums, the tail goes
//! into the first, then they are combined left to right; longer rows do the
//! same with 8-wide vectors, then add the scalar tail and the lanes in order.

mod common;

use common::*;

fn row_sum_kernel(dt: DType, body_neg: bool) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let v = if body_neg {
        b.unary(UnaryOp::Neg, x, dt)
    } else {
        x
    };
    let n = b.instrs.len();
    Kernel {
        name: "sum".into(),
        rank: 2,
        operands: vec![op(dt, Inner::Broadcast), op(dt, Inner::Contiguous)],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind: ReduceKind::Sum,
            value: v,
            dtype: dt,
        }),
        epilogue: vec![(Instr::Acc, dt)],
        out: n,
        extra_out: vec![],
        rows: None,
    }
}

/// Runs `k` over a (rows, n) input of `dt` with the interpreter and the JIT;
/// returns both outputs' bits. `xs` holds the input as f64.
fn both(
    k: &Kernel,
    xs: &[f64],
    rows: usize,
    n: usize,
    in_strides: [isize; 2],
) -> (Vec<u64>, Vec<u64>) {
    let dt = k.operands[1].dtype;
    let mut inp = vec![0u8; xs.len() * dt.size()];
    for (i, &x) in xs.iter().enumerate() {
        Val::F(x).write_le_bytes(dt, &mut inp[i * dt.size()..]);
    }
    let strides = [1, 0, in_strides[0], in_strides[1]];
    let bits = |o: &[u8]| -> Vec<u64> {
        (0..rows)
            .map(|r| match dt {
                F32 => f32::from_le_bytes(o[r * 4..r * 4 + 4].try_into().unwrap()).to_bits() as u64,
                _ => f64::from_le_bytes(o[r * 8..r * 8 + 8].try_into().unwrap()).to_bits(),
            })
            .collect()
    };
    let mut oi = vec![0u8; rows * dt.size()];
    let mut oj = vec![0u8; rows * dt.size()];
    let pi = [oi.as_mut_ptr(), inp.as_ptr() as *mut u8];
    unsafe { run_kernel(k, &pi, &strides, &[rows, n], &[], 0, rows) };
    let ck = compile(k);
    let pj = [oj.as_mut_ptr(), inp.as_ptr() as *mut u8];
    unsafe { ck.call(&pj, &strides, &[rows, n], &[], 0, rows) };
    (bits(&oi), bits(&oj))
}

/// PyTorch's `row_sum` (ilp 4) on scalars, as in SumKernel.cpp.
fn torch_scalar_row_sum<T: Copy + std::ops::Add<Output = T> + Default>(x: &[T]) -> T {
    let mut acc = [T::default(); 4];
    let m = x.len() / 4;
    for i in 0..m {
        for k in 0..4 {
            acc[k] = acc[k] + x[i * 4 + k];
        }
    }
    for &v in &x[m * 4..] {
        acc[0] = acc[0] + v;
    }
    acc[0] + acc[1] + acc[2] + acc[3]
}

/// PyTorch's `vectorized_inner_sum` with `W`-wide vectors (below its cascade),
/// and its dispatch: rows shorter than W take the scalar path.
fn torch_row_sum<T: Copy + std::ops::Add<Output = T> + Default, const W: usize>(x: &[T]) -> T {
    if x.len() < W {
        return T::default() + torch_scalar_row_sum(x);
    }
    let nv = x.len() / W;
    let vadd = |a: [T; W], b: &[T]| -> [T; W] { std::array::from_fn(|l| a[l] + b[l]) };
    let vec = |j: usize| &x[j * W..(j + 1) * W];
    let mut acc = [[T::default(); W]; 4];
    let m = nv / 4;
    for i in 0..m {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = vadd(*a, vec(i * 4 + k));
        }
    }
    for j in m * 4..nv {
        acc[0] = vadd(acc[0], vec(j));
    }
    for k in 1..4 {
        acc[0] = vadd(acc[0], &acc[k]);
    }
    let mut r = T::default();
    for &v in x[nv * W..].iter().chain(&acc[0]) {
        r = r + v;
    }
    r
}

#[test]
fn five_values_in_pytorch_order() {
    // Sequentially 1 + 2^-30 rounds back to 1, so x0..x4 in order gives 0;
    // PyTorch adds (((x0 + x4) + x1) + x2) + x3 = 2^-30.
    let t = (2f64).powi(-30);
    let xs = [1.0, t, 0.0, 0.0, -1.0];
    let want = [t as f32];
    assert_eq!(torch_row_sum::<f32, 8>(&xs.map(|x| x as f32)), want[0]);
    for body_neg in [false, true] {
        let k = row_sum_kernel(F32, body_neg);
        let (i, j) = both(&k, &xs, 1, 5, [5, 1]);
        let w = if body_neg { -want[0] } else { want[0] };
        assert_eq!(i, [w.to_bits() as u64], "interpreted");
        assert_eq!(j, [w.to_bits() as u64], "compiled");
    }
    // Row 2 of the views/expand_minus1 gradient: PyTorch's sum (0x400f0b81)
    // is 1 ulp above the sequential one.
    let row = [
        0x3f05_f35a_u32,
        0x3f35_e707,
        0x3fff_1898,
        0xbf58_671d,
        0xbe15_d9ce,
    ]
    .map(|b| f32::from_bits(b) as f64);
    let k = row_sum_kernel(F32, false);
    let (i, j) = both(&k, &row, 1, 5, [5, 1]);
    assert_eq!((i[0], j[0]), (0x400f_0b81, 0x400f_0b81));
    let seq = row.iter().fold(0f32, |a, &x| a + x as f32);
    assert_eq!(seq.to_bits(), 0x400f_0b80);
}

#[test]
fn rows_match_pytorch_bit_for_bit() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // wide dynamic range so the order shows
        let m = (rng >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        m * (2f64).powi((rng % 20) as i32)
    };
    let lens: Vec<usize> = (0..=70).chain([95, 127, 128, 129, 255, 300, 511]).collect();
    for &n in &lens {
        let rows = 3;
        let xs: Vec<f64> = (0..rows * n).map(|_| next()).collect();
        for dt in [F32, F64] {
            let k = row_sum_kernel(dt, false);
            let (i, j) = both(&k, &xs, rows, n, [n as isize, 1]);
            let want: Vec<u64> = xs
                .chunks(n.max(1))
                .take(rows)
                .map(|r| match dt {
                    F32 => {
                        let r: Vec<f32> = r.iter().map(|&x| x as f32).collect();
                        torch_row_sum::<f32, 8>(if n == 0 { &[] } else { &r }).to_bits() as u64
                    }
                    _ => torch_row_sum::<f64, 4>(if n == 0 { &[] } else { r }).to_bits(),
                })
                .collect();
            let want = if n == 0 { vec![0; rows] } else { want };
            assert_eq!(i, want, "interpreted {dt} n={n}");
            assert_eq!(j, want, "compiled {dt} n={n}");
        }
    }
}

/// Timing of a (4096, 1024) f32 row sum (and an in-cache (64, 1024) and a
/// (4096, 5) one), single-threaded: `cargo test --release -p kiln-codegen
/// --test sum_order -- --ignored --nocapture`.
#[test]
#[ignore]
fn time_row_sum() {
    let k = row_sum_kernel(F32, false);
    let ck = compile(&k);
    for (rows, n, reps) in [
        (4096usize, 1024usize, 50),
        (64, 1024, 3000),
        (4096, 5, 2000),
    ] {
        let xs: Vec<f32> = (0..rows * n).map(|i| (i % 97) as f32 * 0.01).collect();
        let mut out = vec![0f32; rows];
        let ptrs = [out.as_mut_ptr() as *mut u8, xs.as_ptr() as *mut u8];
        let strides = [1, 0, n as isize, 1];
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                unsafe { ck.call(&ptrs, &strides, &[rows, n], &[], 0, rows) };
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e3 / reps as f64);
        }
        let gbps = (rows * n * 4) as f64 / (best * 1e-3) / 1e9;
        println!("row sum ({rows}, {n}) f32: {best:.4} ms/call, {gbps:.1} GB/s");
    }
}

/// A row sum the vector plan cannot take (a bool mask load) still adds in
/// PyTorch's order, with scalar accumulators; a strided row adds in order.
#[test]
fn scalar_plan_and_strided_rows() {
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let m = b.load(2, Bool);
    let z = b.constant(0.0, F32);
    let v = b.select(m, x, z, F32);
    let nb = b.instrs.len();
    let k = Kernel {
        name: "masked_sum".into(),
        rank: 2,
        operands: vec![
            op(F32, Inner::Broadcast),
            op(F32, Inner::Contiguous),
            op(Bool, Inner::Contiguous),
        ],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind: ReduceKind::Sum,
            value: v,
            dtype: F32,
        }),
        epilogue: vec![(Instr::Acc, F32)],
        out: nb,
        extra_out: vec![],
        rows: None,
    };
    let ck = compile(&k);
    assert_eq!(ck.lanes, 1);
    for n in [0usize, 1, 5, 7, 8, 13, 31, 32, 33, 64, 100, 131] {
        let rows = 2;
        let xs: Vec<f32> = (0..rows * n)
            .map(|i| ((i * 7919 % 1009) as f32 - 500.0) * (2f32).powi((i % 23) as i32 - 11))
            .collect();
        let ms: Vec<u8> = (0..rows * n).map(|i| (i % 5 != 3) as u8).collect();
        let strides = [1, 0, n as isize, 1, n as isize, 1];
        let mut oi = [0f32; 2];
        let mut oj = [0f32; 2];
        let pi = [
            oi.as_mut_ptr() as *mut u8,
            xs.as_ptr() as *mut u8,
            ms.as_ptr() as *mut u8,
        ];
        unsafe { run_kernel(&k, &pi, &strides, &[rows, n], &[], 0, rows) };
        let pj = [
            oj.as_mut_ptr() as *mut u8,
            xs.as_ptr() as *mut u8,
            ms.as_ptr() as *mut u8,
        ];
        unsafe { ck.call(&pj, &strides, &[rows, n], &[], 0, rows) };
        for r in 0..rows {
            let vals: Vec<f32> = (r * n..(r + 1) * n)
                .map(|i| if ms[i] != 0 { xs[i] } else { 0.0 })
                .collect();
            let want = torch_row_sum::<f32, 8>(&vals).to_bits();
            assert_eq!(oi[r].to_bits(), want, "interpreted n={n} row {r}");
            assert_eq!(oj[r].to_bits(), want, "compiled n={n} row {r}");
        }
    }
    // Strided along the reduced dim: plain left-to-right order.
    let k = row_sum_kernel(F32, false);
    let mut k = k;
    k.operands[1].inner = Inner::Strided;
    let t = (2f64).powi(-30);
    let mut xs = vec![0.0; 10];
    for (j, v) in [1.0, t, 0.0, 0.0, -1.0].into_iter().enumerate() {
        xs[2 * j] = v;
    }
    let (i, j) = both(&k, &xs, 1, 5, [10, 2]);
    assert_eq!((i[0], j[0]), (0, 0));
}
