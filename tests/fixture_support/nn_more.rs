//! Maps the `nn_more` cases kiln has the ops for (addmm, baddbmm, addbmm,
//! outer, normalize, cosine_similarity, pairwise_distance, glu, softmin,
//! pixel_shuffle/unshuffle, conv3d with one stride/padding/dilation)
//! onto its API; the rest of the suite is not mapped yet.

use super::Case;
use kiln::functional as F;
use kiln::{Result, Tensor};
use serde_json::Value;

fn req<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Result<&'a Tensor> {
    c.roles
        .iter()
        .position(|x| x == r)
        .map(|i| &inputs[i])
        .ok_or_else(|| kiln::Error::op(&c.op, format!("no input with role {r}")))
}

fn num(a: &Value, key: &str) -> Result<f64> {
    match &a[key] {
        Value::String(s) if s == "inf" => Ok(f64::INFINITY),
        v => v
            .as_f64()
            .ok_or_else(|| kiln::Error::op("nn_more fixture", format!("attr {key}: {v}"))),
    }
}

/// The case's result, or `None` when `op` is not mapped.
pub fn run(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let a = &c.attrs;
    let go = || -> Result<Option<Tensor>> {
        let x = || req(c, inputs, "input");
        let dim = || a["dim"].as_i64().unwrap_or(-1);
        let (beta, alpha) = (|| num(a, "beta"), || num(a, "alpha"));
        Ok(Some(match op {
            "addmm" => F::addmm(
                x()?,
                req(c, inputs, "mat1")?,
                req(c, inputs, "mat2")?,
                beta()?,
                alpha()?,
            )?,
            "baddbmm" | "addbmm" => {
                let (b1, b2) = (req(c, inputs, "batch1")?, req(c, inputs, "batch2")?);
                if op == "baddbmm" {
                    F::baddbmm(x()?, b1, b2, beta()?, alpha()?)?
                } else {
                    F::addbmm(x()?, b1, b2, beta()?, alpha()?)?
                }
            }
            "outer" => F::outer(x()?, req(c, inputs, "vec2")?)?,
            "normalize" => F::normalize(x()?, num(a, "p")?, dim(), num(a, "eps")?)?,
            "cosine_similarity" => F::cosine_similarity(
                req(c, inputs, "x1")?,
                req(c, inputs, "x2")?,
                dim(),
                num(a, "eps")?,
            )?,
            "pairwise_distance" => F::pairwise_distance(
                req(c, inputs, "x1")?,
                req(c, inputs, "x2")?,
                num(a, "p")?,
                num(a, "eps")?,
                a["keepdim"] == true,
            )?,
            "glu" => F::glu(x()?, dim())?,
            "pixel_shuffle" => F::pixel_shuffle(x()?, num(a, "upscale_factor")? as usize)?,
            "pixel_unshuffle" => F::pixel_unshuffle(x()?, num(a, "downscale_factor")? as usize)?,
            "conv3d" => {
                let k = |key| num(a, key).map(|v| v as usize);
                let w = req(c, inputs, "weight")?;
                let bias = c.roles.iter().position(|r| r == "bias").map(|i| &inputs[i]);
                F::conv3d(
                    x()?,
                    w,
                    bias,
                    k("stride")?,
                    k("padding")?,
                    k("dilation")?,
                    k("groups")?,
                )?
            }
            "softmin" => F::softmin(x()?, dim())?,
            _ => return Ok(None),
        }))
    };
    go().transpose().map(|r| r.map(|t| vec![t]))
}
