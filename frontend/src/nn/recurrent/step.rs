//! One time step of each recurrence, as PyTorch computes it, written with
//! differentiable kiln ops (so eager autograd and `compile` both see it).
//!
//! The input projection `W_ih x + b_ih` is an argument: a layer computes it
//! for every time step in one GEMM before the loop, and only the
//! hidden-to-hidden product stays inside it.

use super::weights::{CellKind, CellWeights};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::Result;

/// The state carried between steps: `h`, and `c` for an LSTM.
#[derive(Clone)]
pub struct State {
    pub h: Tensor,
    pub c: Option<Tensor>,
}

/// `W_ih x + b_ih` for `x` of any leading dims (one GEMM).
pub fn input_projection(w: &CellWeights, x: &Tensor) -> Result<Tensor> {
    F::linear(x, &w.weight_ih, w.bias_ih.as_ref())
}

/// How a recurrence computes its two products: float `F::linear` with a
/// [`CellWeights`], or the int8 kernels of a dynamically quantized LSTM
/// (`kiln::quantization`). `idx` is the layer-and-direction index.
pub trait Projections {
    /// `W_ih x + b_ih` for `x` of any leading dims (one GEMM per sequence).
    fn input(&self, idx: usize, x: &Tensor) -> Result<Tensor>;
    /// `W_hh h + b_hh`.
    fn hidden(&self, idx: usize, h: &Tensor) -> Result<Tensor>;
    /// `W_hr h` for an LSTM with `proj_size`, else `h`.
    fn project(&self, idx: usize, h: Tensor) -> Result<Tensor>;
}

impl Projections for [CellWeights] {
    fn input(&self, idx: usize, x: &Tensor) -> Result<Tensor> {
        input_projection(&self[idx], x)
    }
    fn hidden(&self, idx: usize, h: &Tensor) -> Result<Tensor> {
        let w = &self[idx];
        F::linear(h, &w.weight_hh, w.bias_hh.as_ref())
    }
    fn project(&self, idx: usize, h: Tensor) -> Result<Tensor> {
        match &self[idx].weight_hr {
            Some(w_hr) => F::linear(&h, w_hr, None),
            None => Ok(h),
        }
    }
}

/// The next state of cell `idx` of `p` from `x_proj` (`W_ih x_t + b_ih`,
/// shape (B, gates*H)) and the current one.
pub fn step(
    kind: CellKind,
    p: &(impl Projections + ?Sized),
    idx: usize,
    x_proj: &Tensor,
    s: &State,
) -> Result<State> {
    let hh = p.hidden(idx, &s.h)?;
    match kind {
        CellKind::Lstm => {
            let gates = x_proj.add(&hh)?;
            let g = gates.chunk(4, -1)?;
            let (i, f, cand, o) = (
                g[0].sigmoid()?,
                g[1].sigmoid()?,
                g[2].tanh()?,
                g[3].sigmoid()?,
            );
            let c_prev = s.c.as_ref().ok_or_else(|| {
                kiln_ir::Error::op("LSTM", "an LSTM step needs the cell state c".to_string())
            })?;
            let c = f.mul(c_prev)?.add(&i.mul(&cand)?)?;
            let h = p.project(idx, o.mul(&c.tanh()?)?)?;
            Ok(State { h, c: Some(c) })
        }
        CellKind::Gru => {
            let xi = x_proj.chunk(3, -1)?;
            let hi = hh.chunk(3, -1)?;
            let r = xi[0].add(&hi[0])?.sigmoid()?;
            let z = xi[1].add(&hi[1])?.sigmoid()?;
            let n = xi[2].add(&r.mul(&hi[2])?)?.tanh()?;
            // (1 - z) * n + z * h, in ATen's order of operations
            let h = s.h.sub(&n)?.mul(&z)?.add(&n)?;
            Ok(State { h, c: None })
        }
        CellKind::RnnTanh => Ok(State {
            h: x_proj.add(&hh)?.tanh()?,
            c: None,
        }),
        CellKind::RnnRelu => Ok(State {
            h: x_proj.add(&hh)?.relu()?,
            c: None,
        }),
    }
}
