//! The fused CPU attention kernels (`kiln_runtime::externs::attention`)
//! against a materialised f64 reference (scores, softmax,
//! weighted sum; the backward by its textbook formulas).

use kiln_ir::op::attention::AttentionDims;
use kiln_runtime::externs::attention::{
    attention_backward, attention_forward, AttnCall, AttnElem, MaskRef, Strided,
};

/// A tiny deterministic LCG for test data in [-1, 1).
struct Lcg(u64);
impl Lcg {
    fn next_f64(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

struct Case {
    d: AttentionDims,
    causal: bool,
    /// Bool mask `[L, S]` broadcast over batch and heads.
    mask: Option<Vec<u8>>,
}

fn reference(c: &Case, q: &[f64], k: &[f64], v: &[f64], gout: &[f64]) -> [Vec<f64>; 5] {
    let d = c.d;
    let scale = 1.0 / (d.e as f64).sqrt();
    let (mut out, mut lse) = (
        vec![0.0; d.n * d.h * d.l * d.ev],
        vec![0.0; d.n * d.h * d.l],
    );
    let mut dq = vec![0.0; q.len()];
    let (mut dk, mut dv) = (vec![0.0; k.len()], vec![0.0; v.len()]);
    for n in 0..d.n {
        for h in 0..d.h {
            let kv = n * d.hk + h / (d.h / d.hk);
            for i in 0..d.l {
                let row = (n * d.h + h) * d.l + i;
                let s: Vec<f64> = (0..d.s)
                    .map(|j| {
                        let hidden = (c.causal && j > i)
                            || c.mask.as_ref().is_some_and(|m| m[i * d.s + j] == 0);
                        if hidden {
                            return f64::NEG_INFINITY;
                        }
                        (0..d.e)
                            .map(|x| q[row * d.e + x] * k[(kv * d.s + j) * d.e + x])
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    lse[row] = f64::NEG_INFINITY;
                    continue;
                }
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                lse[row] = m + z.ln();
                let p: Vec<f64> = s.iter().map(|x| (x - lse[row]).exp()).collect();
                for j in 0..d.s {
                    for y in 0..d.ev {
                        out[row * d.ev + y] += p[j] * v[(kv * d.s + j) * d.ev + y];
                    }
                }
                let g = &gout[row * d.ev..][..d.ev];
                let dp: Vec<f64> = (0..d.s)
                    .map(|j| (0..d.ev).map(|y| g[y] * v[(kv * d.s + j) * d.ev + y]).sum())
                    .collect();
                let dot_pdp: f64 = (0..d.s).map(|j| p[j] * dp[j]).sum();
                for j in 0..d.s {
                    let ds = p[j] * (dp[j] - dot_pdp) * scale;
                    for x in 0..d.e {
                        dq[row * d.e + x] += ds * k[(kv * d.s + j) * d.e + x];
                        dk[(kv * d.s + j) * d.e + x] += ds * q[row * d.e + x];
                    }
                    for y in 0..d.ev {
                        dv[(kv * d.s + j) * d.ev + y] += p[j] * g[y];
                    }
                }
            }
        }
    }
    [out, lse, dq, dk, dv]
}

fn fused<T: AttnElem>(c: &Case, q: &[T], k: &[T], v: &[T], gout: &[T]) -> [Vec<T>; 5] {
    let d = c.d;
    let call = AttnCall {
        dims: d,
        scale: 1.0 / (d.e as f64).sqrt(),
        is_causal: c.causal,
    };
    let mask = match &c.mask {
        None => MaskRef::None,
        Some(m) => MaskRef::Bool(Strided {
            data: m,
            strides: [0, 0, d.s, 1],
        }),
    };
    let mut out = vec![T::ZERO; d.n * d.h * d.l * d.ev];
    let mut lse = vec![T::ZERO; d.n * d.h * d.l];
    attention_forward(&call, q, k, v, &mask, &mut out, &mut lse);
    let (mut dq, mut dk, mut dv) = (
        vec![T::ZERO; q.len()],
        vec![T::ZERO; k.len()],
        vec![T::ZERO; v.len()],
    );
    attention_backward(
        &call,
        (q, k, v),
        &mask,
        (&out, &lse, gout),
        &mut dq,
        &mut dk,
        &mut dv,
    );
    [out, lse, dq, dk, dv]
}

fn check<T: AttnElem>(c: &Case, tol: f64, seed: u64) {
    let d = c.d;
    let mut rng = Lcg(seed);
    let q: Vec<f64> = (0..d.n * d.h * d.l * d.e)
        .map(|_| rng.next_f64() * 2.0)
        .collect();
    let k: Vec<f64> = (0..d.n * d.hk * d.s * d.e)
        .map(|_| rng.next_f64() * 2.0)
        .collect();
    let v: Vec<f64> = (0..d.n * d.hk * d.s * d.ev)
        .map(|_| rng.next_f64())
        .collect();
    let g: Vec<f64> = (0..d.n * d.h * d.l * d.ev)
        .map(|_| rng.next_f64())
        .collect();
    let want = reference(c, &q, &k, &v, &g);
    let cast = |x: &[f64]| -> Vec<T> { x.iter().map(|&y| T::from_f64(y)).collect() };
    let got = fused::<T>(c, &cast(&q), &cast(&k), &cast(&v), &cast(&g));
    for (what, (w, g)) in ["out", "lse", "dq", "dk", "dv"]
        .iter()
        .zip(want.iter().zip(&got))
    {
        assert_eq!(w.len(), g.len());
        for (i, (a, b)) in w.iter().zip(g).enumerate() {
            let b = b.to_f64();
            let ok = (a == &b) || (a - b).abs() <= tol * (1.0 + a.abs());
            assert!(
                ok,
                "{what}[{i}]: reference {a}, fused {b} ({:?}, causal {})",
                d, c.causal
            );
        }
    }
}

fn dims(n: usize, h: usize, hk: usize, l: usize, s: usize, e: usize, ev: usize) -> AttentionDims {
    AttentionDims {
        n,
        h,
        hk,
        l,
        s,
        e,
        ev,
    }
}

#[test]
fn fused_matches_the_reference() {
    let shapes = [
        dims(2, 2, 2, 5, 7, 8, 8),
        dims(1, 4, 2, 37, 130, 16, 24),
        dims(1, 2, 1, 70, 33, 33, 9),
        dims(1, 1, 1, 1, 1, 1, 1),
    ];
    for (i, d) in shapes.into_iter().enumerate() {
        for causal in [false, true] {
            let c = Case {
                d,
                causal,
                mask: None,
            };
            check::<f64>(&c, 1e-12, i as u64);
            check::<f32>(&c, 2e-5, i as u64);
        }
        // every third key hidden, and row 1 fully masked
        let mut m: Vec<u8> = (0..d.l * d.s).map(|x| (x % 3 != 0) as u8).collect();
        if d.l > 1 {
            m[d.s..2 * d.s].iter_mut().for_each(|x| *x = 0);
        }
        let c = Case {
            d,
            causal: false,
            mask: Some(m),
        };
        check::<f64>(&c, 1e-12, 7 + i as u64);
        check::<f32>(&c, 2e-5, 7 + i as u64);
    }
}

#[test]
fn fully_masked_rows_give_zeros_and_no_gradient() {
    let d = dims(1, 1, 1, 2, 3, 4, 2);
    let c = Case {
        d,
        causal: false,
        mask: Some(vec![0; 6]),
    };
    let ones = vec![1.0f32; 12];
    let [out, lse, dq, dk, dv] = fused::<f32>(&c, &ones[..8], &ones, &ones[..6], &ones[..4]);
    assert!(out
        .iter()
        .chain(&dq)
        .chain(&dk)
        .chain(&dv)
        .all(|&x| x == 0.0));
    assert!(lse.iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn nan_scores_make_their_row_nan() {
    let d = dims(1, 1, 1, 2, 2, 1, 1);
    let c = Case {
        d,
        causal: false,
        mask: None,
    };
    let q = [f32::NAN, 1.0];
    let [out, ..] = fused::<f32>(&c, &q, &[1.0, 2.0], &[1.0, 2.0], &[1.0, 1.0]);
    assert!(out[0].is_nan() && !out[1].is_nan());
}
