//! The kernel corpus of the CUDA C shim test: every op and reduction kind,
//! casts, scalars, the snapshot kernels, over ranks, layouts and odd sizes
//! (f16/bf16 in `half.rs`, the vector path in `vector.rs`).

use super::common::*;
use kiln_codegen::AccPart;

pub struct Case {
    pub label: String,
    pub k: Kernel,
    pub sizes: Vec<usize>,
    /// (strides, storage); the outputs come first.
    pub views: Vec<(Vec<isize>, Vec<u8>)>,
    pub scalars: Vec<u64>,
    pub tol: Tol,
    pub grid: u32,
    pub block: u32,
    /// Elements each operand's storage starts past a 16-byte boundary
    /// (missing: 0), to take the vector path or not.
    pub shift: Vec<usize>,
}

pub const LAYOUTS: [Layout; 4] = [
    Layout::Contiguous,
    Layout::Permuted,
    Layout::Broadcast,
    Layout::OuterBroadcast,
];

pub fn kernel(
    name: &str,
    rank: usize,
    operands: Vec<Operand>,
    b: KernelBuilder,
    out: usize,
) -> Kernel {
    Kernel {
        name: name.into(),
        rank,
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

/// Pointwise `out = body(in1 [, in2])` cases for every shape of `rank`.
#[allow(clippy::too_many_arguments)]
pub fn pointwise_cases(
    cases: &mut Vec<Case>,
    label: &str,
    body: &dyn Fn(&mut KernelBuilder) -> usize,
    in_dts: &[DType],
    out_dt: DType,
    layouts: &[Layout],
    rank: usize,
    range: (f64, f64),
    scalars: (&[DType], &[u64]),
    rng: &mut Rng,
) {
    let mut b = KernelBuilder::default();
    let out = body(&mut b);
    for sizes in shapes(rank) {
        let (ost, olen) = layout(&sizes, Layout::Contiguous);
        let mut views = vec![(ost, vec![0u8; olen * out_dt.size()])];
        let mut operands = vec![op(out_dt, Inner::Contiguous)];
        for (i, &dt) in in_dts.iter().enumerate() {
            let (st, len) = layout(&sizes, layouts[i]);
            operands.push(op(dt, inner_of(&st)));
            views.push((st, gen(rng, dt, len, range.0, range.1, true)));
        }
        let mut k = kernel(label, rank, operands, b.clone_builder(), out);
        k.scalars = scalars.0.to_vec();
        cases.push(Case {
            label: format!("{label} {sizes:?} {layouts:?}"),
            k,
            sizes,
            views,
            scalars: scalars.1.to_vec(),
            tol: tol_for(out_dt),
            grid: 2,
            block: 64,
            shift: vec![],
        });
    }
}

pub trait CloneBuilder {
    fn clone_builder(&self) -> KernelBuilder;
}
impl CloneBuilder for KernelBuilder {
    fn clone_builder(&self) -> KernelBuilder {
        KernelBuilder {
            instrs: self.instrs.clone(),
        }
    }
}

fn unary_ops() -> Vec<UnaryOp> {
    UnaryOp::EXAMPLES.to_vec()
}

fn binary_ops() -> Vec<BinaryOp> {
    BinaryOp::ALL.to_vec()
}

/// reduce(kind) of `x * 2` along the last dim; epilogue `acc (+ load in2)`.
#[allow(clippy::too_many_arguments)]
fn reduction_cases(
    cases: &mut Vec<Case>,
    kind: ReduceKind,
    dt: DType,
    in_layout: Layout,
    rank: usize,
    epi_load: bool,
    block: u32,
    rng: &mut Rng,
) {
    let arg = matches!(kind, ReduceKind::ArgMax | ReduceKind::ArgMin);
    let acc_dt = if arg { I64 } else { dt };
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let two = b.constant(2.0, dt);
    let v = b.binary(BinaryOp::Mul, x, two, dt);
    let nb = b.instrs.len();
    let mut epilogue = vec![(Instr::Acc, acc_dt)];
    if epi_load {
        epilogue.push((Instr::Load(2), acc_dt));
        epilogue.push((Instr::Binary(BinaryOp::Add, nb, nb + 1), acc_dt));
    }
    let out = nb + epilogue.len() - 1;
    // one-pass reductions also store their parts, after acc
    let mut extra_out = vec![];
    let parts: &[AccPart] = match kind {
        ReduceKind::LogSumExp => &[AccPart::Shift, AccPart::LogSum],
        ReduceKind::Welford => &[AccPart::Mean],
        _ => &[],
    };
    for &p in parts {
        epilogue.push((Instr::AccPart(p), acc_dt));
        extra_out.push(nb + epilogue.len() - 1);
    }
    let tuple = 1 + extra_out.len();
    let sum_prod = matches!(kind, ReduceKind::Sum | ReduceKind::Prod);
    let (lo, hi) = match kind {
        ReduceKind::Prod => (-1.5, 1.5),
        _ => (-3.0, 3.0),
    };
    let shapes: Vec<Vec<usize>> = match rank {
        1 => vec![vec![1], vec![7], vec![37], vec![1000]],
        2 => vec![vec![3, 13], vec![5, 8], vec![2, 0], vec![4, 1], vec![2, 67]],
        _ => vec![vec![2, 3, 17], vec![3, 2, 9]],
    };
    for sizes in shapes {
        let outer = &sizes[..rank - 1];
        let (mut ost, olen) = layout(outer, Layout::Contiguous);
        ost.push(0);
        let tuple_st = ost.iter().map(|s| s * tuple as isize).collect();
        let mut views = vec![(tuple_st, vec![0u8; olen * tuple * acc_dt.size()])];
        let (st, len) = layout(&sizes, in_layout);
        let mut operands = vec![op(acc_dt, Inner::Broadcast), op(dt, inner_of(&st))];
        // inf - inf cancels order-dependently in sums and in Welford's deltas
        let edges = !((sum_prod || kind == ReduceKind::Welford) && dt.is_float());
        views.push((st, gen(rng, dt, len, lo, hi, edges)));
        if epi_load {
            operands.push(op(acc_dt, Inner::Broadcast));
            views.push((ost, gen(rng, acc_dt, olen, -1.0, 1.0, false)));
        }
        let n = *sizes.last().unwrap() as f64;
        let tol = if sum_prod && acc_dt.is_float() {
            Tol {
                rtol: 1e-4,
                atol: 1e-6 * n.max(1.0) * 2.0 * hi,
            }
        } else if kind.float_only() && acc_dt == F32 {
            // merged in the kernel's tree order, not sequentially
            Tol {
                rtol: 1e-5,
                atol: 1e-5,
            }
        } else {
            tol_for(acc_dt)
        };
        let k = Kernel {
            name: format!("{kind}.{dt}"),
            rank,
            operands,
            scalars: vec![],
            body: b.instrs.clone(),
            reduce: Some(Reduction {
                kind,
                value: v,
                dtype: acc_dt,
            }),
            epilogue: epilogue.clone(),
            out,
            extra_out: extra_out.clone(),
            rows: None,
        };
        cases.push(Case {
            label: format!("{kind}.{dt} {sizes:?} {in_layout:?} epi={epi_load} block={block}"),
            k,
            sizes,
            views,
            scalars: vec![],
            tol,
            grid: 2,
            block,
            shift: vec![],
        });
    }
}

/// The three kernels of the snapshot tests, on their snapshot layouts.
fn snapshot_cases(cases: &mut Vec<Case>, rng: &mut Rng) {
    let l = [Layout::Contiguous, Layout::OuterBroadcast];
    let add = |b: &mut KernelBuilder| {
        let x = b.load(1, F32);
        let y = b.load(2, F32);
        b.binary(BinaryOp::Add, x, y, F32)
    };
    // `add`'s in2 is broadcast along the inner dim: a [n0, 1]-like view.
    let mut b = KernelBuilder::default();
    let z = add(&mut b);
    for sizes in [vec![3usize, 13], vec![5, 8]] {
        let (ost, olen) = layout(&sizes, Layout::Contiguous);
        let (ist, ilen) = layout(&sizes, l[0]);
        let bst = vec![1isize, 0];
        let views = vec![
            (ost, vec![0u8; olen * 4]),
            (ist, gen(rng, F32, ilen, -3.0, 3.0, true)),
            (bst, gen(rng, F32, sizes[0], -3.0, 3.0, true)),
        ];
        let ops = vec![
            op(F32, Inner::Contiguous),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Broadcast),
        ];
        cases.push(Case {
            label: format!("snapshot add {sizes:?}"),
            k: kernel("add", 2, ops, b.clone_builder(), z),
            sizes,
            views,
            scalars: vec![],
            tol: F32TOL,
            grid: 2,
            block: 256,
            shift: vec![],
        });
    }
    let mut rng2 = Rng(rng.0 ^ 0x55);
    pointwise_cases(
        cases,
        "exp",
        &|b| {
            let x = b.load(1, F32);
            b.unary(UnaryOp::Exp, x, F32)
        },
        &[F32],
        F32,
        &[Layout::Permuted],
        2,
        (-5.0, 5.0),
        (&[], &[]),
        &mut rng2,
    );
    // softmax.sum: out[i] = sum_j exp(x[i, j] - m[i]), block 256 as on a GPU.
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let m = b.load(2, F32);
    let d = b.binary(BinaryOp::Sub, x, m, F32);
    let e = b.unary(UnaryOp::Exp, d, F32);
    let n = b.instrs.len();
    for sizes in [vec![3usize, 13], vec![2, 300], vec![1, 1000]] {
        let (ost, olen) = layout(&sizes[..1], Layout::Contiguous);
        let ost = vec![ost[0], 0];
        let (ist, ilen) = layout(&sizes, Layout::Contiguous);
        let views = vec![
            (ost.clone(), vec![0u8; olen * 4]),
            (ist, gen(rng, F32, ilen, -20.0, 5.0, false)),
            (ost, gen(rng, F32, olen, -1.0, 1.0, false)),
        ];
        let ops = vec![
            op(F32, Inner::Broadcast),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Broadcast),
        ];
        let mut k = kernel("softmax.sum", 2, ops, b.clone_builder(), n);
        k.reduce = Some(Reduction {
            kind: ReduceKind::Sum,
            value: e,
            dtype: F32,
        });
        k.epilogue = vec![(Instr::Acc, F32)];
        cases.push(Case {
            label: format!("snapshot softmax.sum {sizes:?}"),
            k,
            tol: Tol {
                rtol: 1e-4,
                atol: 1e-6 * sizes[1] as f64 * 150.0,
            },
            sizes,
            views,
            scalars: vec![],
            grid: 2,
            block: 256,
            shift: vec![],
        });
    }
}

pub fn all_cases() -> Vec<Case> {
    let mut rng = Rng(0x5eed_c0da);
    let mut cases = vec![];
    snapshot_cases(&mut cases, &mut rng);
    for (i, u) in unary_ops().into_iter().enumerate() {
        let (rank, l) = (1 + i % 3, LAYOUTS[i % 4]);
        let dts: &[DType] = match u {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Square | UnaryOp::Relu => &[F32, I32, I64],
            UnaryOp::Not => &[Bool],
            _ => &[F32],
        };
        for &dt in dts {
            pointwise_cases(
                &mut cases,
                &format!("{u}.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    b.unary(u, x, dt)
                },
                &[dt],
                dt,
                &[l],
                rank,
                (-3.0, 3.0),
                (&[], &[]),
                &mut rng,
            );
        }
    }
    for (i, o) in binary_ops().into_iter().enumerate() {
        let rank = 1 + i % 3;
        let ls = [LAYOUTS[i % 4], LAYOUTS[(i + 1) % 4]];
        let dts: &[DType] = match o {
            BinaryOp::And | BinaryOp::Or => &[Bool, I32],
            _ => &[F32, I32, I64],
        };
        for &dt in dts {
            let rd = if o.is_comparison() { Bool } else { dt };
            pointwise_cases(
                &mut cases,
                &format!("{o}.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    let y = b.load(2, dt);
                    b.binary(o, x, y, rd)
                },
                &[dt, dt],
                rd,
                &ls,
                rank,
                (-3.0, 3.0),
                (&[], &[]),
                &mut rng,
            );
        }
    }
    let casts = [
        (F32, I32),
        (F32, I64),
        (F32, U8),
        (F32, I8),
        (F32, Bool),
        (F32, F64),
        (F64, F32),
        (I64, F32),
        (I32, F64),
        (U8, I8),
        (I64, I16),
        (Bool, F32),
        (I8, U8),
    ];
    for (i, (from, to)) in casts.into_iter().enumerate() {
        pointwise_cases(
            &mut cases,
            &format!("cast.{from}.{to}"),
            &|b| {
                let x = b.load(1, from);
                b.cast(x, to)
            },
            &[from],
            to,
            &[LAYOUTS[i % 4]],
            1 + i % 3,
            (-300.0, 300.0),
            (&[], &[]),
            &mut rng,
        );
    }
    // where(x > s0, x * s1, 2.5) with runtime scalars, rank 0 and 2.
    for dt in [F32, I64] {
        let s0 = if dt.is_float() {
            0.25f64.to_bits()
        } else {
            (-7i64) as u64
        };
        let s1 = 1.5f64.to_bits();
        for rank in [0, 2] {
            pointwise_cases(
                &mut cases,
                &format!("scalars.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    let s0 = b.scalar(0, dt);
                    let s1 = b.scalar(1, F64);
                    let c = b.constant(2.5, dt);
                    let gt = b.binary(BinaryOp::Gt, x, s0, Bool);
                    let s1 = b.cast(s1, dt);
                    let m = b.binary(BinaryOp::Mul, x, s1, dt);
                    b.select(gt, m, c, dt)
                },
                &[dt],
                dt,
                &[Layout::Contiguous],
                rank,
                (-3.0, 3.0),
                (&[dt, F64], &[s0, s1]),
                &mut rng,
            );
        }
    }
    use ReduceKind::*;
    let mut i = 0;
    for kind in ReduceKind::ALL {
        let dts = if kind.float_only() {
            [F32, F64]
        } else {
            [F32, I64]
        };
        for dt in dts {
            for (rank, l) in [
                (1, Layout::Contiguous),
                (2, Layout::Permuted),
                (3, Layout::OuterBroadcast),
            ] {
                i += 1;
                let block = if i % 3 == 0 { 96 } else { 64 };
                reduction_cases(&mut cases, kind, dt, l, rank, rank == 3, block, &mut rng);
            }
        }
    }
    reduction_cases(
        &mut cases,
        Max,
        U8,
        Layout::Broadcast,
        2,
        false,
        32,
        &mut rng,
    );
    multi_output_cases(&mut cases, &mut rng);
    super::half::half_cases(&mut cases, &mut rng);
    super::vector::vector_cases(&mut cases, &mut rng);
    super::rows::row_pass_cases(&mut cases, &mut rng);
    cases
}

/// Several outputs in one loop, updated in place (an Adam step; a swap),
/// or from one shared body (an LSTM step's c and h).
fn multi_output_cases(cases: &mut Vec<Case>, rng: &mut Rng) {
    use super::common::multi_out::{adam_step, lstm_cell, swap, ADAM_SCALARS};
    let f = |dt: DType| (if dt == F32 { F32TOL } else { F64TOL }, dt);
    for (rank, inner, l) in [
        (1, Inner::Contiguous, Layout::Contiguous),
        (2, Inner::Strided, Layout::Permuted),
        (0, Inner::Contiguous, Layout::Contiguous),
    ] {
        for (tol, dt) in [f(F32), f(F64)] {
            for (k, scalars) in [
                (
                    adam_step(dt, rank, inner, inner),
                    ADAM_SCALARS.iter().map(|v| v.to_bits()).collect(),
                ),
                (swap(dt, F64, rank, inner), vec![]),
                (lstm_cell(dt, rank, inner, inner), vec![]),
            ] {
                for sizes in shapes(rank) {
                    let views = k
                        .operands
                        .iter()
                        .map(|o| {
                            let (st, len) = layout(&sizes, l);
                            (st, gen(rng, o.dtype, len, 0.0, 2.0, true))
                        })
                        .collect();
                    cases.push(Case {
                        label: format!("{} {dt} {sizes:?}", k.name),
                        k: k.clone(),
                        sizes,
                        views,
                        scalars: scalars.clone(),
                        tol: Tol {
                            rtol: tol.rtol,
                            atol: tol.atol,
                        },
                        grid: 3,
                        block: 64,
                        shift: vec![],
                    });
                }
            }
        }
    }
}
