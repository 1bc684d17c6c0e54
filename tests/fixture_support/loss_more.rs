//! Maps the `loss_more` suite's cases (kl_div, poisson/gaussian NLL, the
//! margin and embedding losses, ctc_loss) onto kiln's API; its nll_loss and
//! binary_cross_entropy cases use `ops`' mapping.

use super::Case;
use kiln::functional::{self as F, CtcOpts, TripletOpts};
use kiln::{Reduction, Result, Tensor};
use serde_json::Value;

fn req<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Result<&'a Tensor> {
    c.roles
        .iter()
        .position(|x| x == r)
        .map(|i| &inputs[i])
        .ok_or_else(|| kiln::Error::op(&c.op, format!("no input with role {r}")))
}

fn opt<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Option<&'a Tensor> {
    c.roles.iter().position(|x| x == r).map(|i| &inputs[i])
}

fn num(a: &Value, key: &str) -> Result<f64> {
    a[key]
        .as_f64()
        .ok_or_else(|| kiln::Error::op("loss_more fixture", format!("attr {key}: {}", a[key])))
}

/// The case's result, or `None` when `op` is not one of this suite's ops.
pub fn run(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let a = &c.attrs;
    let go = || -> Result<Option<Tensor>> {
        let r = || Reduction::parse(a["reduction"].as_str().unwrap_or("mean"));
        let x = || req(c, inputs, "input");
        let t = || req(c, inputs, "target");
        let pair = || Ok::<_, kiln::Error>((req(c, inputs, "input1")?, req(c, inputs, "input2")?));
        Ok(Some(match op {
            "kl_div" => F::kl_div(
                x()?,
                t()?,
                a["reduction"].as_str().unwrap_or("mean"),
                a["log_target"] == true,
            )?,
            "poisson_nll_loss" => F::poisson_nll_loss(
                x()?,
                t()?,
                a["log_input"] != false,
                a["full"] == true,
                num(a, "eps")?,
                r()?,
            )?,
            "gaussian_nll_loss" => F::gaussian_nll_loss(
                x()?,
                t()?,
                req(c, inputs, "var")?,
                a["full"] == true,
                num(a, "eps")?,
                r()?,
            )?,
            "margin_ranking_loss" => {
                let (x1, x2) = pair()?;
                F::margin_ranking_loss(x1, x2, t()?, num(a, "margin")?, r()?)?
            }
            "cosine_embedding_loss" => {
                let (x1, x2) = pair()?;
                F::cosine_embedding_loss(x1, x2, t()?, num(a, "margin")?, r()?)?
            }
            "triplet_margin_loss" => F::triplet_margin_loss(
                req(c, inputs, "anchor")?,
                req(c, inputs, "positive")?,
                req(c, inputs, "negative")?,
                TripletOpts {
                    margin: num(a, "margin")?,
                    p: num(a, "p")?,
                    eps: num(a, "eps")?,
                    swap: a["swap"] == true,
                    reduction: r()?,
                },
            )?,
            "hinge_embedding_loss" => F::hinge_embedding_loss(x()?, t()?, num(a, "margin")?, r()?)?,
            "soft_margin_loss" => F::soft_margin_loss(x()?, t()?, r()?)?,
            "multilabel_soft_margin_loss" => {
                F::multilabel_soft_margin_loss(x()?, t()?, opt(c, inputs, "weight"), r()?)?
            }
            "multilabel_margin_loss" => F::multilabel_margin_loss(x()?, t()?, r()?)?,
            "multi_margin_loss" => F::multi_margin_loss(
                x()?,
                t()?,
                num(a, "p")? as i64,
                num(a, "margin")?,
                opt(c, inputs, "weight"),
                r()?,
            )?,
            "ctc_loss" => F::ctc_loss(
                req(c, inputs, "log_probs")?,
                req(c, inputs, "targets")?,
                req(c, inputs, "input_lengths")?,
                req(c, inputs, "target_lengths")?,
                CtcOpts {
                    blank: a["blank"].as_i64().unwrap_or(0),
                    reduction: r()?,
                    zero_infinity: a["zero_infinity"] == true,
                },
            )?,
            _ => return Ok(None),
        }))
    };
    go().transpose().map(|r| r.map(|t| vec![t]))
}
