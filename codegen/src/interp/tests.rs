use super::*;
use crate::kernel::{Inner, KernelBuilder, Operand, Reduction};
use kiln_ir::{BinaryOp, UnaryOp};

fn op(dtype: DType, inner: Inner) -> Operand {
    Operand { dtype, inner }
}

#[test]
fn broadcast_add_rank2() {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let y = b.load(2, DType::F32);
    let z = b.binary(BinaryOp::Add, x, y, DType::F32);
    let k = Kernel {
        name: "add".into(),
        rank: 2,
        operands: vec![
            op(DType::F32, Inner::Contiguous),
            op(DType::F32, Inner::Contiguous),
            op(DType::F32, Inner::Broadcast),
        ],
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: z,
        extra_out: vec![],
        rows: None,
    };
    let a: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let c = [10.0f32, 20.0];
    let mut o = [0f32; 6];
    let ptrs = [
        o.as_mut_ptr() as *mut u8,
        a.as_ptr() as *mut u8,
        c.as_ptr() as *mut u8,
    ];
    // out[2,3], in2 is a column [2,1] broadcast along dim 1
    let strides = [3, 1, 3, 1, 1, 0];
    unsafe { run_kernel(&k, &ptrs, &strides, &[2, 3], &[], 0, 2) };
    assert_eq!(o, [10.0, 11.0, 12.0, 23.0, 24.0, 25.0]);
    // thread split: only row 1
    let mut o2 = [0f32; 6];
    let ptrs = [
        o2.as_mut_ptr() as *mut u8,
        a.as_ptr() as *mut u8,
        c.as_ptr() as *mut u8,
    ];
    unsafe { run_kernel(&k, &ptrs, &strides, &[2, 3], &[], 1, 2) };
    assert_eq!(o2, [0.0, 0.0, 0.0, 23.0, 24.0, 25.0]);
}

#[test]
fn row_sum_and_argmax() {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let e = b.unary(UnaryOp::Neg, x, DType::F32);
    for (kind, acc_dt, want) in [
        (ReduceKind::Sum, DType::F32, [-3.0f64, -12.0]),
        (ReduceKind::ArgMax, DType::I64, [0.0, 0.0]),
        (ReduceKind::ArgMin, DType::I64, [2.0, 2.0]),
        (ReduceKind::Max, DType::F32, [0.0, -3.0]),
    ] {
        let out_dt = acc_dt;
        let k = Kernel {
            name: "r".into(),
            rank: 2,
            operands: vec![
                op(out_dt, Inner::Broadcast),
                op(DType::F32, Inner::Contiguous),
            ],
            scalars: vec![],
            body: b.instrs.clone(),
            reduce: Some(Reduction {
                kind,
                value: e,
                dtype: acc_dt,
            }),
            epilogue: vec![(Instr::Acc, acc_dt)],
            out: b.instrs.len(),
            extra_out: vec![],
            rows: None,
        };
        let a: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let mut o = [0u8; 16];
        let ptrs = [o.as_mut_ptr(), a.as_ptr() as *mut u8];
        let strides = [1, 0, 3, 1];
        unsafe { run_kernel(&k, &ptrs, &strides, &[2, 3], &[], 0, 2) };
        for (i, w) in want.iter().enumerate() {
            let got = Val::from_le_bytes(&o[i * out_dt.size()..], out_dt).as_f64();
            assert_eq!(got, *w, "{kind} row {i}");
        }
    }
}

/// f16 out = f16(f32(bf16 x) * 3): half operands are read and written,
/// the arithmetic runs in f32, overflow gives inf.
#[test]
fn half_operands() {
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::BF16);
    let x = b.cast(x, DType::F32);
    let three = b.constant(3.0, DType::F32);
    let y = b.binary(BinaryOp::Mul, x, three, DType::F32);
    let h = b.cast(y, DType::F16);
    let k = Kernel {
        name: "half".into(),
        rank: 1,
        operands: vec![
            op(DType::F16, Inner::Contiguous),
            op(DType::BF16, Inner::Contiguous),
        ],
        scalars: vec![],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: h,
        extra_out: vec![],
        rows: None,
    };
    // bf16 1.0, 0.10009765625 (0.1 rounded), 29952 (30000 rounded)
    let xs: [u16; 3] = [0x3f80, 0x3dcd, 0x46ea];
    let mut o = [0u16; 3];
    let ptrs = [o.as_mut_ptr() as *mut u8, xs.as_ptr() as *mut u8];
    unsafe { run_kernel(&k, &ptrs, &[1, 1], &[3], &[], 0, 3) };
    // f16 3.0, 0.30029296875 (exact), inf
    assert_eq!(o, [0x4200, 0x34ce, 0x7c00]);
}

#[test]
fn validate_rejects() {
    let k = Kernel {
        name: "bad".into(),
        rank: 1,
        operands: vec![op(DType::F32, Inner::Contiguous)],
        scalars: vec![],
        body: vec![(Instr::Load(3), DType::F32)],
        reduce: None,
        epilogue: vec![],
        out: 0,
        extra_out: vec![],
        rows: None,
    };
    assert!(validate(&k)
        .unwrap_err()
        .to_string()
        .contains("loads operand 3"));
}
