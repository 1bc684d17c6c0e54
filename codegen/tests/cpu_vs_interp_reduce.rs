//! Reductions: compiled kernels against the reference interpreter.

mod common;

use common::*;

fn reduction(
    kind: ReduceKind,
    dt: DType,
    acc_dt: DType,
    in_layout: Layout,
    rank: usize,
    softmax_body: bool,
    seed: u64,
) {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let value = if softmax_body {
        // exp(x - m) with m broadcast along the reduced dim
        let m = b.load(2, dt);
        let d = b.binary(BinaryOp::Sub, x, m, dt);
        b.unary(UnaryOp::Exp, d, dt)
    } else {
        x
    };
    let nb = b.instrs.len();
    let out_dt = if matches!(kind, ReduceKind::ArgMax | ReduceKind::ArgMin) {
        I64
    } else {
        acc_dt
    };
    let mut epilogue = vec![(Instr::Acc, acc_dt)];
    let mut out = nb;
    if softmax_body {
        // out = 1 / acc
        epilogue.push((Instr::Unary(UnaryOp::Reciprocal, nb), acc_dt));
        out = nb + 1;
    }
    let mut rng = Rng(seed | 1);
    let shapes: Vec<Vec<usize>> = match rank {
        1 => vec![vec![0], vec![1], vec![7], vec![37], vec![1000]],
        // 37 and 19 outer: whole column blocks and a tail (`columns.rs`)
        2 => vec![
            vec![3, 13],
            vec![5, 8],
            vec![2, 0],
            vec![4, 1],
            vec![2, 67],
            vec![37, 13],
            vec![19, 67],
            vec![40, 0],
        ],
        _ => vec![vec![2, 3, 17], vec![3, 2, 9], vec![2, 35, 6]],
    };
    for sizes in shapes {
        let outer = &sizes[..rank - 1];
        let (mut ost, olen) = layout(outer, Layout::Contiguous);
        ost.push(0);
        let mut views = vec![(ost, vec![0u8; olen * out_dt.size()])];
        let (st, len) = layout(&sizes, in_layout);
        let mut operands = vec![op(out_dt, Inner::Broadcast), op(dt, inner_of(&st))];
        let (lo, hi) = if softmax_body {
            (-20.0, 5.0)
        } else {
            (-3.0, 3.0)
        };
        let edges = !matches!(kind, ReduceKind::Sum | ReduceKind::Prod) && !softmax_body;
        views.push((st, gen(&mut rng, dt, len, lo, hi, edges)));
        if softmax_body {
            let (mut mst, mlen) = layout(outer, Layout::Contiguous);
            mst.push(0);
            operands.push(op(dt, Inner::Broadcast));
            views.push((mst, gen(&mut rng, dt, mlen, -1.0, 1.0, false)));
        }
        let k = Kernel {
            name: "r".into(),
            rank,
            operands,
            scalars: vec![],
            body: b.instrs.clone(),
            reduce: Some(Reduction {
                kind,
                value,
                dtype: acc_dt,
            }),
            epilogue: epilogue.clone(),
            out,
            extra_out: vec![],
            rows: None,
        };
        let t = match (kind, acc_dt) {
            // Float sums add in the same (PyTorch's) order in both.
            (ReduceKind::Sum, F32 | F64) if !softmax_body => Tol {
                rtol: 0.0,
                atol: 0.0,
            },
            (ReduceKind::Sum | ReduceKind::Prod, F32) => Tol {
                rtol: 1e-4,
                atol: 1e-4,
            },
            (ReduceKind::Sum | ReduceKind::Prod, F64) => Tol {
                rtol: 1e-12,
                atol: 1e-12,
            },
            _ => tol_for(out_dt),
        };
        check(&k, &sizes, &views, &[], &t);
    }
}

#[test]
fn reductions() {
    use ReduceKind::*;
    let mut seed = 1;
    for kind in [Sum, Prod, Max, Min, ArgMax, ArgMin] {
        for dt in [F32, F64, I64, I32, U8] {
            let acc = match kind {
                ArgMax | ArgMin => I64,
                Sum | Prod if !dt.is_float() => I64,
                _ => dt,
            };
            for (layout, rank) in [
                (Layout::Contiguous, 1),
                (Layout::Contiguous, 2),
                (Layout::Permuted, 2),
                (Layout::OuterBroadcast, 3),
                (Layout::Broadcast, 2),
            ] {
                seed += 1;
                reduction(kind, dt, acc, layout, rank, false, seed);
            }
        }
    }
    for dt in [F32, F64] {
        for rank in [1, 2, 3] {
            reduction(Sum, dt, dt, Layout::Contiguous, rank, true, 99);
            reduction(Max, dt, dt, Layout::Contiguous, rank, true, 98);
        }
    }
}

#[test]
fn argmax_first_index_and_nan() {
    let mut b = KernelBuilder::default();
    b.load(1, F32);
    let k = Kernel {
        name: "argmax".into(),
        rank: 1,
        operands: vec![op(I64, Inner::Broadcast), op(F32, Inner::Contiguous)],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind: ReduceKind::ArgMax,
            value: 0,
            dtype: I64,
        }),
        epilogue: vec![(Instr::Acc, I64)],
        out: 1,
        extra_out: vec![],
        rows: None,
    };
    let ck = compile(&k);
    for (xs, want) in [
        (vec![1.0f32, 3.0, 3.0, 2.0], 1i64),
        (vec![1.0, f32::NAN, 5.0, f32::NAN], 1),
        (vec![f32::NEG_INFINITY; 3], 0),
        (vec![], 0),
    ] {
        let mut out = -1i64;
        let ptrs = [&mut out as *mut i64 as *mut u8, xs.as_ptr() as *mut u8];
        unsafe { ck.call(&ptrs, &[0, 1], &[xs.len()], &[], 0, 1) };
        assert_eq!(out, want, "{xs:?}");
    }
}
