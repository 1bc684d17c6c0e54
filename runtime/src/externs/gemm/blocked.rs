//! kiln's own f32 GEMM for AVX2+FMA machines: BLIS's loop nest around a 6x16
//! register tile, the panels packed into thread-local buffers.
//!
//! Why not the `gemm` crate here: on the AVX2 machines we measure, it reaches
//! about 65% of one core's FMA peak at 1024^3 and barely gains from a second
//! thread (62 GF/s on one thread, 72 on two, against a measured peak of 96 per
//! core), while this nest keeps each thread's B micro-panel in L1 and its A
//! block in L2 and splits the output between threads, so every thread runs
//! the same serial nest on its own columns (or rows) with no synchronisation.
//! On AVX-512 machines the crate's wider kernels are kept (see
//! [`applies`]).
//!
//! Every output element is summed in the same order whatever the thread
//! count: `k` in blocks of [`KC`], each block's products accumulated in
//! registers in `p` order and added to the output once. So results do not
//! depend on `RAYON_NUM_THREADS`.

use crate::externs::cpu_isa::{self, Isa};
use crate::externs::SendPtr;
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows of the register tile.
const MR: usize = 6;
/// Columns of the register tile (two 8-lane vectors).
const NR: usize = 16;
/// Depth of one packed block: a B micro-panel is `KC * NR * 4` = 16 KiB, half of L1.
const KC: usize = 256;
/// Rows of one packed A block: `MC * KC * 4` = 120 KiB, well inside L2.
const MC: usize = 120;
/// Columns of one packed B block: `KC * NC * 4` = 2 MiB, shared L3.
const NC: usize = 2048;

/// Products smaller than this (multiply-adds) stay with the `gemm` crate,
/// whose unpacked small kernels win there.
const MIN_WORK: usize = 32 * 32 * 32;

/// Whether [`sgemm`] handles an `m x k x n` f32 product on this machine.
pub(crate) fn applies(m: usize, k: usize, n: usize) -> bool {
    cpu_isa::detect() == Isa::Avx2
        && m >= MR
        && n >= 8
        && m.saturating_mul(k).saturating_mul(n) >= MIN_WORK
        && std::env::var_os("KILN_GEMM_CRATE").is_none()
}

thread_local! {
    static PACKS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// A strided matrix operand: element `(i, j)` at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
struct Mat {
    ptr: *const f32,
    rs: isize,
    cs: isize,
}

/// `c (+)= a @ b` with `a` `m x k`, `b` `k x n`, `c` `m x n`, all strided (in
/// elements), split across `threads` threads.
///
/// # Safety
/// The pointers must be valid for the strided views; `c` must not overlap `a`
/// or `b` nor map two `(i, j)` to one element. The CPU must have AVX2 and FMA
/// ([`applies`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: (*const f32, isize, isize),
    b: (*const f32, isize, isize),
    c: (*mut f32, isize, isize),
    accumulate: bool,
    threads: usize,
) {
    let (a, b) = (
        Mat {
            ptr: a.0,
            rs: a.1,
            cs: a.2,
        },
        Mat {
            ptr: b.0,
            rs: b.1,
            cs: b.2,
        },
    );
    let (cp, c_rs, c_cs) = (SendPtr(c.0), c.1, c.2);
    let (a_s, b_s) = (SendMat(a), SendMat(b));
    // split the longer output side in whole tiles, one part per thread
    let parts = threads.clamp(1, 16);
    let by_cols = n / NR >= m / MR;
    let (len, unit) = if by_cols { (n, NR) } else { (m, MR) };
    let tiles = len.div_ceil(unit);
    let parts = parts.min(tiles).max(1);
    let run = |t: usize| {
        let (a, b) = (a_s.get(), b_s.get());
        let lo = tiles * t / parts * unit;
        let hi = (tiles * (t + 1) / parts * unit).min(len);
        if lo >= hi {
            return;
        }
        let c = cp.get();
        // SAFETY: each part writes only its own rows or columns of c.
        if by_cols {
            let b = Mat {
                ptr: b.ptr.offset(lo as isize * b.cs),
                ..b
            };
            serial(
                m,
                k,
                hi - lo,
                a,
                b,
                c.offset(lo as isize * c_cs),
                c_rs,
                c_cs,
                accumulate,
            );
        } else {
            let a = Mat {
                ptr: a.ptr.offset(lo as isize * a.rs),
                ..a
            };
            serial(
                hi - lo,
                k,
                n,
                a,
                b,
                c.offset(lo as isize * c_rs),
                c_rs,
                c_cs,
                accumulate,
            );
        }
    };
    if parts == 1 {
        run(0);
    } else {
        (0..parts).into_par_iter().for_each(run);
    }
}

#[derive(Clone, Copy)]
struct SendMat(Mat);
// SAFETY: the operands are only read, by every part.
unsafe impl Send for SendMat {}
unsafe impl Sync for SendMat {}
impl SendMat {
    fn get(self) -> Mat {
        self.0
    }
}

/// One thread's loop nest over its part of the output.
#[allow(clippy::too_many_arguments)]
unsafe fn serial(
    m: usize,
    k: usize,
    n: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: isize,
    c_cs: isize,
    accumulate: bool,
) {
    PACKS.with(|packs| {
        let (apack, bpack) = &mut *packs.borrow_mut();
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                pack_b(b, pc, jc, kc, nc, bpack);
                // the first depth block overwrites unless asked to accumulate
                let add = accumulate || pc > 0;
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    pack_a(a, ic, pc, mc, kc, apack);
                    for jr in (0..nc).step_by(NR) {
                        let bp = bpack.as_ptr().add(jr * kc);
                        for ir in (0..mc).step_by(MR) {
                            let ap = apack.as_ptr().add(ir * kc);
                            let (i, j) = (ic + ir, jc + jr);
                            let dst = c.offset(i as isize * c_rs + j as isize * c_cs);
                            let (mr, nr) = (MR.min(m - i), NR.min(n - j));
                            tile(kc, ap, bp, dst, c_rs, c_cs, mr, nr, add);
                        }
                    }
                }
            }
        }
    })
}

/// Packs `a[i0..i0+mc, p0..p0+kc]` as `MR`-row micro-panels, each `kc` steps of
/// `MR` values (rows past `mc` zero).
unsafe fn pack_a(a: Mat, i0: usize, p0: usize, mc: usize, kc: usize, out: &mut Vec<f32>) {
    let panels = mc.div_ceil(MR);
    out.clear();
    out.resize(panels * MR * kc, 0.0);
    for ip in 0..panels {
        let rows = MR.min(mc - ip * MR);
        let dst = &mut out[ip * MR * kc..][..MR * kc];
        for r in 0..rows {
            let src = a
                .ptr
                .offset((i0 + ip * MR + r) as isize * a.rs + p0 as isize * a.cs);
            for p in 0..kc {
                dst[p * MR + r] = *src.offset(p as isize * a.cs);
            }
        }
    }
}

/// Packs `b[p0..p0+kc, j0..j0+nc]` as `NR`-column micro-panels, each `kc` steps
/// of `NR` values (columns past `nc` zero).
unsafe fn pack_b(b: Mat, p0: usize, j0: usize, kc: usize, nc: usize, out: &mut Vec<f32>) {
    let panels = nc.div_ceil(NR);
    out.clear();
    out.resize(panels * NR * kc, 0.0);
    for jp in 0..panels {
        let cols = NR.min(nc - jp * NR);
        let dst = &mut out[jp * NR * kc..][..NR * kc];
        let base = b
            .ptr
            .offset(p0 as isize * b.rs + (j0 + jp * NR) as isize * b.cs);
        if b.cs == 1 {
            for p in 0..kc {
                let src = std::slice::from_raw_parts(base.offset(p as isize * b.rs), cols);
                dst[p * NR..p * NR + cols].copy_from_slice(src);
            }
        } else {
            for q in 0..cols {
                let src = base.offset(q as isize * b.cs);
                for p in 0..kc {
                    dst[p * NR + q] = *src.offset(p as isize * b.rs);
                }
            }
        }
    }
}

/// One register tile: `c[..mr, ..nr] (+)= apanel @ bpanel` over `kc` steps.
/// A whole tile over unit column stride is stored from registers; an edge
/// tile or a strided output goes through a scratch tile.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    c: *mut f32,
    c_rs: isize,
    c_cs: isize,
    mr: usize,
    nr: usize,
    add: bool,
) {
    if mr == MR && nr == NR && c_cs == 1 {
        return kernel_avx2(kc, ap, bp, c, c_rs, add);
    }
    let mut acc = [0.0f32; MR * NR];
    kernel_avx2(kc, ap, bp, acc.as_mut_ptr(), NR as isize, false);
    for r in 0..mr {
        let row = c.offset(r as isize * c_rs);
        for q in 0..nr {
            let d = row.offset(q as isize * c_cs);
            *d = if add {
                *d + acc[r * NR + q]
            } else {
                acc[r * NR + q]
            };
        }
    }
}

/// `out[r * out_rs + q] (+)= (apanel @ bpanel)[r][q]`: 12 `ymm` accumulators;
/// per step 2 loads of B, 6 broadcasts of A and 12 FMAs.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    out: *mut f32,
    out_rs: isize,
    add: bool,
) {
    use std::arch::x86_64::*;
    let mut lo = [_mm256_setzero_ps(); MR];
    let mut hi = [_mm256_setzero_ps(); MR];
    for p in 0..kc {
        let b0 = _mm256_loadu_ps(bp.add(p * NR));
        let b1 = _mm256_loadu_ps(bp.add(p * NR + 8));
        let a = ap.add(p * MR);
        for r in 0..MR {
            let av = _mm256_broadcast_ss(&*a.add(r));
            lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
        }
    }
    for r in 0..MR {
        let row = out.offset(r as isize * out_rs);
        if add {
            lo[r] = _mm256_add_ps(_mm256_loadu_ps(row), lo[r]);
            hi[r] = _mm256_add_ps(_mm256_loadu_ps(row.add(8)), hi[r]);
        }
        _mm256_storeu_ps(row, lo[r]);
        _mm256_storeu_ps(row.add(8), hi[r]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::externs::testutil::Lcg;

    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// Runs [`sgemm`] on `a` (`m x k`, transposed in memory when `at`), `b`
    /// (`k x n`, transposed when `bt`) into a `c` with row stride `ldc >= n`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        (m, k, n): (usize, usize, usize),
        a: &[f32],
        at: bool,
        b: &[f32],
        bt: bool,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        threads: usize,
    ) {
        let (a_rs, a_cs) = if at { (1, m as isize) } else { (k as isize, 1) };
        let (b_rs, b_cs) = if bt { (1, k as isize) } else { (n as isize, 1) };
        // SAFETY: the views lie inside the slices; the CPU has AVX2 (checked by callers).
        unsafe {
            sgemm(
                m,
                k,
                n,
                (a.as_ptr(), a_rs, a_cs),
                (b.as_ptr(), b_rs, b_cs),
                (c.as_mut_ptr(), ldc as isize, 1),
                accumulate,
                threads,
            )
        }
    }

    #[test]
    fn blocked_gemm_matches_f64_reference_on_edges_strides_and_blocks() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2+FMA");
            return;
        }
        let mut r = Lcg(7);
        // edges of every tile size, several depth blocks, several A blocks, wide B
        for &(m, k, n) in &[
            (6, 1, 16),
            (7, 3, 9),
            (13, 257, 33),
            (125, 520, 47),
            (6, 40, 2100),
            (250, 64, 17),
        ] {
            for &(at, bt) in &[(false, false), (true, false), (false, true), (true, true)] {
                let a: Vec<f32> = (0..m * k).map(|_| r.next_f64() as f32).collect();
                let b: Vec<f32> = (0..k * n).map(|_| r.next_f64() as f32).collect();
                let el = |x: &[f32], t: bool, rows: usize, cols: usize, i: usize, j: usize| {
                    (if t { x[j * rows + i] } else { x[i * cols + j] }) as f64
                };
                let ldc = n + 3;
                let init: Vec<f32> = (0..m * ldc).map(|_| r.next_f64() as f32).collect();
                for accumulate in [false, true] {
                    let mut c = init.clone();
                    run((m, k, n), &a, at, &b, bt, &mut c, ldc, accumulate, 2);
                    for i in 0..m {
                        for j in 0..ldc {
                            let got = c[i * ldc + j] as f64;
                            if j >= n {
                                assert_eq!(
                                    got,
                                    init[i * ldc + j] as f64,
                                    "padding ({i},{j}) written"
                                );
                                continue;
                            }
                            let mut want: f64 = (0..k)
                                .map(|p| el(&a, at, m, k, i, p) * el(&b, bt, k, n, p, j))
                                .sum();
                            if accumulate {
                                want += init[i * ldc + j] as f64;
                            }
                            let tol = 1e-5 * (k as f64).sqrt() * 4.0 + 1e-6;
                            assert!(
                                (got - want).abs() <= tol,
                                "{m}x{k}x{n} at={at} bt={bt} acc={accumulate} ({i},{j}): {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn blocked_gemm_bits_do_not_depend_on_the_thread_count() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2+FMA");
            return;
        }
        let mut r = Lcg(3);
        for &(m, k, n) in &[(131, 700, 61), (20, 300, 517)] {
            let a: Vec<f32> = (0..m * k).map(|_| r.next_f64() as f32).collect();
            let b: Vec<f32> = (0..k * n).map(|_| r.next_f64() as f32).collect();
            let mut one = vec![0.0f32; m * n];
            run((m, k, n), &a, false, &b, false, &mut one, n, false, 1);
            for threads in [2, 3, 5] {
                let mut many = vec![0.0f32; m * n];
                run(
                    (m, k, n),
                    &a,
                    false,
                    &b,
                    false,
                    &mut many,
                    n,
                    false,
                    threads,
                );
                assert!(
                    one.iter()
                        .zip(&many)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{m}x{k}x{n}: {threads} threads differ from one"
                );
            }
        }
    }
}
