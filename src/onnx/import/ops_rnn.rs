//! Imported recurrent ops: ONNX `LSTM`, `GRU` and `RNN` (forward, reverse
//! or bidirectional; `layout` 0 or 1; optional bias and initial states;
//! GRU with either `linear_before_reset`). Each direction projects the
//! whole sequence through `W` in one GEMM, then steps through time with
//! `R`; LSTM peepholes `P` join the gates. `clip`, `input_forget`, non-default activations and
//! `sequence_lens` shorter than the sequence are refused with an error
//! naming the node.

use super::attrs::Node;
use super::host::Value;
use super::ops::input;
use crate::functional as F;
use crate::{Result, Tensor};

fn opt(ins: &[Value], i: usize) -> Result<Option<Tensor>> {
    match ins.get(i) {
        Some(v) if !v.is_none() => Ok(Some(v.tensor()?)),
        _ => Ok(None),
    }
}

/// What the three ops differ in.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Lstm,
    /// `linear_before_reset` 1 (PyTorch's GRU) or 0 (the ONNX default).
    Gru {
        linear_before_reset: bool,
    },
    Rnn,
}

impl Kind {
    fn gates(self) -> usize {
        match self {
            Kind::Lstm => 4,
            Kind::Gru { .. } => 3,
            Kind::Rnn => 1,
        }
    }
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Kind::Gru { .. } => &["Sigmoid", "Tanh"],
            Kind::Rnn => &["Tanh"],
        }
    }
}

/// One direction's weights: `W`, `R`, the two biases of `B` and an LSTM's
/// peepholes `P` (`[3H]`: i, o, f).
struct Dir {
    w: Tensor,
    r: Tensor,
    wb: Option<Tensor>,
    rb: Option<Tensor>,
    p: Option<Tensor>,
}

pub(crate) fn run(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let kind = match n.op() {
        "LSTM" => Kind::Lstm,
        "GRU" => Kind::Gru {
            linear_before_reset: n.int_or("linear_before_reset", 0)? != 0,
        },
        "RNN" => Kind::Rnn,
        op => unreachable!("{op} is not a recurrent op"),
    };
    let g = kind.gates();
    let x = input(n, ins, 0)?;
    let (w, r) = (input(n, ins, 1)?, input(n, ins, 2)?);
    let b = opt(ins, 3)?;
    let seq_lens = opt(ins, 4)?;
    let h0 = opt(ins, 5)?;
    let c0 = if kind == Kind::Lstm {
        opt(ins, 6)?
    } else {
        None
    };
    let peep = if kind == Kind::Lstm {
        opt(ins, 7)?
    } else {
        None
    };
    if x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
        return Err(n.err(format!(
            "X, W and R must be 3-D, got {:?}, {:?}, {:?}",
            x.dims(),
            w.dims(),
            r.dims()
        )));
    }
    let hidden = n.int_or("hidden_size", r.dims()[2] as i64)? as usize;
    let direction = n.string("direction")?.unwrap_or_else(|| "forward".into());
    let dirs = match direction.as_str() {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        other => return Err(n.err(format!("unknown direction `{other}`"))),
    };
    if let Some(acts) = n.string_list("activations")? {
        let want: Vec<String> = (0..dirs)
            .flat_map(|_| kind.default_activations().iter().map(|s| s.to_string()))
            .collect();
        if acts != want {
            return Err(n.unsupported(format!("activations {acts:?} (only the defaults run)")));
        }
    }
    if n.int_or("input_forget", 0)? != 0 {
        return Err(n.unsupported("input_forget=1"));
    }
    let layout = n.int_or("layout", 0)?;
    if let Some(p) = peep.as_ref().filter(|p| p.dims() != [dirs, 3 * hidden]) {
        return Err(n.err(format!(
            "P {:?} does not fit {dirs} direction(s) and hidden_size {hidden} ([D, 3*hidden])",
            p.dims()
        )));
    }
    if w.dims() != [dirs, g * hidden, x.dims()[2]] || r.dims() != [dirs, g * hidden, hidden] {
        return Err(n.err(format!(
            "W {:?} / R {:?} do not fit {dirs} direction(s), hidden_size {hidden} and input {:?}",
            w.dims(),
            r.dims(),
            x.dims()
        )));
    }
    // time-major from here on
    let x = if layout == 1 { x.transpose(0, 1)? } else { x };
    let (steps, batch) = (x.dims()[0], x.dims()[1]);
    if let Some(lens) = &seq_lens {
        if lens.to_f64_vec().iter().any(|&l| l as usize != steps) {
            return Err(n.unsupported("sequence_lens shorter than the sequence"));
        }
    }
    // initial states arrive as [D, B, H] (layout 0) or [B, D, H] (layout 1)
    let state = |t: Option<Tensor>| -> Result<Option<Tensor>> {
        t.map(|t| {
            if layout == 1 {
                t.transpose(0, 1)
            } else {
                Ok(t)
            }
        })
        .transpose()
    };
    let (h0, c0) = (state(h0)?, state(c0)?);
    let (mut ys, mut hs, mut cs) = (vec![], vec![], vec![]);
    for d in 0..dirs {
        let bias = b
            .as_ref()
            .map(|b| b.select(0, d as i64)?.chunk(2, 0))
            .transpose()?;
        let dir = Dir {
            w: w.select(0, d as i64)?,
            r: r.select(0, d as i64)?,
            wb: bias.as_ref().map(|b| b[0].clone()),
            rb: bias.as_ref().map(|b| b[1].clone()),
            p: peep.as_ref().map(|p| p.select(0, d as i64)).transpose()?,
        };
        let init = |t: &Option<Tensor>| -> Result<Tensor> {
            match t {
                Some(t) => t.select(0, d as i64),
                None => Ok(Tensor::zeros(&[batch, hidden], x.dtype())),
            }
        };
        let reverse = d == 1 || direction == "reverse";
        let (y, h, c) = run_direction(kind, &dir, hidden, &x, init(&h0)?, init(&c0)?, reverse)?;
        ys.push(y);
        hs.push(h);
        cs.push(c);
    }
    // Y: [T, D, B, H] (layout 1: [B, T, D, H]); Y_h, Y_c: [D, B, H] ([B, D, H])
    let y = Tensor::stack(&ys.iter().collect::<Vec<_>>(), 1)?;
    let y = if layout == 1 {
        y.permute(&[2, 0, 1, 3])?
    } else {
        y
    };
    let finals = |v: &[Tensor]| -> Result<Tensor> {
        let t = Tensor::stack(&v.iter().collect::<Vec<_>>(), 0)?;
        if layout == 1 {
            t.transpose(0, 1)
        } else {
            Ok(t)
        }
    };
    let mut outs = vec![Value::T(y), Value::T(finals(&hs)?)];
    if kind == Kind::Lstm {
        outs.push(Value::T(finals(&cs)?));
    }
    outs.truncate(n.proto.output.len().max(1));
    Ok(outs)
}

/// One direction over the whole time-major sequence `x` (T, B, F): the
/// outputs stacked over time (T, B, H) and the last `(h, c)`.
fn run_direction(
    kind: Kind,
    dir: &Dir,
    hidden: usize,
    x: &Tensor,
    mut h: Tensor,
    mut c: Tensor,
    reverse: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let steps = x.dims()[0];
    let proj = F::linear(x, &dir.w, dir.wb.as_ref())?;
    let mut outs: Vec<Option<Tensor>> = vec![None; steps];
    for k in 0..steps {
        let t = if reverse { steps - 1 - k } else { k };
        (h, c) = step(kind, dir, hidden, &proj.select(0, t as i64)?, &h, &c)?;
        outs[t] = Some(h.clone());
    }
    let outs: Vec<Tensor> = outs.into_iter().flatten().collect();
    Ok((Tensor::stack(&outs.iter().collect::<Vec<_>>(), 0)?, h, c))
}

/// One step: the next `(h, c)` (`c` passes through for GRU and RNN).
fn step(
    kind: Kind,
    dir: &Dir,
    hidden: usize,
    x_proj: &Tensor,
    h: &Tensor,
    c: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let hh = F::linear(h, &dir.r, dir.rb.as_ref())?;
    match kind {
        Kind::Lstm => {
            // ONNX gate order: i, o, f, c; peepholes add P * c (the old c
            // for i and f, the new one for o)
            let gates = x_proj.add(&hh)?.chunk(4, -1)?;
            let peep = |k: usize, gate: &Tensor, c: &Tensor| -> Result<Tensor> {
                match &dir.p {
                    Some(p) => gate.add(&p.narrow(0, (k * hidden) as i64, hidden)?.mul(c)?),
                    None => Ok(gate.clone()),
                }
            };
            let i = peep(0, &gates[0], c)?.sigmoid()?;
            let f = peep(2, &gates[2], c)?.sigmoid()?;
            let c = f.mul(c)?.add(&i.mul(&gates[3].tanh()?)?)?;
            let o = peep(1, &gates[1], &c)?.sigmoid()?;
            Ok((o.mul(&c.tanh()?)?, c))
        }
        Kind::Gru {
            linear_before_reset,
        } => {
            // ONNX gate order: z, r, h
            let xi = x_proj.chunk(3, -1)?;
            let hi = hh.chunk(3, -1)?;
            let z = xi[0].add(&hi[0])?.sigmoid()?;
            let r = xi[1].add(&hi[1])?.sigmoid()?;
            let cand = if linear_before_reset {
                r.mul(&hi[2])?
            } else {
                let rh = dir.r.narrow(0, 2 * hidden as i64, hidden)?;
                let rbh = dir
                    .rb
                    .as_ref()
                    .map(|b| b.narrow(0, 2 * hidden as i64, hidden))
                    .transpose()?;
                F::linear(&r.mul(h)?, &rh, rbh.as_ref())?
            };
            let n = xi[2].add(&cand)?.tanh()?;
            Ok((h.sub(&n)?.mul(&z)?.add(&n)?, c.clone()))
        }
        Kind::Rnn => Ok((x_proj.add(&hh)?.tanh()?, c.clone())),
    }
}
