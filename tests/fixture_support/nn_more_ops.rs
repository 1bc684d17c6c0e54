//! Maps the rest of `nn_more` (interpolate, scaled_dot_product_attention,
//! einsum, instance/local-response norm, 1-D/3-D pools, conv_transpose1d,
//! unfold/fold, cdist, embedding_bag, affine_grid/grid_sample and the
//! torchvision box ops) onto kiln's functional API.

use super::Case;
use kiln::functional as F;
use kiln::{Result, Tensor};
use serde_json::Value;

fn role<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Option<&'a Tensor> {
    c.roles.iter().position(|x| x == r).map(|i| &inputs[i])
}

fn req<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Result<&'a Tensor> {
    role(c, inputs, r).ok_or_else(|| kiln::Error::op(&c.op, format!("no input with role {r}")))
}

fn bad(key: &str, v: &Value) -> kiln::Error {
    kiln::Error::op("nn_more fixture", format!("attr {key}: {v}"))
}

fn num(a: &Value, key: &str) -> Result<f64> {
    match &a[key] {
        Value::String(s) if s == "inf" => Ok(f64::INFINITY),
        v => v.as_f64().ok_or_else(|| bad(key, v)),
    }
}

/// An int-or-list attribute as `n` values (`None` when null).
fn ints(a: &Value, key: &str, n: usize) -> Result<Option<Vec<usize>>> {
    match &a[key] {
        Value::Null => Ok(None),
        Value::Array(v) => v
            .iter()
            .map(|x| x.as_u64().map(|u| u as usize).ok_or_else(|| bad(key, x)))
            .collect::<Result<Vec<_>>>()
            .map(Some),
        v => v
            .as_u64()
            .map(|u| Some(vec![u as usize; n]))
            .ok_or_else(|| bad(key, v)),
    }
}

fn arr<const N: usize>(a: &Value, key: &str, default: [usize; N]) -> Result<[usize; N]> {
    Ok(match ints(a, key, N)? {
        Some(v) => v.try_into().map_err(|_| bad(key, &a[key]))?,
        None => default,
    })
}

fn pool1d(a: &Value) -> Result<F::Pool1dParams> {
    let [k] = arr(a, "kernel_size", [1])?;
    Ok(F::Pool1dParams {
        kernel: k,
        stride: arr(a, "stride", [k])?[0],
        padding: arr(a, "padding", [0])?[0],
        dilation: arr(a, "dilation", [1])?[0],
        ceil_mode: a["ceil_mode"] == true,
    })
}

fn pool3d(a: &Value) -> Result<F::Pool3dParams> {
    let k = arr(a, "kernel_size", [1; 3])?;
    Ok(F::Pool3dParams {
        kernel: k,
        stride: arr(a, "stride", k)?,
        padding: arr(a, "padding", [0; 3])?,
        dilation: arr(a, "dilation", [1; 3])?,
        ceil_mode: a["ceil_mode"] == true,
    })
}

fn im2col(a: &Value) -> Result<F::Im2colParams> {
    Ok(F::Im2colParams {
        kernel: arr(a, "kernel_size", [1; 2])?,
        dilation: arr(a, "dilation", [1; 2])?,
        padding: arr(a, "padding", [0; 2])?,
        stride: arr(a, "stride", [1; 2])?,
    })
}

fn with_indices((v, i): (Tensor, Tensor), a: &Value) -> Vec<Tensor> {
    if a["return_indices"] == true {
        vec![v, i]
    } else {
        vec![v]
    }
}

fn interpolate(x: &Tensor, a: &Value) -> Result<Tensor> {
    let spatial = x.rank().saturating_sub(2);
    let resize = match ints(a, "size", spatial)? {
        Some(s) => F::Resize::Size(s),
        None => F::Resize::Scale {
            factors: match &a["scale_factor"] {
                Value::Array(v) => v.iter().filter_map(Value::as_f64).collect(),
                v => vec![v.as_f64().ok_or_else(|| bad("scale_factor", v))?],
            },
            recompute: a["recompute_scale_factor"] == true,
        },
    };
    let mode = a["mode"].as_str().unwrap_or("nearest");
    F::interpolate(
        x,
        &resize,
        mode,
        a["align_corners"].as_bool(),
        a["antialias"] == true,
    )
}

fn instance_norm(c: &Case, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let a = &c.attrs;
    // F.instance_norm updates the running stats in place: out1/out2 are
    // the inputs themselves after the call, as in PyTorch
    let rm = role(c, inputs, "running_mean").cloned();
    let rv = role(c, inputs, "running_var").cloned();
    let running = rm
        .as_ref()
        .zip(rv.as_ref())
        .map(|(mean, var)| F::RunningStats { mean, var });
    let y = F::instance_norm(
        req(c, inputs, "input")?,
        running,
        role(c, inputs, "weight"),
        role(c, inputs, "bias"),
        a["use_input_stats"] != false,
        num(a, "momentum")?,
        num(a, "eps")?,
    )?;
    let mut out = vec![y];
    if c.outputs.len() == 3 {
        out.extend(rm);
        out.extend(rv);
    }
    Ok(out)
}

fn embedding_bag(c: &Case, inputs: &[Tensor]) -> Result<Tensor> {
    let a = &c.attrs;
    let o = F::BagOpts {
        mode: F::BagMode::parse(a["mode"].as_str().unwrap_or("mean"))?,
        include_last_offset: a["include_last_offset"] == true,
        padding_idx: a["padding_idx"].as_i64(),
    };
    F::embedding_bag(
        req(c, inputs, "input")?,
        req(c, inputs, "weight")?,
        role(c, inputs, "offsets"),
        role(c, inputs, "per_sample_weights"),
        o,
    )
}

fn sdpa(c: &Case, inputs: &[Tensor]) -> Result<Tensor> {
    let a = &c.attrs;
    let o = F::SdpaOpts {
        dropout_p: num(a, "dropout_p").unwrap_or(0.0),
        is_causal: a["is_causal"] == true,
        scale: a["scale"].as_f64(),
        enable_gqa: a["enable_gqa"] == true,
    };
    F::scaled_dot_product_attention(
        req(c, inputs, "query")?,
        req(c, inputs, "key")?,
        req(c, inputs, "value")?,
        role(c, inputs, "attn_mask"),
        o,
    )
}

/// The case's results, or `None` when `op` is not one of these.
pub fn run(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let a = &c.attrs;
    let go = || -> Result<Option<Vec<Tensor>>> {
        let x = || req(c, inputs, "input");
        let one = |t: Tensor| Ok(Some(vec![t]));
        match op {
            "interpolate" => one(interpolate(x()?, a)?),
            "scaled_dot_product_attention" => one(sdpa(c, inputs)?),
            "einsum" => {
                let ops: Vec<&Tensor> = inputs.iter().collect();
                one(F::einsum(a["equation"].as_str().unwrap_or(""), &ops)?)
            }
            "instance_norm" => Ok(Some(instance_norm(c, inputs)?)),
            "local_response_norm" => one(F::local_response_norm(
                x()?,
                num(a, "size")? as usize,
                num(a, "alpha")?,
                num(a, "beta")?,
                num(a, "k")?,
            )?),
            "cdist" => one(F::cdist(
                req(c, inputs, "x1")?,
                req(c, inputs, "x2")?,
                num(a, "p")?,
                a["compute_mode"]
                    .as_str()
                    .unwrap_or("use_mm_for_euclid_dist_if_necessary"),
            )?),
            "embedding_bag" => one(embedding_bag(c, inputs)?),
            "affine_grid" => one(F::affine_grid(
                req(c, inputs, "theta")?,
                &ints(a, "size", 4)?.unwrap_or_default(),
                a["align_corners"] == true,
            )?),
            "grid_sample" => one(F::grid_sample(
                x()?,
                req(c, inputs, "grid")?,
                F::GridMode::parse(a["mode"].as_str().unwrap_or("bilinear"))?,
                F::GridPadding::parse(a["padding_mode"].as_str().unwrap_or("zeros"))?,
                a["align_corners"] == true,
            )?),
            "box_iou" => one(F::box_iou(
                req(c, inputs, "boxes1")?,
                req(c, inputs, "boxes2")?,
            )?),
            "nms" => one(F::nms(
                req(c, inputs, "boxes")?,
                req(c, inputs, "scores")?,
                num(a, "iou_threshold")?,
            )?),
            "batched_nms" => one(F::batched_nms(
                req(c, inputs, "boxes")?,
                req(c, inputs, "scores")?,
                req(c, inputs, "idxs")?,
                num(a, "iou_threshold")?,
            )?),
            "roi_align" => one(F::roi_align(
                x()?,
                req(c, inputs, "boxes")?,
                F::RoiAlignOpts {
                    output_size: arr(a, "output_size", [1; 2])?,
                    spatial_scale: num(a, "spatial_scale")?,
                    sampling_ratio: a["sampling_ratio"].as_i64().unwrap_or(-1),
                    aligned: a["aligned"] == true,
                },
            )?),
            "roi_pool" => one(F::roi_pool(
                x()?,
                req(c, inputs, "boxes")?,
                arr(a, "output_size", [1; 2])?,
                num(a, "spatial_scale")?,
            )?),
            _ => windowed(c, op, inputs).transpose(),
        }
    };
    go().transpose()
}

/// The sliding-window ops: 1-D/3-D pools, conv_transpose1d, unfold, fold.
fn windowed(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let a = &c.attrs;
    let go = || -> Result<Option<Vec<Tensor>>> {
        let x = || req(c, inputs, "input");
        let one = |t: Tensor| Ok(Some(vec![t]));
        match op {
            "max_pool1d" => Ok(Some(with_indices(F::max_pool1d(x()?, &pool1d(a)?)?, a))),
            "avg_pool1d" => one(F::avg_pool1d(
                x()?,
                &pool1d(a)?,
                a["count_include_pad"] != false,
            )?),
            "adaptive_avg_pool1d" => one(F::adaptive_avg_pool1d(
                x()?,
                arr(a, "output_size", [1])?[0],
            )?),
            "adaptive_max_pool1d" => Ok(Some(with_indices(
                F::adaptive_max_pool1d(x()?, arr(a, "output_size", [1])?[0])?,
                a,
            ))),
            "max_pool3d" => Ok(Some(with_indices(
                F::max_pool3d_with_indices(x()?, &pool3d(a)?)?,
                a,
            ))),
            "avg_pool3d" => one(F::avg_pool3d(
                x()?,
                &pool3d(a)?,
                a["count_include_pad"] != false,
                a["divisor_override"].as_i64(),
            )?),
            "conv_transpose1d" => {
                let p = kiln::ir::op::conv::ConvTransposeParams {
                    stride: ints(a, "stride", 1)?.unwrap_or(vec![1]),
                    padding: ints(a, "padding", 1)?.unwrap_or(vec![0]),
                    output_padding: ints(a, "output_padding", 1)?.unwrap_or(vec![0]),
                    dilation: ints(a, "dilation", 1)?.unwrap_or(vec![1]),
                    groups: a["groups"].as_u64().unwrap_or(1) as usize,
                };
                one(F::conv_transpose1d(
                    x()?,
                    req(c, inputs, "weight")?,
                    role(c, inputs, "bias"),
                    &p,
                )?)
            }
            "unfold" => one(F::unfold(x()?, &im2col(a)?)?),
            "fold" => one(F::fold(x()?, arr(a, "output_size", [1; 2])?, &im2col(a)?)?),
            _ => Ok(None),
        }
    };
    go().transpose()
}
