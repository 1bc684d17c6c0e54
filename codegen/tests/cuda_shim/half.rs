//! f16/bf16 operands in the CUDA C shim test: pointwise ops as the frontend
//! builds them (load half, compute in f32, cast to half) and computed in the
//! half dtype itself, mixed half/f32, casts, reductions over half inputs with
//! f32 accumulators and half outputs, and every conversion's rounding checked
//! exactly on all half values and the ties between them (f64 rounds to f32
//! first, as PyTorch does, so an f64 just off a tie may round as the tie).

use super::cases::{kernel, pointwise_cases, Case, CloneBuilder, LAYOUTS};
use super::common::*;
use kiln_codegen::AccPart;

/// Exact when no transcendental runs (every primitive is correctly rounded on
/// both sides), else one half ulp.
fn tol(dt: DType, exact: bool) -> Tol {
    if exact {
        EXACT
    } else {
        tol_for(dt)
    }
}

/// Unary ops whose f32 result is correctly rounded in glibc and the interpreter alike.
fn exact_unary(u: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(
        u,
        Neg | Abs | Sqrt | Rsqrt | Reciprocal | Square | Floor | Relu
    )
}

pub fn half_cases(cases: &mut Vec<Case>, rng: &mut Rng) {
    pointwise(cases, rng);
    casts(cases, rng);
    conversions(cases);
    reductions(cases, rng);
}

fn pointwise(cases: &mut Vec<Case>, rng: &mut Rng) {
    let ops: Vec<UnaryOp> = UnaryOp::EXAMPLES
        .into_iter()
        .filter(|u| *u != UnaryOp::Not)
        .collect();
    for (i, u) in ops.into_iter().enumerate() {
        let (rank, l) = (1 + i % 3, LAYOUTS[i % 4]);
        for dt in [F16, BF16] {
            let mut t = tol(dt, exact_unary(u));
            // as the frontend builds it: widen, compute in f32, round once
            let n = cases.len();
            pointwise_cases(
                cases,
                &format!("{u}.f32.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    let x = b.cast(x, F32);
                    let y = b.unary(u, x, F32);
                    b.cast(y, dt)
                },
                &[dt],
                dt,
                &[l],
                rank,
                (-3.0, 3.0),
                (&[], &[]),
                rng,
            );
            for c in &mut cases[n..] {
                c.tol = Tol { ..t };
            }
            // computed in the half dtype: rounded after every primitive
            if i % 3 == 0 || exact_unary(u) {
                t.rtol *= 4.0;
                t.atol *= 4.0;
                let n = cases.len();
                pointwise_cases(
                    cases,
                    &format!("{u}.{dt}"),
                    &|b| {
                        let x = b.load(1, dt);
                        b.unary(u, x, dt)
                    },
                    &[dt],
                    dt,
                    &[LAYOUTS[(i + 1) % 4]],
                    rank,
                    (-3.0, 3.0),
                    (&[], &[]),
                    rng,
                );
                for c in &mut cases[n..] {
                    c.tol = Tol { ..t };
                }
            }
        }
    }
    // binary: both half, mixed with f32, and half outputs of f32 math
    let combos = [
        (F16, F16, F16),
        (BF16, BF16, BF16),
        (F16, F32, F32),
        (F32, BF16, BF16),
    ];
    for (i, o) in BinaryOp::ALL.into_iter().enumerate() {
        use kiln_ir::op::BinaryDtype;
        if matches!(o.dtype_rule(), BinaryDtype::Logical | BinaryDtype::Integer) {
            continue;
        }
        let (a, b2, out) = combos[i % combos.len()];
        let rank = 1 + i % 3;
        let ls = [LAYOUTS[i % 4], LAYOUTS[(i + 1) % 4]];
        let rd = if o.is_comparison() { Bool } else { out };
        let n = cases.len();
        pointwise_cases(
            cases,
            &format!("{o}.{a}.{b2}.{rd}"),
            &|b| {
                let x = b.load(1, a);
                let y = b.load(2, b2);
                let (x, y) = (b.cast(x, F32), b.cast(y, F32));
                let z = b.binary(o, x, y, F32);
                if o.is_comparison() {
                    z
                } else {
                    b.cast(z, out)
                }
            },
            &[a, b2],
            rd,
            &ls,
            rank,
            (-3.0, 3.0),
            (&[], &[]),
            rng,
        );
        // transcendentals round differently in glibc's f32 and the f64 interpreter
        let exact = !matches!(
            o,
            BinaryOp::Pow | BinaryOp::Atan2 | BinaryOp::Hypot | BinaryOp::Xlogy
        );
        for c in &mut cases[n..] {
            c.tol = tol(rd, exact);
        }
    }
    // runtime scalars of a half dtype, arithmetic in it: where(x > s0, x * s1, 2.5)
    for dt in [F16, BF16] {
        let s = [0.25f64.to_bits(), 1.3f64.to_bits()];
        for rank in [0, 2] {
            let n = cases.len();
            pointwise_cases(
                cases,
                &format!("scalars.{dt}"),
                &|b| {
                    let x = b.load(1, dt);
                    let s0 = b.scalar(0, dt);
                    let s1 = b.scalar(1, dt);
                    let c = b.constant(2.5, dt);
                    let gt = b.binary(BinaryOp::Gt, x, s0, Bool);
                    let m = b.binary(BinaryOp::Mul, x, s1, dt);
                    b.select(gt, m, c, dt)
                },
                &[dt],
                dt,
                &[Layout::Contiguous],
                rank,
                (-3.0, 3.0),
                (&[dt, dt], &s),
                rng,
            );
            for c in &mut cases[n..] {
                c.tol = EXACT;
            }
        }
    }
}

fn casts(cases: &mut Vec<Case>, rng: &mut Rng) {
    let casts = [
        (F32, F16),
        (F16, F32),
        (F32, BF16),
        (BF16, F32),
        (F64, F16),
        (F64, BF16),
        (F16, F64),
        (F16, BF16),
        (BF16, F16),
        (I32, F16),
        (I64, BF16),
        (U8, BF16),
        (Bool, F16),
        (F16, I32),
        (BF16, I64),
        (F16, U8),
        (BF16, Bool),
    ];
    for (i, (from, to)) in casts.into_iter().enumerate() {
        let n = cases.len();
        pointwise_cases(
            cases,
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
            rng,
        );
        for c in &mut cases[n..] {
            c.tol = EXACT;
        }
    }
}

/// A rank-1 `out = cast(in1)` case over the given input bytes, compared exactly.
fn conversion(cases: &mut Vec<Case>, from: DType, to: DType, data: Vec<u8>) {
    let n = data.len() / from.size();
    let mut b = KernelBuilder::default();
    let x = b.load(1, from);
    let y = b.cast(x, to);
    let ops = vec![op(to, Inner::Contiguous), op(from, Inner::Contiguous)];
    cases.push(Case {
        label: format!("convert.{from}.{to} [{n}]"),
        k: kernel(&format!("convert.{from}.{to}"), 1, ops, b, y),
        sizes: vec![n],
        views: vec![(vec![1], vec![0u8; n * to.size()]), (vec![1], data)],
        scalars: vec![],
        tol: EXACT,
        grid: 4,
        block: 128,
        shift: vec![],
    });
}

/// Every finite half value and its neighbours: the value, the tie half way to
/// the next one up, and the f32 (or f64) numbers just below and above the tie.
fn ties(to_f64: &dyn Fn(u16) -> f64, wide: DType) -> Vec<u8> {
    let mut out = vec![];
    let mut push = |v: f64| {
        let mut b = [0u8; 8];
        Val::F(v).write_le_bytes(wide, &mut b);
        out.extend_from_slice(&b[..wide.size()]);
    };
    for sign in [0u16, 0x8000] {
        for bits in 0..0x7fffu16 {
            let (a, b) = (to_f64(bits | sign), to_f64((bits + 1) | sign));
            if !a.is_finite() || !b.is_finite() {
                continue;
            }
            let tie = (a + b) / 2.0;
            push(a);
            push(tie);
            if wide == F32 {
                let t = tie as f32;
                push(f32::from_bits(t.to_bits() - 1) as f64);
                push(f32::from_bits(t.to_bits() + 1) as f64);
            } else {
                push(f64::from_bits(tie.to_bits() - 1));
                push(f64::from_bits(tie.to_bits() + 1));
            }
        }
    }
    // beyond the largest half, NaN with payloads, infinities, f32 subnormals
    for bits in [
        0x7f7f_ffffu32,
        0x477f_f000,
        0x477f_efff,
        0x7fc0_0000,
        0x7f80_0001,
        0xffc0_0123,
        0x7f80_0000,
        0xff80_0000,
        0x0000_0001,
        0x8040_0000,
        0x3300_0000,
        0x3300_0001,
        0x32ff_ffff,
    ] {
        push(f32::from_bits(bits) as f64);
    }
    push(1e300);
    push(-1e-300);
    out
}

fn conversions(cases: &mut Vec<Case>) {
    let f16v = |b: u16| Val::from_le_bytes(&b.to_le_bytes(), F16).as_f64();
    let bf16v = |b: u16| Val::from_le_bytes(&b.to_le_bytes(), BF16).as_f64();
    // every half bit pattern widened
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    conversion(cases, F16, F32, all.clone());
    conversion(cases, BF16, F32, all);
    conversion(cases, F32, F16, ties(&f16v, F32));
    conversion(cases, F64, F16, ties(&f16v, F64));
    conversion(cases, F32, BF16, ties(&bf16v, F32));
    conversion(cases, F64, BF16, ties(&bf16v, F64));
}

/// reduce(kind) over a half input widened to f32, f32 accumulator, epilogue
/// `acc (+ a half load)` cast to the output dtype.
fn reductions(cases: &mut Vec<Case>, rng: &mut Rng) {
    use ReduceKind::*;
    let runs = [
        (Sum, F16, F32, F16, Layout::Contiguous, 2),
        (Sum, BF16, F32, F32, Layout::Permuted, 2),
        (Max, BF16, F32, BF16, Layout::Contiguous, 1),
        (Min, F16, F16, F16, Layout::Permuted, 2),
        (ArgMax, F16, I64, I64, Layout::Contiguous, 2),
        (Prod, F16, F32, F16, Layout::Contiguous, 3),
        (LogSumExp, F16, F32, F32, Layout::Contiguous, 2),
        (Welford, BF16, F32, F32, Layout::Permuted, 2),
    ];
    for (i, (kind, in_dt, acc_dt, out_dt, l, rank)) in runs.into_iter().enumerate() {
        let arg = matches!(kind, ArgMax | ArgMin);
        let epi_load = i % 2 == 0 && !arg && kind != LogSumExp && kind != Welford;
        let mut b = KernelBuilder::default();
        let x = b.load(1, in_dt);
        let v = if arg || acc_dt == in_dt {
            x
        } else {
            b.cast(x, acc_dt)
        };
        let nb = b.instrs.len();
        let mut epilogue = vec![(Instr::Acc, acc_dt)];
        if epi_load {
            epilogue.push((Instr::Load(2), in_dt));
            epilogue.push((Instr::Binary(BinaryOp::Add, nb, nb + 1), acc_dt));
        }
        epilogue.push((Instr::Cast(nb + epilogue.len() - 1), out_dt));
        let out = nb + epilogue.len() - 1;
        let mut extra_out = vec![];
        let parts: &[AccPart] = match kind {
            LogSumExp => &[AccPart::Shift, AccPart::LogSum],
            Welford => &[AccPart::Mean],
            _ => &[],
        };
        for &p in parts {
            epilogue.push((Instr::AccPart(p), acc_dt));
            extra_out.push(nb + epilogue.len() - 1);
        }
        let tuple = 1 + extra_out.len();
        let (lo, hi) = if kind == Prod {
            (-1.5, 1.5)
        } else {
            (-3.0, 3.0)
        };
        let shapes: Vec<Vec<usize>> = match rank {
            1 => vec![vec![1], vec![37], vec![1000]],
            2 => vec![vec![3, 13], vec![2, 0], vec![2, 300]],
            _ => vec![vec![2, 3, 17]],
        };
        for sizes in shapes {
            let outer = &sizes[..rank - 1];
            let (mut ost, olen) = layout(outer, Layout::Contiguous);
            ost.push(0);
            let tuple_st = ost.iter().map(|s| s * tuple as isize).collect();
            let mut views = vec![(tuple_st, vec![0u8; olen * tuple * out_dt.size()])];
            let (st, len) = layout(&sizes, l);
            let mut operands = vec![op(out_dt, Inner::Broadcast), op(in_dt, inner_of(&st))];
            let edges = matches!(kind, Max | Min | ArgMax);
            views.push((st, gen(rng, in_dt, len, lo, hi, edges)));
            if epi_load {
                operands.push(op(in_dt, Inner::Broadcast));
                views.push((ost, gen(rng, in_dt, olen, -1.0, 1.0, false)));
            }
            let n = *sizes.last().unwrap() as f64;
            // f32 sums in tree order, then (maybe) one rounding to the half output
            let t = match kind {
                Sum | Prod => Tol {
                    rtol: tol_for(out_dt).rtol.max(1e-4),
                    atol: 1e-6 * n.max(1.0) * hi,
                },
                LogSumExp | Welford => Tol {
                    rtol: 1e-5,
                    atol: 1e-5,
                },
                _ => EXACT,
            };
            let k = Kernel {
                name: format!("{kind}.{in_dt}.{acc_dt}.{out_dt}"),
                rank,
                operands,
                scalars: vec![],
                body: b.clone_builder().instrs,
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
                label: format!("{} {sizes:?} {l:?} epi={epi_load}", k.name),
                k,
                sizes,
                views,
                scalars: vec![],
                tol: t,
                grid: 2,
                block: 64,
                shift: vec![],
            });
        }
    }
}
