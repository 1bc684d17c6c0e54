//! The vector path of rank-1 pointwise kernels with every operand contiguous:
//! each kernel over lengths around its vector width (a partial vector only,
//! whole vectors and a tail), with every pointer aligned, an input one
//! element off, and the output one element off (the scalar loop only).
//! `run_case` also splits dim 0 in three calls, whose `start` may or may not
//! keep the pointers aligned.

use super::cases::{kernel, Case};
use super::common::*;

type Body = fn(&mut KernelBuilder) -> usize;

fn add_f32(b: &mut KernelBuilder) -> usize {
    let x = b.load(1, F32);
    let y = b.load(2, F32);
    b.binary(BinaryOp::Add, x, y, F32)
}

/// f16 out = f16 x * f32 y, computed in f32 (vectors of 4 of both dtypes).
fn mul_f16_f32(b: &mut KernelBuilder) -> usize {
    let x = b.load(1, F16);
    let x = b.cast(x, F32);
    let y = b.load(2, F32);
    let z = b.binary(BinaryOp::Mul, x, y, F32);
    b.cast(z, F16)
}

fn exp_bf16(b: &mut KernelBuilder) -> usize {
    let x = b.load(1, BF16);
    let x = b.cast(x, F32);
    let y = b.unary(UnaryOp::Exp, x, F32);
    b.cast(y, BF16)
}

fn mul_f64(b: &mut KernelBuilder) -> usize {
    let x = b.load(1, F64);
    let y = b.load(2, F64);
    b.binary(BinaryOp::Mul, x, y, F64)
}

fn gt_f32(b: &mut KernelBuilder) -> usize {
    let x = b.load(1, F32);
    let y = b.load(2, F32);
    b.binary(BinaryOp::Gt, x, y, Bool)
}

fn add_u8(b: &mut KernelBuilder) -> usize {
    let x = b.load(1, U8);
    let y = b.load(2, U8);
    b.binary(BinaryOp::Add, x, y, U8)
}

fn where_i64(b: &mut KernelBuilder) -> usize {
    let c = b.load(1, Bool);
    let x = b.load(2, I64);
    let y = b.load(3, I64);
    b.select(c, x, y, I64)
}

/// out0 = out0 * 2 + x, in place.
fn inplace_f32(b: &mut KernelBuilder) -> usize {
    let o = b.load(0, F32);
    let x = b.load(1, F32);
    let two = b.constant(2.0, F32);
    let m = b.binary(BinaryOp::Mul, o, two, F32);
    b.binary(BinaryOp::Add, m, x, F32)
}

pub fn vector_cases(cases: &mut Vec<Case>, rng: &mut Rng) {
    let kernels: [(&str, Body, &[DType], DType); 8] = [
        ("vec.add.f32", add_f32, &[F32, F32], F32),
        ("vec.mul.f16.f32", mul_f16_f32, &[F16, F32], F16),
        ("vec.exp.bf16", exp_bf16, &[BF16], BF16),
        ("vec.mul.f64", mul_f64, &[F64, F64], F64),
        ("vec.gt.f32", gt_f32, &[F32, F32], Bool),
        ("vec.add.u8", add_u8, &[U8, U8], U8),
        ("vec.where.i64", where_i64, &[Bool, I64, I64], I64),
        ("vec.inplace.f32", inplace_f32, &[F32], F32),
    ];
    for (i, (name, body, ins, out)) in kernels.into_iter().enumerate() {
        let mut b = KernelBuilder::default();
        let v = body(&mut b);
        let ops: Vec<Operand> = std::iter::once(out)
            .chain(ins.iter().copied())
            .map(|dt| op(dt, Inner::Contiguous))
            .collect();
        let k = kernel(name, 1, ops, b, v);
        let w = kiln_codegen::cuda::vector_width(&k).expect("a vector kernel");
        assert_eq!(
            w,
            16 / k.operands.iter().map(|o| o.dtype.size()).max().unwrap()
        );
        let t = if name == "vec.exp.bf16" {
            tol_for(BF16)
        } else {
            EXACT
        };
        for n in [1usize, 3, w, 17, 1027] {
            for shift in [vec![], vec![0, 1], vec![1]] {
                let in_place = name == "vec.inplace.f32";
                let out_data = if in_place {
                    gen(rng, out, n, -3.0, 3.0, true)
                } else {
                    vec![0u8; n * out.size()]
                };
                let mut views = vec![(vec![1isize], out_data)];
                for &dt in ins {
                    views.push((vec![1], gen(rng, dt, n, -3.0, 3.0, true)));
                }
                cases.push(Case {
                    label: format!("{name} [{n}] shift={shift:?}"),
                    k: k.clone(),
                    sizes: vec![n],
                    views,
                    scalars: vec![],
                    tol: Tol { ..t },
                    grid: if i % 2 == 0 { 2 } else { 1 },
                    block: if i % 2 == 0 { 64 } else { 32 },
                    shift,
                });
            }
        }
    }
}
