//! Backward kernels of average pooling over contiguous `[N*C, H, W]` planes
//! (f64): each output gradient is spread over its window divided by the same
//! divisor the forward used (see [`super::pool`]).

use kiln_ir::op::pool::{adaptive_range, Pool2dGeometry};

/// Gradient of `avg_pool2d` w.r.t. its input: `gx += g / divisor` over each window.
pub fn avg_pool2d_backward(
    g: &Pool2dGeometry,
    gout: &[f64],
    gin: &mut [f64],
    count_include_pad: bool,
    divisor_override: Option<i64>,
) {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let p = g.params;
    assert_eq!(
        gout.len(),
        g.planes() * oh * ow,
        "avg_pool2d_backward: gout"
    );
    assert_eq!(gin.len(), g.planes() * h * w, "avg_pool2d_backward: gin");
    for pi in 0..g.planes() {
        let go = &gout[pi * oh * ow..(pi + 1) * oh * ow];
        let gi = &mut gin[pi * h * w..(pi + 1) * h * w];
        for (k, &gv) in go.iter().enumerate() {
            let (r, c) = (k / ow, k % ow);
            let hs = (r * p.stride[0]) as isize - p.padding[0] as isize;
            let ws = (c * p.stride[1]) as isize - p.padding[1] as isize;
            let he = (hs + p.kernel[0] as isize).min((h + p.padding[0]) as isize);
            let we = (ws + p.kernel[1] as isize).min((w + p.padding[1]) as isize);
            let pool_size = (he - hs) * (we - ws);
            let (hs, ws) = (hs.max(0) as usize, ws.max(0) as usize);
            let (he, we) = ((he.max(0) as usize).min(h), (we.max(0) as usize).min(w));
            if hs >= he || ws >= we {
                continue;
            }
            let div = match divisor_override {
                Some(d) => d as f64,
                None if count_include_pad => pool_size as f64,
                None => ((he - hs) * (we - ws)) as f64,
            };
            for ih in hs..he {
                for v in &mut gi[ih * w + ws..ih * w + we] {
                    *v += gv / div;
                }
            }
        }
    }
}

/// Gradient of `adaptive_avg_pool2d` w.r.t. its input.
pub fn adaptive_avg_pool2d_backward(g: &Pool2dGeometry, gout: &[f64], gin: &mut [f64]) {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    assert_eq!(
        gout.len(),
        g.planes() * oh * ow,
        "adaptive_avg_pool2d_backward: gout"
    );
    assert_eq!(
        gin.len(),
        g.planes() * h * w,
        "adaptive_avg_pool2d_backward: gin"
    );
    for pi in 0..g.planes() {
        let go = &gout[pi * oh * ow..(pi + 1) * oh * ow];
        let gi = &mut gin[pi * h * w..(pi + 1) * h * w];
        for (k, &gv) in go.iter().enumerate() {
            let (hs, he) = adaptive_range(k / ow, h, oh);
            let (ws, we) = adaptive_range(k % ow, w, ow);
            let div = ((he - hs) * (we - ws)) as f64;
            for ih in hs..he {
                for v in &mut gi[ih * w + ws..ih * w + we] {
                    *v += gv / div;
                }
            }
        }
    }
}
