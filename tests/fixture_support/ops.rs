//! Maps a manifest case (`op`, `roles`, `attrs`) onto kiln's API.

use super::Case;
use kiln::functional as F;
use kiln::ir::op::conv::{ConvParams, ConvTransposeParams, Padding};
use kiln::ir::op::pool::Pool2dParams;
use kiln::{ClassLossOpts, DType, Reduction, Result, Scalar, Tensor};
use serde_json::Value;

fn role<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> Option<&'a Tensor> {
    c.roles.iter().position(|x| x == r).map(|i| &inputs[i])
}

fn req<'a>(c: &Case, inputs: &'a [Tensor], r: &str) -> &'a Tensor {
    role(c, inputs, r).unwrap_or_else(|| panic!("{}: no input with role {r}", c.case))
}

fn a_i64(v: &Value) -> Option<i64> {
    v.as_i64()
}

/// One int or a list of ints.
fn ints(v: &Value) -> Option<Vec<i64>> {
    match v {
        Value::Array(a) => Some(a.iter().map(|x| x.as_i64().unwrap()).collect()),
        Value::Number(n) => Some(vec![n.as_i64().unwrap()]),
        _ => None,
    }
}

fn usizes(v: &Value) -> Option<Vec<usize>> {
    ints(v).map(|x| x.into_iter().map(|i| i as usize).collect())
}

fn pair(v: &Value, default: [usize; 2]) -> [usize; 2] {
    match usizes(v) {
        Some(x) if x.len() == 1 => [x[0], x[0]],
        Some(x) => [x[0], x[1]],
        None => default,
    }
}

fn f(v: &Value, default: f64) -> f64 {
    match v {
        Value::String(s) if s == "inf" => f64::INFINITY,
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        _ => v.as_f64().unwrap_or(default),
    }
}

fn scalar(v: &Value) -> Scalar {
    match v {
        Value::Bool(b) => Scalar::Bool(*b),
        Value::Number(n) if n.is_i64() => Scalar::Int(n.as_i64().unwrap()),
        _ => Scalar::Float(f(v, 0.0)),
    }
}

fn dims_attr(a: &Value) -> Option<Vec<i64>> {
    ints(&a["dim"])
}

fn reduction(a: &Value) -> Result<Reduction> {
    Reduction::parse(a["reduction"].as_str().unwrap_or("mean"))
}

/// An error case: `view_noncontig_error` (`x.t().view(-1)` must fail for a
/// contiguous (4,6) x, suggesting reshape), or a case with `error_inputs`
/// (zeros of those shapes and dtypes, on `device`), whose op must fail with
/// an error naming it.
pub fn expect_error(c: &Case) -> Result<(), String> {
    expect_error_on(c, kiln::Device::Cpu)
}

pub fn expect_error_on(c: &Case, device: kiln::Device) -> Result<(), String> {
    if !c.error_inputs.is_empty() {
        let inputs = c
            .error_inputs
            .iter()
            .map(|(shape, dt)| {
                let dt = DType::parse(dt).map_err(|e| e.to_string())?;
                Tensor::zeros(shape, dt)
                    .to_device(device)
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        // the error must come from the op itself (naming it), not the harness
        let op = c.op.rsplit('.').next().unwrap_or(&c.op);
        return match run(c, &inputs) {
            Err(e) if e.to_string().contains(op) && !e.to_string().contains("not mapped") => Ok(()),
            Err(e) => Err(format!("{}: error does not come from {op}: {e}", c.case)),
            Ok(_) => Err(format!("{}: expected an error, the op succeeded", c.case)),
        };
    }
    let x = Tensor::zeros(&[4, 6], DType::F32)
        .to_device(device)
        .map_err(|e| e.to_string())?;
    match x.t().and_then(|t| t.view(&[-1])) {
        Err(e) if e.to_string().contains("reshape") => Ok(()),
        Err(e) => Err(format!("{}: error does not suggest reshape: {e}", c.case)),
        Ok(_) => Err(format!("{}: view of a transpose succeeded", c.case)),
    }
}

pub fn run(c: &Case, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let a = &c.attrs;
    let op = c.op.rsplit('.').next().unwrap();
    let x = || {
        req(
            c,
            inputs,
            if c.roles.contains(&"self".to_string()) {
                "self"
            } else {
                "input"
            },
        )
    };
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    match op {
        // ---- pointwise ----
        "neg" | "abs" | "exp" | "log" | "sqrt" | "rsqrt" | "reciprocal" | "square" | "sin"
        | "cos" | "tanh" | "sigmoid" | "relu" | "silu" => {
            let t = x();
            one(match op {
                "neg" => t.neg(),
                "abs" => t.abs(),
                "exp" => t.exp(),
                "log" => t.log(),
                "sqrt" => t.sqrt(),
                "rsqrt" => t.rsqrt(),
                "reciprocal" => t.reciprocal(),
                "square" => t.square(),
                "sin" => t.sin(),
                "cos" => t.cos(),
                "tanh" => t.tanh(),
                "sigmoid" => t.sigmoid(),
                "relu" => t.relu(),
                _ => t.silu(),
            })
        }
        "gelu" => one(x().gelu(a["approximate"].as_str() == Some("tanh"))),
        "softplus" => one(x().softplus(f(&a["beta"], 1.0), f(&a["threshold"], 20.0))),
        "leaky_relu" => one(x().leaky_relu(f(&a["negative_slope"], 0.01))),
        "elu" => one(x().elu(f(&a["alpha"], 1.0))),
        "add" | "sub" | "mul" | "div" | "pow" | "maximum" | "minimum" | "eq" | "ne" | "lt"
        | "le" | "gt" | "ge" | "floor_divide" | "remainder" | "fmod" => one(binary(c, op, inputs)),
        "where" if role(c, inputs, "input").is_some() => {
            let cond = req(c, inputs, "condition");
            let t = req(c, inputs, "input");
            one(match role(c, inputs, "other") {
                Some(o) => Tensor::where_(cond, t, o),
                None => Tensor::where_scalar(cond, t, scalar(&a["other"])),
            })
        }
        "masked_fill" => one(x().masked_fill(req(c, inputs, "mask"), scalar(&a["value"]))),
        "to" => {
            let t = x().to_dtype(DType::parse(a["dtype"].as_str().unwrap())?)?;
            if c.outputs.len() == 2 {
                let back = t.to_dtype(DType::F32)?;
                Ok(vec![t, back])
            } else {
                Ok(vec![t])
            }
        }
        // ---- reductions ----
        "sum" => one(x().sum(dims_attr(a).as_deref(), a["keepdim"] == true)),
        "mean" => one(x().mean(dims_attr(a).as_deref(), a["keepdim"] == true)),
        "prod" => one(match a_i64(&a["dim"]) {
            Some(d) => x().prod(Some(&[d]), a["keepdim"] == true),
            None => x().prod(None, false),
        }),
        "amax" => one(x().amax(dims_attr(a).as_deref(), a["keepdim"] == true)),
        "amin" => one(x().amin(dims_attr(a).as_deref(), a["keepdim"] == true)),
        "max" | "min" => match a_i64(&a["dim"]) {
            Some(d) => {
                let (v, i) = if op == "max" {
                    x().max_dim(d, a["keepdim"] == true)?
                } else {
                    x().min_dim(d, a["keepdim"] == true)?
                };
                Ok(vec![v, i])
            }
            None => one(if op == "max" {
                x().amax(None, false)
            } else {
                x().amin(None, false)
            }),
        },
        "argmax" => one(x().argmax(a_i64(&a["dim"]), a["keepdim"] == true)),
        "argmin" => one(x().argmin(a_i64(&a["dim"]), a["keepdim"] == true)),
        "var" | "std" => {
            let dims = dims_attr(a).unwrap_or_default();
            let corr = f(&a["correction"], 1.0);
            one(if op == "var" {
                x().var(&dims, corr, a["keepdim"] == true)
            } else {
                x().std(&dims, corr, a["keepdim"] == true)
            })
        }
        "logsumexp" => one(x().logsumexp(&dims_attr(a).unwrap(), a["keepdim"] == true)),
        "softmax" => one(x().softmax(a["dim"].as_i64().unwrap())),
        "log_softmax" => one(x().log_softmax(a["dim"].as_i64().unwrap())),
        // ---- views ----
        "view" => one(x().view(&ints(&a["size"]).unwrap())),
        "reshape" => one(x().reshape(&ints(&a["shape"]).unwrap())),
        "permute" => one(x().permute(&ints(&a["dims"]).unwrap())),
        "transpose" => one(x().transpose(a["dim0"].as_i64().unwrap(), a["dim1"].as_i64().unwrap())),
        "t" => one(x().t()),
        "contiguous" => one(x().contiguous()),
        "expand" => one(x().expand(&ints(&a["size"]).unwrap())),
        "narrow" => one(x().narrow(
            a["dim"].as_i64().unwrap(),
            a["start"].as_i64().unwrap(),
            a["length"].as_u64().unwrap() as usize,
        )),
        "__getitem__" => {
            let mut t = x().clone();
            for (d, idx) in a["index"].as_array().unwrap().iter().enumerate() {
                let i = idx.as_array().unwrap();
                t = t.slice(
                    d as i64,
                    i[0].as_i64(),
                    i[1].as_i64(),
                    i[2].as_i64().unwrap_or(1),
                )?;
            }
            Ok(vec![t])
        }
        "select" => one(x().select(a["dim"].as_i64().unwrap(), a["index"].as_i64().unwrap())),
        "unsqueeze" => one(x().unsqueeze(a["dim"].as_i64().unwrap())),
        "squeeze" => one(x().squeeze(ints(&a["dim"]).as_deref())),
        "flatten" => one(x().flatten(
            a["start_dim"].as_i64().unwrap_or(0),
            a["end_dim"].as_i64().unwrap_or(-1),
        )),
        "cat" | "stack" => {
            let ts: Vec<&Tensor> = inputs.iter().collect();
            let d = a["dim"].as_i64().unwrap_or(0);
            one(if op == "cat" {
                Tensor::cat(&ts, d)
            } else {
                Tensor::stack(&ts, d)
            })
        }
        "chunk" => x().chunk(
            a["chunks"].as_u64().unwrap() as usize,
            a["dim"].as_i64().unwrap_or(0),
        ),
        "split" => {
            let t = req(c, inputs, "tensor");
            let d = a["dim"].as_i64().unwrap_or(0);
            match &a["split_size_or_sections"] {
                Value::Array(_) => t.split_sizes(&usizes(&a["split_size_or_sections"]).unwrap(), d),
                v => t.split(v.as_u64().unwrap() as usize, d),
            }
        }
        "index_select" => {
            one(x().index_select(a["dim"].as_i64().unwrap(), req(c, inputs, "index")))
        }
        "gather" => one(x().gather(a["dim"].as_i64().unwrap(), req(c, inputs, "index"))),
        // ---- matmul, conv, pool, embedding ----
        "matmul" => one(F::matmul(x(), req(c, inputs, "other"))),
        "bmm" => one(F::bmm(x(), req(c, inputs, "mat2"))),
        "linear" => one(F::linear(
            x(),
            req(c, inputs, "weight"),
            role(c, inputs, "bias"),
        )),
        "conv2d" | "conv1d" => {
            let padding = match &a["padding"] {
                Value::String(s) if s == "same" => Padding::Same,
                Value::String(s) if s == "valid" => Padding::Valid,
                v => Padding::Explicit(usizes(v).unwrap_or(vec![0])),
            };
            let p = ConvParams {
                stride: usizes(&a["stride"]).unwrap_or(vec![1]),
                padding,
                dilation: usizes(&a["dilation"]).unwrap_or(vec![1]),
                groups: a["groups"].as_u64().unwrap_or(1) as usize,
            };
            let (w, b) = (req(c, inputs, "weight"), role(c, inputs, "bias"));
            one(if op == "conv2d" {
                F::conv2d(x(), w, b, &p)
            } else {
                F::conv1d(x(), w, b, &p)
            })
        }
        "conv_transpose2d" => {
            let p = ConvTransposeParams {
                stride: usizes(&a["stride"]).unwrap_or(vec![1]),
                padding: usizes(&a["padding"]).unwrap_or(vec![0]),
                output_padding: usizes(&a["output_padding"]).unwrap_or(vec![0]),
                dilation: usizes(&a["dilation"]).unwrap_or(vec![1]),
                groups: a["groups"].as_u64().unwrap_or(1) as usize,
            };
            one(F::conv_transpose2d(
                x(),
                req(c, inputs, "weight"),
                role(c, inputs, "bias"),
                &p,
            ))
        }
        "max_pool2d" | "avg_pool2d" => {
            let kernel = pair(&a["kernel_size"], [1, 1]);
            let p = Pool2dParams {
                kernel,
                stride: pair(&a["stride"], kernel),
                padding: pair(&a["padding"], [0, 0]),
                dilation: pair(&a["dilation"], [1, 1]),
                ceil_mode: a["ceil_mode"] == true,
            };
            if op == "max_pool2d" {
                let (v, i) = F::max_pool2d(x(), &p)?;
                Ok(if a["return_indices"] == true {
                    vec![v, i]
                } else {
                    vec![v]
                })
            } else {
                one(F::avg_pool2d(
                    x(),
                    &p,
                    a["count_include_pad"] != false,
                    a["divisor_override"].as_i64(),
                ))
            }
        }
        "adaptive_avg_pool2d" => one(F::adaptive_avg_pool2d(x(), pair(&a["output_size"], [1, 1]))),
        "adaptive_max_pool2d" => {
            let (v, i) = F::adaptive_max_pool2d(x(), pair(&a["output_size"], [1, 1]))?;
            Ok(if a["return_indices"] == true {
                vec![v, i]
            } else {
                vec![v]
            })
        }
        "embedding" => one(F::embedding(
            x(),
            req(c, inputs, "weight"),
            a["padding_idx"].as_i64(),
        )),
        // ---- norms ----
        "batch_norm" => {
            let rm = role(c, inputs, "running_mean")
                .map(|t| t.copy())
                .transpose()?;
            let rv = role(c, inputs, "running_var")
                .map(|t| t.copy())
                .transpose()?;
            let training = a["training"] == true;
            let y = F::batch_norm(
                x(),
                rm.as_ref(),
                rv.as_ref(),
                role(c, inputs, "weight"),
                role(c, inputs, "bias"),
                training,
                f(&a["momentum"], 0.1),
                f(&a["eps"], 1e-5),
            )?;
            let mut out = vec![y];
            if training && c.outputs.len() == 3 {
                out.push(rm.unwrap());
                out.push(rv.unwrap());
            }
            Ok(out)
        }
        "layer_norm" => one(F::layer_norm(
            x(),
            &usizes(&a["normalized_shape"]).unwrap(),
            role(c, inputs, "weight"),
            role(c, inputs, "bias"),
            f(&a["eps"], 1e-5),
        )),
        "group_norm" => one(F::group_norm(
            x(),
            a["num_groups"].as_u64().unwrap() as usize,
            role(c, inputs, "weight"),
            role(c, inputs, "bias"),
            f(&a["eps"], 1e-5),
        )),
        // ---- losses ----
        "cross_entropy" | "nll_loss" => {
            let o = ClassLossOpts {
                reduction: reduction(a)?,
                ignore_index: a["ignore_index"].as_i64().unwrap_or(-100),
                label_smoothing: f(&a["label_smoothing"], 0.0),
            };
            let (t, w) = (req(c, inputs, "target"), role(c, inputs, "weight"));
            one(if op == "cross_entropy" {
                F::cross_entropy(x(), t, w, o)
            } else {
                F::nll_loss(x(), t, w, o)
            })
        }
        "mse_loss" => one(F::mse_loss(x(), req(c, inputs, "target"), reduction(a)?)),
        "l1_loss" => one(F::l1_loss(x(), req(c, inputs, "target"), reduction(a)?)),
        "smooth_l1_loss" => one(F::smooth_l1_loss(
            x(),
            req(c, inputs, "target"),
            reduction(a)?,
            f(&a["beta"], 1.0),
        )),
        "huber_loss" => one(F::huber_loss(
            x(),
            req(c, inputs, "target"),
            reduction(a)?,
            f(&a["delta"], 1.0),
        )),
        "binary_cross_entropy_with_logits" => one(F::binary_cross_entropy_with_logits(
            x(),
            req(c, inputs, "target"),
            role(c, inputs, "weight"),
            role(c, inputs, "pos_weight"),
            reduction(a)?,
        )),
        "binary_cross_entropy" => one(F::binary_cross_entropy(
            x(),
            req(c, inputs, "target"),
            role(c, inputs, "weight"),
            reduction(a)?,
        )),
        other => super::reduce_more::run(c, other, inputs)
            .or_else(|| super::views_more::run(c, other, inputs))
            .or_else(|| super::loss_more::run(c, other, inputs))
            .or_else(|| super::nn_more::run(c, other, inputs))
            .or_else(|| super::nn_more_ops::run(c, other, inputs))
            .or_else(|| super::ops_more::run(c, other, inputs))
            .unwrap_or_else(|| {
                Err(kiln::Error::op(
                    other,
                    format!("fixture op {} is not mapped", c.op),
                ))
            }),
    }
}

fn binary(c: &Case, op: &str, inputs: &[Tensor]) -> Result<Tensor> {
    use kiln::ir::BinaryOp as B;
    let bop = match op {
        "add" => B::Add,
        "sub" => B::Sub,
        "mul" => B::Mul,
        "div" => B::Div,
        "pow" => B::Pow,
        "maximum" => B::Maximum,
        "minimum" => B::Minimum,
        "eq" => B::Eq,
        "ne" => B::Ne,
        "lt" => B::Lt,
        "le" => B::Le,
        "gt" => B::Gt,
        "ge" => B::Ge,
        "floor_divide" => B::FloorDiv,
        "remainder" => B::Remainder,
        _ => B::Fmod,
    };
    let a = &c.attrs;
    let other_role = if op == "pow" { "exponent" } else { "other" };
    // torch.pow(2.0, x): the base is the Python number
    if op == "pow" && !a["self"].is_null() {
        return req(c, inputs, "exponent").binary_scalar(bop, scalar(&a["self"]), true);
    }
    let lhs = req(c, inputs, "input");
    let alpha = f(&a["alpha"], 1.0);
    match role(c, inputs, other_role) {
        Some(rhs) if alpha != 1.0 => lhs.add_scaled(rhs, alpha, op == "sub"),
        Some(rhs) => lhs.binary(bop, rhs),
        None => lhs.binary_scalar(bop, scalar(&a[other_role]), false),
    }
}
