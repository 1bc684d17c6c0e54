//! The `layers` fixtures (one `torch.nn` layer per case, tests/fixtures/README.md
//! "Layer cases"): each layer is built from the manifest's constructor
//! arguments, loads the stored `state_dict` under PyTorch's key names, runs
//! the case's call, and its outputs, buffers and the gradient of every
//! parameter and floating input are compared with PyTorch's.

// Only tests/layers_fixtures.rs calls these; the other binaries that include
// fixture_support would warn about every item.
#![allow(dead_code)]

use super::{compare, Case, Fixtures};
use kiln::nn::{
    AttentionArgs, BagMode, Conv, ConvOptions, DecoderMasks, EmbeddingBag, Entry, EntryMut,
    InstanceNorm2d, InstanceNormOptions, Module, ModuleExt, MultiheadAttention,
    MultiheadAttentionOptions, PReLU, Padding, PaddingMode, PixelShuffle, TransformerDecoderLayer,
    TransformerEncoderLayer, TransformerLayerOptions, Upsample, UpsampleMode,
};
use kiln::Tensor;
use serde_json::Value;

/// The recurrent classes, run by tests/layers_recurrent.rs.
pub const RECURRENT: [&str; 6] = [
    "torch.nn.LSTM",
    "torch.nn.GRU",
    "torch.nn.RNN",
    "torch.nn.LSTMCell",
    "torch.nn.GRUCell",
    "torch.nn.RNNCell",
];

pub fn is_recurrent(c: &Case) -> bool {
    RECURRENT.contains(&c.op.as_str())
}

/// The manifest entry itself (for the fields `Case` does not keep).
pub fn raw<'a>(fx: &'a Fixtures, c: &Case) -> &'a Value {
    fx.cases
        .iter()
        .find(|x| x["suite"] == "layers" && x["case"] == c.case.as_str())
        .expect("the case is in the manifest")
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

enum Layer {
    Mha(Box<MultiheadAttention>),
    Encoder(Box<TransformerEncoderLayer>),
    Decoder(Box<TransformerDecoderLayer>),
    Bag(EmbeddingBag),
    /// One tensor in, one out.
    Plain(Box<dyn Module>),
}

/// A layer together with the call a case makes: which forward parameter each
/// stored input is (`roles`) and the non-tensor forward arguments. As a
/// module it takes exactly the case's inputs, so `compile` can run it.
pub struct LayerCall {
    layer: Layer,
    roles: Vec<String>,
    forward_attrs: Value,
}

fn flag(v: &Value, k: &str, default: bool) -> bool {
    v[k].as_bool().unwrap_or(default)
}

fn uint(v: &Value, k: &str) -> Result<usize, String> {
    v[k].as_u64()
        .map(|x| x as usize)
        .ok_or(format!("attr {k} is not an unsigned int: {}", v[k]))
}

fn float(v: &Value, k: &str) -> Result<f64, String> {
    v[k].as_f64()
        .ok_or(format!("attr {k} is not a number: {}", v[k]))
}

fn transformer_options(a: &Value) -> Result<TransformerLayerOptions, String> {
    Ok(TransformerLayerOptions {
        dim_feedforward: uint(a, "dim_feedforward")?,
        dropout: float(a, "dropout")?,
        activation: a["activation"].as_str().unwrap_or("relu").to_string(),
        layer_norm_eps: float(a, "layer_norm_eps")?,
        batch_first: flag(a, "batch_first", false),
        norm_first: flag(a, "norm_first", false),
        bias: flag(a, "bias", true),
    })
}

fn conv(a: &Value, rank: usize) -> Result<Conv, String> {
    let o = ConvOptions {
        stride: uint(a, "stride")?,
        padding: Padding::Explicit(vec![uint(a, "padding")?]),
        dilation: uint(a, "dilation")?,
        groups: uint(a, "groups")?,
        bias: flag(a, "bias", true),
        padding_mode: PaddingMode::from_name(a["padding_mode"].as_str().unwrap_or("zeros"))
            .map_err(|e| e.to_string())?,
    };
    let (ci, co, k) = (
        uint(a, "in_channels")?,
        uint(a, "out_channels")?,
        uint(a, "kernel_size")?,
    );
    match rank {
        2 => Conv::conv2d(ci, co, k, o),
        _ => Conv::conv3d(ci, co, k, o),
    }
    .map_err(|e| e.to_string())
}

fn upsample(a: &Value) -> Result<Upsample, String> {
    let mode = UpsampleMode::from_name(a["mode"].as_str().unwrap_or("nearest"))
        .map_err(|e| e.to_string())?;
    let list = |v: &Value| -> Vec<f64> {
        match v {
            Value::Array(xs) => xs.iter().filter_map(Value::as_f64).collect(),
            x => x.as_f64().into_iter().collect(),
        }
    };
    let mut u = match (&a["size"], &a["scale_factor"]) {
        (s, Value::Null) => {
            let s: Vec<usize> = list(s).into_iter().map(|x| x as usize).collect();
            Upsample::size(&s, mode)
        }
        (_, f) => Upsample::scale(&list(f), mode),
    };
    u.align_corners = flag(a, "align_corners", false);
    u.recompute_scale_factor = flag(a, "recompute_scale_factor", false);
    Ok(u)
}

/// The case's layer, built from its constructor arguments (`attrs`).
fn build(c: &Case) -> Result<Layer, String> {
    let a = &c.attrs;
    let e = |r: kiln::Result<Layer>| r.map_err(|e| e.to_string());
    match c.op.as_str() {
        "torch.nn.MultiheadAttention" => {
            let o = MultiheadAttentionOptions {
                dropout: float(a, "dropout")?,
                bias: flag(a, "bias", true),
                add_bias_kv: flag(a, "add_bias_kv", false),
                add_zero_attn: flag(a, "add_zero_attn", false),
                kdim: a["kdim"].as_u64().map(|x| x as usize),
                vdim: a["vdim"].as_u64().map(|x| x as usize),
                batch_first: flag(a, "batch_first", false),
            };
            e(
                MultiheadAttention::with(uint(a, "embed_dim")?, uint(a, "num_heads")?, o)
                    .map(|m| Layer::Mha(Box::new(m))),
            )
        }
        "torch.nn.TransformerEncoderLayer" => e(TransformerEncoderLayer::new(
            uint(a, "d_model")?,
            uint(a, "nhead")?,
            transformer_options(a)?,
        )
        .map(|m| Layer::Encoder(Box::new(m)))),
        "torch.nn.TransformerDecoderLayer" => e(TransformerDecoderLayer::new(
            uint(a, "d_model")?,
            uint(a, "nhead")?,
            transformer_options(a)?,
        )
        .map(|m| Layer::Decoder(Box::new(m)))),
        "torch.nn.EmbeddingBag" => {
            if !a["max_norm"].is_null()
                || flag(a, "scale_grad_by_freq", false)
                || flag(a, "sparse", false)
            {
                return Err("max_norm, scale_grad_by_freq and sparse are not supported".into());
            }
            let mode = BagMode::from_name(a["mode"].as_str().unwrap_or("mean"))
                .map_err(|e| e.to_string())?;
            let mut bag =
                EmbeddingBag::new(uint(a, "num_embeddings")?, uint(a, "embedding_dim")?, mode)
                    .map_err(|e| e.to_string())?;
            bag.include_last_offset = flag(a, "include_last_offset", false);
            bag.padding_idx = a["padding_idx"].as_i64();
            Ok(Layer::Bag(bag))
        }
        "torch.nn.PReLU" => Ok(Layer::Plain(Box::new(
            PReLU::new(uint(a, "num_parameters")?, float(a, "init")?).map_err(|e| e.to_string())?,
        ))),
        "torch.nn.InstanceNorm2d" => {
            let o = InstanceNormOptions {
                eps: float(a, "eps")?,
                momentum: a["momentum"].as_f64(),
                affine: flag(a, "affine", false),
                track_running_stats: flag(a, "track_running_stats", false),
                bias: flag(a, "bias", true),
            };
            Ok(Layer::Plain(Box::new(InstanceNorm2d::new(
                uint(a, "num_features")?,
                o,
            ))))
        }
        "torch.nn.Upsample" => Ok(Layer::Plain(Box::new(upsample(a)?))),
        "torch.nn.PixelShuffle" => Ok(Layer::Plain(Box::new(PixelShuffle::new(uint(
            a,
            "upscale_factor",
        )?)))),
        "torch.nn.Conv2d" => Ok(Layer::Plain(Box::new(conv(a, 2)?))),
        "torch.nn.Conv3d" => Ok(Layer::Plain(Box::new(conv(a, 3)?))),
        other => Err(format!("no kiln layer for {other}")),
    }
}

impl LayerCall {
    pub fn new(fx: &Fixtures, c: &Case) -> Result<LayerCall, String> {
        Ok(LayerCall {
            layer: build(c)?,
            roles: c.roles.clone(),
            forward_attrs: raw(fx, c)["forward_attrs"].clone(),
        })
    }

    pub fn inner(&self) -> &dyn Module {
        match &self.layer {
            Layer::Mha(m) => m.as_ref(),
            Layer::Encoder(m) => m.as_ref(),
            Layer::Decoder(m) => m.as_ref(),
            Layer::Bag(m) => m,
            Layer::Plain(m) => m.as_ref(),
        }
    }

    fn inner_mut(&mut self) -> &mut dyn Module {
        match &mut self.layer {
            Layer::Mha(m) => m.as_mut(),
            Layer::Encoder(m) => m.as_mut(),
            Layer::Decoder(m) => m.as_mut(),
            Layer::Bag(m) => m,
            Layer::Plain(m) => m.as_mut(),
        }
    }

    /// The layer's forward with each input passed as its role names it.
    fn run(&self, xs: &[&Tensor]) -> kiln::Result<Vec<Tensor>> {
        let arg = |role: &str| self.roles.iter().position(|r| r == role).map(|k| xs[k]);
        let fa = &self.forward_attrs;
        let need = |r: &str| {
            arg(r).ok_or_else(|| kiln::Error::op("layers fixture", format!("missing input {r}")))
        };
        match &self.layer {
            Layer::Mha(m) => {
                let args = AttentionArgs {
                    need_weights: flag(fa, "need_weights", true),
                    average_attn_weights: flag(fa, "average_attn_weights", true),
                    is_causal: flag(fa, "is_causal", false),
                };
                let (out, w) = m.forward_attn(
                    need("query")?,
                    need("key")?,
                    need("value")?,
                    arg("key_padding_mask"),
                    arg("attn_mask"),
                    args,
                )?;
                Ok([Some(out), w].into_iter().flatten().collect())
            }
            Layer::Encoder(m) => Ok(vec![m.forward_src(
                need("src")?,
                arg("src_mask"),
                arg("src_key_padding_mask"),
                flag(fa, "is_causal", false),
            )?]),
            Layer::Decoder(m) => {
                let masks = DecoderMasks {
                    tgt_mask: arg("tgt_mask"),
                    memory_mask: arg("memory_mask"),
                    tgt_key_padding_mask: arg("tgt_key_padding_mask"),
                    memory_key_padding_mask: arg("memory_key_padding_mask"),
                    tgt_is_causal: flag(fa, "tgt_is_causal", false),
                    memory_is_causal: flag(fa, "memory_is_causal", false),
                };
                Ok(vec![m.forward_tgt(need("tgt")?, need("memory")?, masks)?])
            }
            Layer::Bag(m) => Ok(vec![m.forward_bag(
                need("input")?,
                arg("offsets"),
                arg("per_sample_weights"),
            )?]),
            Layer::Plain(m) => Ok(vec![m.forward(need("input")?)?]),
        }
    }
}

impl Module for LayerCall {
    fn forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
        Ok(self.run(&[x])?.swap_remove(0))
    }
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> kiln::Result<Vec<Tensor>> {
        let xs: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
        self.run(&xs)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("layer", self.inner()))
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Child("layer", self.inner_mut()))
    }
    fn describe(&self) -> String {
        "LayerCall".into()
    }
}

/// The whole protocol of one case, eagerly or with the layer wrapped in
/// `kiln::compile` (whose train-mode output must then carry the compiled
/// backward, with no graph break): outputs, buffers after the forward, and
/// every gradient.
pub fn run_case(fx: &Fixtures, c: &Case, compiled: bool) -> Result<(), String> {
    run_case_with(fx, c, compiled, |_| {})
}

/// [`run_case`] with `tamper` applied to the layer after its state is
/// loaded (the harness's own test: a wrong layer must fail).
pub fn run_case_with(
    fx: &Fixtures,
    c: &Case,
    compiled: bool,
    tamper: impl Fn(&dyn Module),
) -> Result<(), String> {
    let r = raw(fx, c);
    let call = loaded_call(fx, c)?;
    tamper(call.inner());
    let grads = names(&r["grads"]);
    let inputs: Vec<Tensor> = fx
        .inputs(c)?
        .into_iter()
        .enumerate()
        .map(
            |(k, t)| match grads.contains(&format!("{}/grad_in{k}", c.case)) {
                true => t.requires_grad_(true),
                false => t,
            },
        )
        .collect();
    let outs = forward(&call, &inputs, compiled)?;
    check_outputs(fx, c, &call, &outs)?;
    let gouts: Vec<Tensor> = names(&r["gouts"])
        .iter()
        .map(|n| fx.tensor(c, n))
        .collect::<Result<_, _>>()?;
    kiln::autograd::backward(
        &outs.iter().take(gouts.len()).collect::<Vec<_>>(),
        &gouts.iter().collect::<Vec<_>>(),
        false,
    )
    .map_err(|e| format!("backward: {e}"))?;
    check_grads(fx, c, &call, &inputs, &grads)
}

/// The case's layer with its stored state loaded, in the case's mode.
fn loaded_call(fx: &Fixtures, c: &Case) -> Result<LayerCall, String> {
    let r = raw(fx, c);
    let call = LayerCall::new(fx, c)?;
    let state: Vec<(String, Tensor)> = names(&r["state"])
        .into_iter()
        .map(|n| {
            let key = n.split_once("/state/").unwrap().1.to_string();
            fx.tensor(c, &n).map(|t| (key, t))
        })
        .collect::<Result<_, _>>()?;
    call.inner()
        .load_state_dict(&state, true)
        .map_err(|e| format!("load_state_dict: {e}"))?;
    if r["mode"] == "eval" {
        call.eval();
    }
    Ok(call)
}

/// The call, eager or compiled (then without a graph break, and with the
/// compiled backward on the output).
fn forward(call: &LayerCall, inputs: &[Tensor], compiled: bool) -> Result<Vec<Tensor>, String> {
    if !compiled {
        return call
            .forward_many(&inputs.iter().map(Some).collect::<Vec<_>>())
            .map_err(|e| format!("kiln error: {e}"));
    }
    let f = kiln::compile::compile(call);
    let outs = f
        .call(inputs)
        .map_err(|e| format!("kiln compile error: {e}"))?;
    if let Some(b) = f
        .explain()
        .entries
        .iter()
        .find_map(|e| e.graph_break.clone())
    {
        return Err(format!("graph break: {b}"));
    }
    // one differentiable result hangs on CompiledBackward; several (the
    // attention weights too) each on a CompiledOutputBackward of one hub
    let node = outs[0].grad_fn().map(|n| n.name().to_string());
    if !matches!(
        node.as_deref(),
        Some("CompiledBackward" | "CompiledOutputBackward")
    ) {
        return Err(format!(
            "compiled output's grad_fn is {node:?}, not the compiled backward"
        ));
    }
    Ok(outs)
}

/// The outputs and, where stored, the buffers after the forward.
fn check_outputs(fx: &Fixtures, c: &Case, call: &LayerCall, outs: &[Tensor]) -> Result<(), String> {
    let (rtol, atol) = (c.rtol, c.atol);
    if outs.len() != c.outputs.len() {
        return Err(format!(
            "{} outputs, expected {}",
            outs.len(),
            c.outputs.len()
        ));
    }
    for (k, (got, name)) in outs.iter().zip(&c.outputs).enumerate() {
        compare(got, &fx.tensor(c, name)?, rtol, atol).map_err(|e| format!("out{k}: {e}"))?;
    }
    for name in names(&raw(fx, c)["groups"]["buffers_after_forward"]) {
        let key = name.split_once("/buffers_after_forward/").unwrap().1;
        let own = call
            .inner()
            .state_dict()
            .into_iter()
            .find(|(k, _)| k == key)
            .ok_or(format!("no buffer {key}"))?;
        compare(&own.1, &fx.tensor(c, &name)?, rtol, atol)
            .map_err(|e| format!("buffer {key}: {e}"))?;
    }
    Ok(())
}

/// Every stored gradient (`grad/PARAM`, `grad_inK`), and no parameter
/// without one.
fn check_grads(
    fx: &Fixtures,
    c: &Case,
    call: &LayerCall,
    inputs: &[Tensor],
    grads: &[String],
) -> Result<(), String> {
    let r = raw(fx, c);
    let (grtol, gatol) = (
        r["grad_rtol"].as_f64().unwrap_or(c.rtol),
        r["grad_atol"].as_f64().unwrap_or(c.atol),
    );
    let params = call.inner().named_parameters();
    for name in grads {
        let rest = name.split_once('/').unwrap().1;
        let got = match rest.strip_prefix("grad/") {
            Some(p) => params
                .iter()
                .find(|(k, _)| k == p)
                .ok_or(format!("no parameter {p}"))?
                .1
                .grad(),
            None => {
                let k: usize = rest.trim_start_matches("grad_in").parse().unwrap();
                inputs[k].grad()
            }
        };
        let want = fx.tensor(c, name)?;
        // an input the output does not reach gets zeros in PyTorch, None here
        let got = got.unwrap_or_else(|| Tensor::zeros(want.dims(), want.dtype()));
        compare(&got, &want, grtol, gatol).map_err(|e| format!("{rest}: {e}"))?;
    }
    let stored = grads.iter().filter(|g| g.contains("/grad/")).count();
    if params.len() != stored {
        return Err(format!(
            "{} parameters, the fixture has gradients for {stored}",
            params.len()
        ));
    }
    Ok(())
}
