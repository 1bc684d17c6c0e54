//! Pooling kernels against naive references.

use super::super::testutil::{assert_close, Lcg};
use super::*;
use kiln_ir::op::pool::{adaptive_pool2d_geometry, pool2d_geometry, Pool2dParams};

/// Reference: visit every window cell including padding, PyTorch's rules spelled out.
fn naive_max(g: &Pool2dGeometry, x: &[f64]) -> (Vec<f64>, Vec<i64>) {
    let ([h, w], [oh, ow], p) = (g.in_size, g.out_size, g.params);
    let (mut o, mut ix) = (vec![], vec![]);
    for pl in 0..g.planes() {
        for r in 0..oh {
            for c in 0..ow {
                let (mut best, mut at) = (f64::NEG_INFINITY, -1i64);
                for i in 0..p.kernel[0] {
                    for j in 0..p.kernel[1] {
                        let ih =
                            (r * p.stride[0] + i * p.dilation[0]) as isize - p.padding[0] as isize;
                        let iw =
                            (c * p.stride[1] + j * p.dilation[1]) as isize - p.padding[1] as isize;
                        if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                            continue;
                        }
                        let fi = ih as usize * w + iw as usize;
                        let v = x[pl * h * w + fi];
                        if at < 0 || v > best || v.is_nan() {
                            best = v;
                            at = fi as i64;
                        }
                    }
                }
                o.push(best);
                ix.push(at);
            }
        }
    }
    (o, ix)
}

fn naive_avg(g: &Pool2dGeometry, x: &[f64], include_pad: bool, div: Option<i64>) -> Vec<f64> {
    let ([h, w], [oh, ow], p) = (g.in_size, g.out_size, g.params);
    let mut o = vec![];
    for pl in 0..g.planes() {
        for r in 0..oh {
            for c in 0..ow {
                let (mut sum, mut n_in, mut n_pad) = (0.0, 0, 0);
                for i in 0..p.kernel[0] {
                    for j in 0..p.kernel[1] {
                        let ih = (r * p.stride[0] + i) as isize - p.padding[0] as isize;
                        let iw = (c * p.stride[1] + j) as isize - p.padding[1] as isize;
                        // Cells beyond the right/bottom padding do not count at all.
                        if ih >= (h + p.padding[0]) as isize || iw >= (w + p.padding[1]) as isize {
                            continue;
                        }
                        n_pad += 1;
                        if ih >= 0 && iw >= 0 && ih < h as isize && iw < w as isize {
                            sum += x[pl * h * w + ih as usize * w + iw as usize];
                            n_in += 1;
                        }
                    }
                }
                let d = div.map_or(if include_pad { n_pad } else { n_in } as f64, |d| d as f64);
                o.push(if n_in == 0 { 0.0 } else { sum / d });
            }
        }
    }
    o
}

fn pp(k: [usize; 2], s: [usize; 2], pad: [usize; 2], d: [usize; 2], ceil: bool) -> Pool2dParams {
    Pool2dParams {
        kernel: k,
        stride: s,
        padding: pad,
        dilation: d,
        ceil_mode: ceil,
    }
}

#[test]
fn max_pool_matches_reference() {
    let cases = [
        (&[2, 3, 7, 8][..], pp([2, 2], [2, 2], [0, 0], [1, 1], false)),
        (&[2, 3, 7, 8][..], pp([2, 2], [2, 2], [0, 0], [1, 1], true)),
        (&[1, 2, 9, 9][..], pp([3, 3], [2, 2], [1, 1], [1, 1], true)),
        (
            &[1, 2, 10, 11][..],
            pp([3, 2], [2, 3], [1, 1], [2, 1], true),
        ),
        (&[2, 5, 6][..], pp([3, 3], [1, 1], [1, 0], [2, 2], false)),
        (
            &[4, 16, 24, 24][..],
            pp([3, 3], [2, 2], [1, 1], [1, 1], false),
        ),
    ];
    for (i, (shape, p)) in cases.iter().enumerate() {
        let g = pool2d_geometry("max_pool2d", shape, p).unwrap();
        let mut r = Lcg(40 + i as u64);
        // Quantised values make ties common.
        let x: Vec<f64> = (0..shape.iter().product())
            .map(|_| (r.next_f64() * 4.0).round())
            .collect();
        let (want, want_ix) = naive_max(&g, &x);
        let mut got = vec![0.0; want.len()];
        let mut ix = vec![0i64; want.len()];
        max_pool2d(&g, &x, &mut got, Some(&mut ix));
        assert_close(&got, &want, 0.0, &format!("max_pool2d {shape:?} {p:?}"));
        assert_eq!(ix, want_ix, "indices {shape:?} {p:?}");
        let mut got2 = vec![0.0; want.len()];
        max_pool2d(&g, &x, &mut got2, None);
        assert_eq!(got, got2);
        let mut values = vec![0.0; want.len()];
        max_pool2d_values(&g, &x, &mut values);
        assert_eq!(values, want, "max_pool2d_values {shape:?} {p:?}");
    }
}

#[test]
fn max_pool_nan_wins() {
    let g = pool2d_geometry("max_pool2d", &[1, 1, 2, 2], &Pool2dParams::new([2, 2])).unwrap();
    let x = [1.0f32, f32::NAN, 5.0, 2.0];
    let (mut o, mut ix) = ([0f32], [0i64]);
    max_pool2d(&g, &x, &mut o, Some(&mut ix));
    assert!(o[0].is_nan());
    assert_eq!(ix[0], 1);
    let x = [3.0f32, 3.0, 1.0, 3.0];
    max_pool2d(&g, &x, &mut o, Some(&mut ix));
    assert_eq!((o[0], ix[0]), (3.0, 0));
    // the last NaN; of equal zeros the first, sign and all; all -inf: the first tap
    let x = [f32::NAN, 1.0, f32::NAN, 2.0];
    max_pool2d(&g, &x, &mut o, Some(&mut ix));
    assert!(o[0].is_nan() && ix[0] == 2);
    for (x, at) in [
        ([-1.0f32, -0.0, 0.0, -2.0], 1),
        ([-1.0, 0.0, -0.0, -2.0], 1),
    ] {
        max_pool2d(&g, &x, &mut o, Some(&mut ix));
        assert_eq!((o[0].to_bits(), ix[0]), (x[at].to_bits(), at as i64));
    }
    max_pool2d(&g, &[f32::NEG_INFINITY; 4], &mut o, Some(&mut ix));
    assert_eq!((o[0], ix[0]), (f32::NEG_INFINITY, 0));
    // the values-only kernel: a NaN anywhere in the window wins
    for at in 0..4 {
        let mut x = [1.0f32, 4.0, -2.0, 0.5];
        x[at] = f32::NAN;
        max_pool2d_values(&g, &x, &mut o);
        assert!(o[0].is_nan(), "NaN at {at}");
    }
}

#[test]
fn avg_pool_matches_reference() {
    let cases = [
        (&[2, 3, 7, 8][..], pp([2, 2], [2, 2], [0, 0], [1, 1], false)),
        (&[2, 3, 7, 8][..], pp([3, 3], [2, 2], [1, 1], [1, 1], true)),
        (&[1, 2, 5, 5][..], pp([2, 2], [2, 2], [1, 1], [1, 1], true)),
        (
            &[1, 2, 10, 11][..],
            pp([3, 2], [2, 3], [1, 1], [1, 1], true),
        ),
        (&[3, 6, 6][..], pp([3, 3], [1, 1], [1, 1], [1, 1], false)),
        (
            &[4, 16, 24, 24][..],
            pp([3, 3], [2, 2], [1, 0], [1, 1], true),
        ),
    ];
    for (i, (shape, p)) in cases.iter().enumerate() {
        let g = pool2d_geometry("avg_pool2d", shape, p).unwrap();
        let mut r = Lcg(50 + i as u64);
        let x: Vec<f64> = r.vec(shape.iter().product());
        for (inc, div) in [
            (true, None),
            (false, None),
            (true, Some(3)),
            (false, Some(7)),
        ] {
            let want = naive_avg(&g, &x, inc, div);
            let mut got = vec![0.0; want.len()];
            avg_pool2d(&g, &x, &mut got, inc, div);
            assert_close(
                &got,
                &want,
                1e-12,
                &format!("avg_pool2d {shape:?} {p:?} {inc} {div:?}"),
            );
        }
    }
}

#[test]
fn adaptive_pools_match_reference() {
    for (i, (shape, os)) in [
        (&[2, 3, 10, 9][..], [3, 4]),
        (&[1, 2, 5, 7][..], [5, 7]),
        (&[2, 3, 4][..], [6, 5]),
        (&[8, 16, 13, 13][..], [1, 1]),
    ]
    .iter()
    .enumerate()
    {
        let g = adaptive_pool2d_geometry("adaptive_avg_pool2d", shape, *os).unwrap();
        let mut r = Lcg(60 + i as u64);
        let x: Vec<f64> = (0..shape.iter().product())
            .map(|_| (r.next_f64() * 4.0).round())
            .collect();
        let [h, w] = g.in_size;
        let (mut wa, mut wm, mut wi) = (vec![], vec![], vec![]);
        for pl in 0..g.planes() {
            for a in 0..os[0] {
                for b in 0..os[1] {
                    let hs = a * h / os[0];
                    let he = ((a + 1) * h).div_ceil(os[0]);
                    let ws = b * w / os[1];
                    let we = ((b + 1) * w).div_ceil(os[1]);
                    let (mut s, mut m, mut at) = (0.0, f64::NEG_INFINITY, 0i64);
                    for ih in hs..he {
                        for iw in ws..we {
                            let v = x[pl * h * w + ih * w + iw];
                            s += v;
                            if v > m {
                                m = v;
                                at = (ih * w + iw) as i64;
                            }
                        }
                    }
                    wa.push(s / ((he - hs) * (we - ws)) as f64);
                    wm.push(m);
                    wi.push(at);
                }
            }
        }
        let mut got = vec![0.0; wa.len()];
        adaptive_avg_pool2d(&g, &x, &mut got);
        assert_close(&got, &wa, 1e-12, &format!("adaptive_avg {shape:?}"));
        let mut ix = vec![0i64; wa.len()];
        adaptive_max_pool2d(&g, &x, &mut got, Some(&mut ix));
        assert_close(&got, &wm, 0.0, &format!("adaptive_max {shape:?}"));
        assert_eq!(ix, wi);
    }
}
