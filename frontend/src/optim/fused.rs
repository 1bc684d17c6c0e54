//! Fused optimizer steps (PyTorch's `fused=True`): SGD, Adam and AdamW
//! update a parameter and its state in ONE multi-output kernel
//! ([`Lazy::materialize_many_named`]) instead of one kernel per op.
//!
//! Every tensor is viewed flat (1-D), so the parameters of one dtype share
//! a kernel signature: the code is compiled once per dtype (and option set)
//! and launched once per parameter. What changes between steps — lr, the
//! bias corrections, the first momentum step — is a runtime scalar
//! argument, so a scheduler never recompiles. (A one-element parameter
//! collapses to a broadcast loop: a second signature.)
//!
//! The expressions are the eager formulas of `sgd.rs` and `adam.rs`, op for
//! op and in the parameter's dtype; eager rounds each op to that same dtype,
//! so for f32/f64 the two paths agree bit for bit — except that the fused
//! first momentum step, `0 * 0 + d * 1` so that it shares the later steps'
//! kernel, turns a -0.0 of `d` into 0.0.
//!
//! The eager formula still runs for: f16/bf16 (eager rounds after every
//! op, a kernel once), a gradient or state of another dtype or not
//! contiguous (no flat view), empty parameters, and amsgrad (a fourth state
//! tensor; rare enough to keep the kernel shapes few).

use super::core::{bump_step, full_like, ParamState};
use super::group::{ParamGroup, Value};
use crate::ops::fuse::{Fuser, Lazy};
use crate::{Scalar, Tensor};
use kiln_ir::{BinaryOp, DType, Result, UnaryOp};
use kiln_passes::decompose::Builder;

/// Whether the group asks for the fused step (`fused`, false when absent,
/// as in a state dict saved before the option existed).
pub(crate) fn wanted(g: &ParamGroup) -> bool {
    g.get("fused").and_then(Value::as_bool).unwrap_or(false)
}

/// Whether `p`, its gradient and its state so far can be updated flat.
fn fusable(p: &Tensor, grad: &Tensor, st: &ParamState) -> bool {
    let dt = p.dtype();
    let like_p = |t: &Tensor| t.dtype() == dt && t.is_contiguous() && t.dims() == p.dims();
    matches!(dt, DType::F32 | DType::F64)
        && p.numel() > 0
        && like_p(p)
        && like_p(grad)
        && st.iter().all(|(k, t)| k == "step" || like_p(t))
}

fn flat(t: &Tensor) -> Result<Tensor> {
    t.view(&[t.numel() as i64])
}

/// Pending expressions built in the eager ops' exact instruction order.
struct Ex(Fuser);

impl Ex {
    /// `a op v` with `v` a runtime scalar.
    fn s(&self, a: &Lazy, op: BinaryOp, v: f64) -> Result<Lazy> {
        self.0.binary_scalar(op, a, Scalar::Float(v), false)
    }
    fn b(&mut self, op: BinaryOp, a: &Lazy, b: &Lazy) -> Result<Lazy> {
        self.0.binary(op, a, b)
    }
    /// `torch.add(a, b, alpha)` as `Tensor::add_scaled` computes it.
    fn add_scaled(&mut self, a: &Lazy, b: &Lazy, alpha: f64, subtract: bool) -> Result<Lazy> {
        let bs = self.s(b, BinaryOp::Mul, alpha)?;
        let op = if subtract {
            BinaryOp::Sub
        } else {
            BinaryOp::Add
        };
        self.b(op, a, &bs)
    }
    /// `core::lerp`'s two-sided formula.
    fn lerp(&mut self, a: &Lazy, b: &Lazy, w: f64) -> Result<Lazy> {
        let diff = self.b(BinaryOp::Sub, b, a)?;
        if w.abs() < 0.5 {
            self.add_scaled(a, &diff, w, false)
        } else {
            self.add_scaled(b, &diff, 1.0 - w, true)
        }
    }
    fn grad(&mut self, grad: &Tensor, maximize: bool) -> Result<Lazy> {
        let g = Lazy::tensor(&flat(grad)?);
        if maximize {
            self.0.unary(UnaryOp::Neg, &g)
        } else {
            Ok(g)
        }
    }
}

/// Writes `p`'s new value and the state updates in one kernel.
fn run(name: &str, p: &Tensor, stores: &[(&Lazy, &Tensor)]) -> Result<()> {
    p.prepare_inplace(name, &[])?;
    Lazy::materialize_many_named(Some(name), stores)
}

/// The fused SGD step of one parameter; `Ok(false)`: take the eager path.
pub(crate) fn sgd(g: &ParamGroup, p: &Tensor, grad: &Tensor, st: &mut ParamState) -> Result<bool> {
    if !fusable(p, grad, st) {
        return Ok(false);
    }
    let (lr, momentum, dampening) = (g.f64("lr")?, g.f64("momentum")?, g.f64("dampening")?);
    let wd = g.f64("weight_decay")?;
    let mut x = Ex(Fuser);
    let pf = flat(p)?;
    let pl = Lazy::tensor(&pf);
    let mut d = x.grad(grad, g.bool("maximize")?)?;
    if wd != 0.0 {
        d = x.add_scaled(&d, &pl, wd, false)?;
    }
    if momentum == 0.0 {
        let new_p = x.add_scaled(&pl, &d, lr, true)?;
        run("sgd_step", p, &[(&new_p, &pf)])?;
        return Ok(true);
    }
    // the first buffer is d itself: 0 * 0 + d * 1, the later steps' kernel
    let (decay, keep) = if st.contains_key("momentum_buffer") {
        (momentum, 1.0 - dampening)
    } else {
        st.insert("momentum_buffer".into(), full_like(p, 0.0)?);
        (0.0, 1.0)
    };
    let bf = flat(&st["momentum_buffer"])?;
    let old = x.s(&Lazy::tensor(&bf), BinaryOp::Mul, decay)?;
    let buf = x.add_scaled(&old, &d, keep, false)?;
    let d = if g.bool("nesterov")? {
        x.add_scaled(&d, &buf, momentum, false)?
    } else {
        buf.clone()
    };
    let new_p = x.add_scaled(&pl, &d, lr, true)?;
    run("sgd_step", p, &[(&new_p, &pf), (&buf, &bf)])?;
    Ok(true)
}

/// The fused Adam (`decoupled`: AdamW) step of one parameter; `Ok(false)`:
/// take the eager path.
pub(crate) fn adam(
    decoupled: bool,
    g: &ParamGroup,
    p: &Tensor,
    grad: &Tensor,
    st: &mut ParamState,
) -> Result<bool> {
    if g.bool("amsgrad")? || !fusable(p, grad, st) {
        return Ok(false);
    }
    let (lr, eps, wd) = (g.f64("lr")?, g.f64("eps")?, g.f64("weight_decay")?);
    let (b1, b2) = g.betas()?;
    if !st.contains_key("exp_avg") {
        st.insert("exp_avg".into(), full_like(p, 0.0)?);
        st.insert("exp_avg_sq".into(), full_like(p, 0.0)?);
    }
    let step = bump_step(st)?;
    let mut x = Ex(Fuser);
    let pf = flat(p)?;
    let pl = Lazy::tensor(&pf);
    let (mf, vf) = (flat(&st["exp_avg"])?, flat(&st["exp_avg_sq"])?);
    let mut grad = x.grad(grad, g.bool("maximize")?)?;
    let mut param = pl.clone();
    if wd != 0.0 {
        if decoupled {
            param = x.s(&pl, BinaryOp::Mul, 1.0 - lr * wd)?;
        } else {
            grad = x.add_scaled(&grad, &pl, wd, false)?;
        }
    }
    let m = x.lerp(&Lazy::tensor(&mf), &grad, 1.0 - b1)?;
    let gg = x.b(BinaryOp::Mul, &grad, &grad)?;
    let v_old = x.s(&Lazy::tensor(&vf), BinaryOp::Mul, b2)?;
    let v = x.add_scaled(&v_old, &gg, 1.0 - b2, false)?;
    let bc1 = 1.0 - b1.powf(step);
    let bc2 = 1.0 - b2.powf(step);
    let sqrt = x.0.unary(UnaryOp::Sqrt, &v)?;
    let scaled = x.s(&sqrt, BinaryOp::Div, bc2.sqrt())?;
    let denom = x.s(&scaled, BinaryOp::Add, eps)?;
    let r = x.b(BinaryOp::Div, &m, &denom)?;
    let new_p = x.add_scaled(&param, &r, lr / bc1, true)?;
    let name = if decoupled { "adamw_step" } else { "adam_step" };
    run(name, p, &[(&new_p, &pf), (&m, &mf), (&v, &vf)])?;
    Ok(true)
}
