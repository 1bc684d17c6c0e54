//! Multi-output pointwise kernels (several outputs stored in one loop, an
//! output also loaded for an in-place update): the Cranelift code against
//! the interpreter on every output, and what the validator rejects.

mod common;

use common::multi_out::{adam_step, lstm_cell, swap, ADAM_SCALARS};
use common::*;
use kiln_codegen::interp::validate;

/// Runs `k` with the interpreter and the JIT (dim 0 in three calls) on
/// copies of `views` and compares every output operand. Returns the lanes.
fn check_outputs(k: &Kernel, sizes: &[usize], views: &[(Vec<isize>, Vec<u8>)], sc: &[u64]) -> u32 {
    let ck = compile(k);
    let strides: Vec<isize> = views.iter().flat_map(|v| v.0.iter().copied()).collect();
    let n0 = if k.rank == 0 { 1 } else { sizes[0] };
    let mut want: Vec<Vec<u8>> = views.iter().map(|v| v.1.clone()).collect();
    let mut got = want.clone();
    let ptrs =
        |b: &mut Vec<Vec<u8>>| -> Vec<*mut u8> { b.iter_mut().map(|v| v.as_mut_ptr()).collect() };
    let pw = ptrs(&mut want);
    unsafe { run_kernel(k, &pw, &strides, sizes, sc, 0, n0) };
    let pg = ptrs(&mut got);
    // an in-place update must run once per index: rank 0 in one call
    let cuts = if k.rank == 0 {
        vec![0, n0]
    } else {
        vec![0, n0 / 3, (2 * n0) / 3, n0]
    };
    for w in cuts.windows(2) {
        unsafe { ck.call(&pg, &strides, sizes, sc, w[0], w[1]) };
    }
    for op in 0..k.outputs() {
        let dt = k.operands[op].dtype;
        let sz = dt.size();
        for e in 0..want[op].len() / sz {
            let a = Val::from_le_bytes(&got[op][e * sz..], dt);
            let b = Val::from_le_bytes(&want[op][e * sz..], dt);
            assert!(
                close(a, b, &tol_for(dt)),
                "out{op}[{e}]: jit {a:?} vs interp {b:?} (sizes {sizes:?}, lanes {})\n{}",
                ck.lanes,
                k.to_text()
            );
        }
    }
    ck.lanes
}

/// Views for `k` over `sizes`: outputs and inputs laid out as `layouts[op]`.
fn views(
    k: &Kernel,
    sizes: &[usize],
    layouts: &[Layout],
    rng: &mut Rng,
) -> Vec<(Vec<isize>, Vec<u8>)> {
    k.operands
        .iter()
        .zip(layouts)
        .map(|(o, &l)| {
            let (st, len) = layout(sizes, l);
            (st, gen(rng, o.dtype, len, 0.0, 2.0, true))
        })
        .collect()
}

#[test]
fn adam_step_matches_interpreter() {
    let mut rng = Rng(0xada5);
    use Layout::*;
    let cases = [
        (1, Inner::Contiguous, Inner::Contiguous, [Contiguous; 4]),
        (3, Inner::Contiguous, Inner::Contiguous, [Contiguous; 4]),
        (
            2,
            Inner::Contiguous,
            Inner::Broadcast,
            [Contiguous, Contiguous, Contiguous, Broadcast],
        ),
        (2, Inner::Strided, Inner::Strided, [Permuted; 4]),
        (0, Inner::Contiguous, Inner::Contiguous, [Contiguous; 4]),
    ];
    for dt in [F32, F64] {
        let sc: Vec<u64> = ADAM_SCALARS.iter().map(|v| v.to_bits()).collect();
        for (rank, outs, g, ls) in cases {
            let k = adam_step(dt, rank, outs, g);
            for sizes in shapes(rank) {
                let vs = views(&k, &sizes, &ls, &mut rng);
                let lanes = check_outputs(&k, &sizes, &vs, &sc);
                if outs == Inner::Contiguous && rank > 0 {
                    assert!(
                        lanes > 1,
                        "{dt} rank {rank}: the update should be vectorised"
                    );
                }
            }
        }
    }
}

#[test]
fn lstm_cell_stores_both_states_from_one_body() {
    let mut rng = Rng(0x157);
    use Layout::*;
    for dt in [F32, F64] {
        for (rank, inner, c0, ls) in [
            (2, Inner::Contiguous, Inner::Contiguous, [Contiguous; 7]),
            (
                2,
                Inner::Contiguous,
                Inner::Broadcast,
                [
                    Contiguous, Contiguous, Contiguous, Contiguous, Contiguous, Contiguous,
                    Broadcast,
                ],
            ),
            (3, Inner::Strided, Inner::Strided, [Permuted; 7]),
            (0, Inner::Contiguous, Inner::Contiguous, [Contiguous; 7]),
        ] {
            let k = lstm_cell(dt, rank, inner, c0);
            assert_eq!(k.outputs(), 2);
            for sizes in shapes(rank) {
                let vs = views(&k, &sizes, &ls, &mut rng);
                let lanes = check_outputs(&k, &sizes, &vs, &[]);
                if inner == Inner::Contiguous && rank > 0 {
                    assert!(lanes > 1, "{dt} rank {rank}: the cell should be vectorised");
                }
            }
        }
    }
    // and the two stores hold c and h = sigmoid(o) * tanh(c)
    let k = lstm_cell(F32, 1, Inner::Contiguous, Inner::Contiguous);
    let (mut c, mut h) = ([0f32; 2], [0f32; 2]);
    let mut ins = [
        [0.5f32, -1.0],
        [2.0, 0.0],
        [-0.3, 1.5],
        [1.0, -2.0],
        [0.25, 3.0],
    ];
    let mut ptrs = vec![c.as_mut_ptr() as *mut u8, h.as_mut_ptr() as *mut u8];
    ptrs.extend(ins.iter_mut().map(|v| v.as_mut_ptr() as *mut u8));
    let ck = compile(&k);
    unsafe { ck.call(&ptrs, &[1; 7], &[2], &[], 0, 2) };
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    for e in 0..2 {
        let [i, f, g, o, c0] = ins.map(|v| v[e]);
        let want_c = sig(f) * c0 + sig(i) * g.tanh();
        assert!((c[e] - want_c).abs() < 1e-6, "c[{e}] {} vs {want_c}", c[e]);
        let want_h = sig(o) * want_c.tanh();
        assert!((h[e] - want_h).abs() < 1e-6, "h[{e}] {} vs {want_h}", h[e]);
    }
}

#[test]
fn in_place_outputs_read_old_values() {
    let mut rng = Rng(0x5a9);
    for (dt, sum_dt) in [(F32, F32), (F64, F64), (F32, F64), (I32, I64)] {
        for (rank, inner, l) in [
            (1, Inner::Contiguous, Layout::Contiguous),
            (2, Inner::Strided, Layout::Permuted),
            (0, Inner::Contiguous, Layout::Contiguous),
        ] {
            let k = swap(dt, sum_dt, rank, inner);
            for sizes in shapes(rank) {
                let vs = views(&k, &sizes, &[l; 3], &mut rng);
                check_outputs(&k, &sizes, &vs, &[]);
            }
        }
    }
    // and the interpreter itself swaps
    let k = swap(F32, F32, 1, Inner::Contiguous);
    let (mut x, mut y, mut s) = ([1f32, 2.0, 3.0], [10f32, 20.0, 30.0], [0f32; 3]);
    let ptrs = [
        x.as_mut_ptr() as *mut u8,
        y.as_mut_ptr() as *mut u8,
        s.as_mut_ptr() as *mut u8,
    ];
    unsafe { run_kernel(&k, &ptrs, &[1, 1, 1], &[3], &[], 0, 3) };
    assert_eq!(
        (x, y, s),
        ([10.0, 20.0, 30.0], [1.0, 2.0, 3.0], [11.0, 22.0, 33.0])
    );
}

#[test]
fn text_names_outputs() {
    let t = adam_step(F32, 1, Inner::Contiguous, Inner::Contiguous).to_text();
    for want in [
        "out0: f32",
        "out2: f32",
        "in3: f32",
        "%0 = load out0",
        "store %",
    ] {
        assert!(t.contains(want), "{want} not in\n{t}");
    }
}

#[test]
fn validator_rejects_bad_multi_output() {
    // two outputs need two operands
    let mut k = swap(F32, F32, 1, Inner::Contiguous);
    (k.out, k.extra_out) = (0, vec![0]);
    k.operands.truncate(1);
    k.body.truncate(1);
    let e = validate(&k).unwrap_err().to_string();
    assert!(e.contains("2 outputs but 1 operands"), "{e}");
    // a reduction may not load its output
    let mut b = KernelBuilder::default();
    let x = b.load(0, F32);
    let k = Kernel {
        name: "r".into(),
        rank: 1,
        operands: vec![op(F32, Inner::Broadcast), op(F32, Inner::Contiguous)],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind: ReduceKind::Sum,
            value: x,
            dtype: F32,
        }),
        epilogue: vec![(Instr::Acc, F32)],
        out: 1,
        extra_out: vec![],
        rows: None,
    };
    let e = validate(&k).unwrap_err().to_string();
    assert!(e.contains("loads the output of a reduction"), "{e}");
}
