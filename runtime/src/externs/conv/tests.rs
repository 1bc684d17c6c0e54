//! Tests of `conv` against naive reference loops.

use super::super::testutil::{assert_close, Lcg};
use super::*;
use kiln_ir::op::conv::ConvTransposeGeometry;
use kiln_ir::op::conv::{
    conv_geometry, conv_transpose_geometry, ConvParams, ConvTransposeParams, Padding,
};

fn naive_conv(g: &ConvGeometry, x: &[f64], wt: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let ([h, w], [oh, ow], [kh, kw]) = (g.in_size, g.out_size, g.kernel);
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    let mut out = vec![0.0; g.n * g.c_out * oh * ow];
    for n in 0..g.n {
        for oc in 0..g.c_out {
            let gi = oc / opg;
            for r in 0..oh {
                for c in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[oc]);
                    for ic in 0..cpg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let ih = (r * g.stride[0] + i * g.dilation[0]) as isize
                                    - g.pad_begin[0] as isize;
                                let iw = (c * g.stride[1] + j * g.dilation[1]) as isize
                                    - g.pad_begin[1] as isize;
                                if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                    continue;
                                }
                                let xi = ((n * g.c_in + gi * cpg + ic) * h + ih as usize) * w
                                    + iw as usize;
                                acc += x[xi] * wt[((oc * cpg + ic) * kh + i) * kw + j];
                            }
                        }
                    }
                    out[((n * g.c_out + oc) * oh + r) * ow + c] = acc;
                }
            }
        }
    }
    out
}

fn check_conv(op: &str, input: &[usize], weight: &[usize], bias: bool, p: ConvParams, seed: u64) {
    let c_out = weight[0];
    let bshape = [c_out];
    let g = conv_geometry(op, input, weight, bias.then_some(&bshape[..]), &p).unwrap();
    let mut r = Lcg(seed);
    let x: Vec<f64> = r.vec(input.iter().product());
    let wt: Vec<f64> = r.vec(weight.iter().product());
    let b: Vec<f64> = r.vec(c_out);
    let bias = bias.then_some(&b[..]);
    let want = naive_conv(&g, &x, &wt, bias);
    let mut got = vec![f64::NAN; want.len()];
    conv2d(&g, &x, &wt, bias, &mut got).unwrap();
    assert_close(
        &got,
        &want,
        1e-12,
        &format!("{op} {input:?} {weight:?} {p:?}"),
    );
    let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let wf: Vec<f32> = wt.iter().map(|&v| v as f32).collect();
    let bf: Vec<f32> = b.iter().map(|&v| v as f32).collect();
    let mut gotf = vec![f32::NAN; want.len()];
    conv2d(&g, &xf, &wf, bias.map(|_| &bf[..]), &mut gotf).unwrap();
    let wantf: Vec<f32> = want.iter().map(|&v| v as f32).collect();
    assert_close(
        &gotf,
        &wantf,
        1e-4,
        &format!("f32 {op} {input:?} {weight:?}"),
    );
}

fn cp(stride: &[usize], padding: Padding, dilation: &[usize], groups: usize) -> ConvParams {
    ConvParams {
        stride: stride.to_vec(),
        padding,
        dilation: dilation.to_vec(),
        groups,
    }
}

#[test]
fn conv2d_matches_direct() {
    use Padding::*;
    check_conv(
        "conv2d",
        &[2, 3, 7, 6],
        &[4, 3, 3, 3],
        true,
        cp(&[1], Explicit(vec![1]), &[1], 1),
        1,
    );
    check_conv(
        "conv2d",
        &[2, 4, 9, 10],
        &[6, 4, 3, 2],
        false,
        cp(&[2], Explicit(vec![1]), &[2], 1),
        2,
    );
    check_conv(
        "conv2d",
        &[2, 4, 8, 8],
        &[6, 2, 3, 3],
        true,
        cp(&[2, 1], Explicit(vec![1, 0]), &[1], 2),
        3,
    );
    check_conv(
        "conv2d",
        &[2, 4, 9, 9],
        &[8, 1, 3, 3],
        true,
        cp(&[2], Explicit(vec![1]), &[1], 4),
        4,
    );
    check_conv(
        "conv2d",
        &[1, 4, 9, 9],
        &[4, 1, 3, 3],
        false,
        cp(&[1], Same, &[2], 4),
        5,
    );
    check_conv(
        "conv2d",
        &[1, 3, 6, 7],
        &[2, 3, 4, 2],
        true,
        cp(&[1], Same, &[1, 2], 1),
        6,
    );
    check_conv(
        "conv2d",
        &[2, 8, 5, 5],
        &[4, 8, 1, 1],
        true,
        cp(&[1], Valid, &[1], 1),
        7,
    );
    check_conv(
        "conv2d",
        &[2, 8, 5, 5],
        &[4, 4, 1, 1],
        false,
        cp(&[2], Valid, &[1], 2),
        8,
    );
    check_conv(
        "conv2d",
        &[1, 2, 3, 3],
        &[2, 2, 3, 3],
        false,
        cp(&[3], Explicit(vec![1]), &[1], 1),
        9,
    );
    check_conv(
        "conv2d",
        &[3, 4, 9, 9],
        &[3, 4, 5, 5],
        true,
        cp(&[1], Valid, &[2], 1),
        10,
    );
    // Several tiles, parallel over items; and one big item with a threaded GEMM.
    check_conv(
        "conv2d",
        &[3, 16, 20, 20],
        &[8, 16, 3, 3],
        true,
        cp(&[1], Explicit(vec![1]), &[1], 1),
        11,
    );
    check_conv(
        "conv2d",
        &[1, 8, 12, 12],
        &[64, 8, 3, 3],
        false,
        cp(&[1], Same, &[1], 1),
        12,
    );
    check_conv(
        "conv2d",
        &[2, 6, 3, 40],
        &[6, 3, 2, 7],
        true,
        cp(&[1, 3], Explicit(vec![1, 3]), &[2, 1], 2),
        13,
    );
}

#[test]
fn conv1d_is_conv2d_with_unit_height() {
    use Padding::*;
    check_conv(
        "conv1d",
        &[2, 3, 20],
        &[5, 3, 4],
        true,
        cp(&[3], Explicit(vec![2]), &[2], 1),
        21,
    );
    check_conv(
        "conv1d",
        &[2, 4, 11],
        &[4, 2, 4],
        false,
        cp(&[1], Same, &[1], 2),
        22,
    );
    check_conv(
        "conv1d",
        &[3, 11],
        &[6, 1, 3],
        true,
        cp(&[1], Same, &[3], 3),
        23,
    );
}

fn naive_transpose(
    g: &ConvTransposeGeometry,
    x: &[f64],
    wt: &[f64],
    b: Option<&[f64]>,
) -> Vec<f64> {
    let ([h, w], [oh, ow], [kh, kw]) = (g.in_size, g.out_size, g.kernel);
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    let mut out = vec![0.0; g.n * g.c_out * oh * ow];
    for n in 0..g.n {
        for oc in 0..g.c_out {
            for v in &mut out[(n * g.c_out + oc) * oh * ow..][..oh * ow] {
                *v = b.map_or(0.0, |b| b[oc]);
            }
        }
        for ci in 0..g.c_in {
            let gi = ci / cpg;
            for ih in 0..h {
                for iw in 0..w {
                    let xv = x[((n * g.c_in + ci) * h + ih) * w + iw];
                    for oc in 0..opg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let r = (ih * g.stride[0] + i * g.dilation[0]) as isize
                                    - g.padding[0] as isize;
                                let c = (iw * g.stride[1] + j * g.dilation[1]) as isize
                                    - g.padding[1] as isize;
                                if r < 0 || c < 0 || r >= oh as isize || c >= ow as isize {
                                    continue;
                                }
                                let o = ((n * g.c_out + gi * opg + oc) * oh + r as usize) * ow
                                    + c as usize;
                                out[o] += xv * wt[((ci * opg + oc) * kh + i) * kw + j];
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn check_transpose(
    op: &str,
    input: &[usize],
    weight: &[usize],
    bias: bool,
    p: ConvTransposeParams,
    seed: u64,
) {
    let c_out = weight[1] * p.groups;
    let bshape = [c_out];
    let g = conv_transpose_geometry(op, input, weight, bias.then_some(&bshape[..]), &p).unwrap();
    let mut r = Lcg(seed);
    let x: Vec<f64> = r.vec(input.iter().product());
    let wt: Vec<f64> = r.vec(weight.iter().product());
    let b: Vec<f64> = r.vec(c_out);
    let bias = bias.then_some(&b[..]);
    let want = naive_transpose(&g, &x, &wt, bias);
    let mut got = vec![f64::NAN; want.len()];
    conv_transpose2d(&g, &x, &wt, bias, &mut got).unwrap();
    assert_close(
        &got,
        &want,
        1e-12,
        &format!("{op} {input:?} {weight:?} {p:?}"),
    );
}

fn tp(
    stride: &[usize],
    padding: &[usize],
    output_padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> ConvTransposeParams {
    ConvTransposeParams {
        stride: stride.to_vec(),
        padding: padding.to_vec(),
        output_padding: output_padding.to_vec(),
        dilation: dilation.to_vec(),
        groups,
    }
}

#[test]
fn conv_transpose_matches_direct() {
    check_transpose(
        "conv_transpose2d",
        &[2, 4, 5, 6],
        &[4, 3, 3, 3],
        true,
        tp(&[2], &[1], &[1], &[1], 2),
        31,
    );
    check_transpose(
        "conv_transpose2d",
        &[1, 3, 4, 4],
        &[3, 2, 2, 3],
        false,
        tp(&[1, 2], &[1, 0], &[0], &[2], 1),
        32,
    );
    check_transpose(
        "conv_transpose1d",
        &[2, 3, 7],
        &[3, 4, 3],
        true,
        tp(&[3], &[0], &[2], &[1], 1),
        33,
    );
    check_transpose(
        "conv_transpose2d",
        &[2, 16, 12, 12],
        &[16, 8, 3, 3],
        true,
        tp(&[2], &[1], &[0], &[1], 1),
        34,
    );
    check_transpose(
        "conv_transpose2d",
        &[1, 4, 7, 5],
        &[4, 1, 4, 4],
        false,
        tp(&[2], &[2], &[1], &[1], 4),
        35,
    );
    // many small samples: several chunks, run in parallel (conv2d's input gradient)
    check_transpose(
        "conv_transpose2d",
        &[300, 16, 4, 4],
        &[16, 8, 3, 3],
        true,
        tp(&[2], &[1], &[1], &[1], 1),
        36,
    );
}

/// W4 of the benchmarks: Conv2d(64, 64, 3, padding=1) on (8, 64, 56, 56) f32.
#[test]
#[ignore]
fn bench_conv2d_w4() {
    let p = cp(&[1], Padding::Explicit(vec![1]), &[1], 1);
    let g = conv_geometry("conv2d", &[8, 64, 56, 56], &[64, 64, 3, 3], Some(&[64]), &p).unwrap();
    let mut r = Lcg(7);
    let x: Vec<f32> = r.vec(8 * 64 * 56 * 56);
    let wt: Vec<f32> = r.vec(64 * 64 * 9);
    let b: Vec<f32> = r.vec(64);
    let mut out = vec![0f32; 8 * 64 * 56 * 56];
    let mut times = vec![];
    for it in 0..23 {
        let t = std::time::Instant::now();
        conv2d(&g, &x, &wt, Some(&b), &mut out).unwrap();
        if it >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "conv2d W4 f32 ({} threads): median {:.2} ms = {:.1} GFLOP/s, best {:.1} GFLOP/s",
        threads(),
        times[10] * 1e3,
        g.flops() / times[10] / 1e9,
        g.flops() / times[0] / 1e9
    );
}

/// `copy_strided` (its AVX-512 evens path too) against the definition, for
/// lengths around the vector width and sources cut exactly to the reach.
#[test]
fn copy_strided_picks_every_stride_th_element() {
    for stride in 1..4 {
        for n in [0, 1, 15, 16, 17, 31, 32, 33, 100] {
            let reach = if n == 0 { 0 } else { (n - 1) * stride + 1 };
            for extra in [0, 1, 40] {
                let src: Vec<f32> = (0..reach + extra).map(|i| i as f32).collect();
                let mut dst = vec![f32::NAN; n];
                super::copy_strided(&mut dst, &src, stride);
                let want: Vec<f32> = (0..n).map(|k| (k * stride) as f32).collect();
                assert_eq!(
                    dst, want,
                    "stride {stride}, {n} elements, {extra} past the reach"
                );
                let src64: Vec<f64> = src.iter().map(|&v| v as f64).collect();
                let mut dst64 = vec![f64::NAN; n];
                super::copy_strided(&mut dst64, &src64, stride);
                assert!(dst64.iter().zip(&want).all(|(a, &b)| *a == b as f64));
            }
        }
    }
}
