//! Chain rows whose output streams past the caches (`vmovntps`) give the
//! f32x4 code's bits. Only launches moving more than the last-level cache
//! stream, so this process sets `KILN_STREAM=1` (every launch streams)
//! before any kernel runs; it is its own test binary for that reason. The
//! affine row pass (layer_norm's second pass) streams the same way.

mod common;

use common::{op, pointwise_kernel, BinaryOp, CpuJit, DType, Inner, KernelBuilder, UnaryOp};
use kiln_codegen::cpu::{wide, wide::Uses};

/// `n` f32 starting on a 64-byte line (streaming stores need it), with
/// its backing buffer.
fn aligned(n: usize, fill: impl Fn(usize) -> f32) -> (Vec<f32>, usize) {
    let mut v = vec![0f32; n + 16];
    let off = v.as_ptr().align_offset(64);
    for (i, x) in v[off..off + n].iter_mut().enumerate() {
        *x = fill(i);
    }
    (v, off)
}

/// Sets `KILN_STREAM=1` once, before either test runs a kernel.
fn stream_always() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: every test calls this first, and `call_once` makes the others
    // wait, so nothing reads the environment while it is written.
    ONCE.call_once(|| unsafe { std::env::set_var("KILN_STREAM", "1") });
}

#[test]
fn streamed_chain_rows_match_f32x4() {
    stream_always();
    // sigmoid(x * a) - x over [rows, cols]: rows start on lines (cols % 16 == 0)
    let mut b = KernelBuilder::default();
    let x = b.load(1, DType::F32);
    let a = b.load(2, DType::F32);
    let m = b.binary(BinaryOp::Mul, x, a, DType::F32);
    let g = b.unary(UnaryOp::Sigmoid, m, DType::F32);
    let out = b.binary(BinaryOp::Sub, g, x, DType::F32);
    let f32c = op(DType::F32, Inner::Contiguous);
    let k = pointwise_kernel("stream", 2, vec![f32c; 3], vec![], b.instrs, out);
    let compile = |uses: Uses| {
        let mut j = CpuJit::new().unwrap();
        j.set_wide_uses(uses);
        (j.wide_isa(), j.compile(&k).unwrap())
    };
    let (isa, chains) = compile(Uses::all(true));
    let (_, plain) = compile(Uses::all(false));
    eprintln!("wide ISA here: {isa:?}");
    let (rows, cols) = (5, 1024 + 256);
    let n = rows * cols;
    let (mut xs, xo) = aligned(n, |i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0);
    let (mut as_, ao) = aligned(n, |i| ((i * 104729 % 997) as f32 - 498.0) / 211.0);
    let mut run = |ck: &kiln_codegen::cpu::CompiledKernel| {
        let (mut ys, yo) = aligned(n, |_| 0.0);
        let ptrs = [
            ys[yo..].as_mut_ptr() as *mut u8,
            xs[xo..].as_mut_ptr() as *mut u8,
            as_[ao..].as_mut_ptr() as *mut u8,
        ];
        let strides = [cols as isize, 1].repeat(3);
        // SAFETY: every buffer holds rows * cols f32 from its pointer.
        unsafe {
            ck.call(&ptrs, &strides, &[rows, cols], &[], 0, 2);
            ck.call(&ptrs, &strides, &[rows, cols], &[], 2, rows);
        }
        ys[yo..yo + n].to_vec()
    };
    let (got, want) = (run(&chains), run(&plain));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "at {i}: streamed {g:e} vs f32x4 {w:e}"
        );
    }
}

#[test]
fn streamed_affine_rows_match_the_portable_row() {
    stream_always();
    let n = 1000;
    let (xs, xo) = aligned(n, |i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0);
    let (ws, wo) = aligned(n, |i| 1.0 + (i % 13) as f32 / 8.0);
    let (bs, bo) = aligned(n, |i| (i % 7) as f32 - 3.0);
    let (x, w, b) = (&xs[xo..xo + n], &ws[wo..wo + n], &bs[bo..bo + n]);
    let row = |isa| {
        let (mut out, oo) = aligned(n, |_| 0.0);
        wide::affine_row(isa, x, Some(w), Some(b), &mut out[oo..oo + n], 0.25, 1.5).unwrap();
        out[oo..oo + n].to_vec()
    };
    let (got, want) = (row(wide::detect()), row(None));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "at {i}: streamed {g:e} vs portable {w:e}"
        );
    }
}
