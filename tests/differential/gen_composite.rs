//! The generator's composite ops (see `gen.rs`): softmax and log_softmax,
//! logsumexp, var and std, layer/group/batch norm (eval mode), cross_entropy
//! and nll_loss with class-index targets, and the elementwise pair losses.
//!
//! Their float operands come from the pool like any op's, so they are fed by
//! pointwise chains (the fusion plan's reduction prologues); sometimes an
//! explicit prologue `x * s + mask` (an attention-style additive mask of 0 and
//! -1e4) is built first, and sometimes a pointwise epilogue follows. Inputs
//! with restricted domains are made to fit: running variances are positive,
//! class weights positive, targets valid class indices (or the ignore_index)
//! with at least one position kept, and var/std keep n > correction.

use super::{bin, scal, Gen};
use kiln_ir::graph::{Constant, NodeId, Reduction};
use kiln_ir::op::{Meta, Op};
use kiln_ir::{BinaryOp, DType, Float, UnaryOp};

impl Gen {
    pub(crate) fn composite(&mut self) -> Option<NodeId> {
        let y = match self.rng.below(12) {
            0..=2 => self.softmax(),
            3 => self.logsumexp(),
            4 => self.var_std(),
            5 => self.layer_norm(),
            6 => self.group_norm(),
            7 => self.batch_norm(),
            8..=9 => self.class_loss(),
            _ => self.pair_loss(),
        }?;
        if self.meta(y).dims.contains(&0) || !self.rng.chance(0.3) {
            return Some(y);
        }
        // a pointwise epilogue
        let op = match self.rng.below(3) {
            0 => scal(BinaryOp::Mul, self.rng.pick(&[0.5, -2.0, 3.0])),
            1 => Op::Unary(self.rng.pick(&[UnaryOp::Tanh, UnaryOp::Relu])),
            _ => {
                let b = self.partner(y);
                return self.op(bin(BinaryOp::Add), &[y, b]);
            }
        };
        self.op(op, &[y])
    }

    /// A float pool value of rank `min_rank..=4`, or a new input: one with a
    /// long last dim sometimes (rows long enough for the kernels' vector
    /// paths), else if no pool value turns up.
    fn float_value(&mut self, min_rank: usize) -> NodeId {
        let ok = |m: &Meta| m.dtype.is_float() && m.dims.len() >= min_rank && !m.dims.contains(&0);
        let long = self.rng.chance(0.12);
        if !long {
            if let Some(x) = self.operand_where(ok) {
                return x;
            }
        }
        let mut d = if long {
            let mut d: Vec<usize> = (0..self.rng.range(0, 2))
                .map(|_| self.rng.range(1, 4) as usize)
                .collect();
            d.push(self.rng.pick(&[8, 17, 33, 64, 100]));
            d
        } else {
            self.shape(4)
        };
        while d.len() < min_rank {
            d.push(self.rng.range(1, 5) as usize);
        }
        let dt = if self.rng.chance(0.15) {
            DType::F64
        } else {
            DType::F32
        };
        self.input(Meta::new(dt, &d), false)
    }

    /// A random dim of a value of rank `r` (negative sometimes).
    fn dim_of(&mut self, r: usize) -> i64 {
        let r = r.max(1) as i64;
        self.rng.range(0, r - 1) - if self.rng.chance(0.3) { r } else { 0 }
    }

    /// A random set of reduced dims of a value of rank `r` (empty: all).
    fn reduce_dims(&mut self, r: usize) -> Vec<i64> {
        let mut dims = Vec::new();
        if r > 0 && self.rng.chance(0.8) {
            for k in 0..r {
                if self.rng.chance(0.4) {
                    dims.push(k as i64 - if self.rng.chance(0.3) { r as i64 } else { 0 });
                }
            }
            if dims.is_empty() {
                dims.push(self.rng.below(r) as i64);
            }
        }
        dims
    }

    /// `x * s + mask`, the mask 0 or -1e4 from a random bool input that
    /// broadcasts against `x`.
    fn masked(&mut self, x: NodeId) -> Option<NodeId> {
        let m = self.meta(x);
        let scale = scal(BinaryOp::Mul, self.rng.pick(&[0.125, 0.5, 2.0]));
        let s = self.op(scale, &[x])?;
        let d = self.bcast_shape(&m.dims);
        let cond = self.input(Meta::new(DType::Bool, &d), false);
        let zero = self.g.constant(Constant::scalar(0.0, m.dtype)).ok()?;
        let big = self.g.constant(Constant::scalar(-1e4, m.dtype)).ok()?;
        let mask = self.op(Op::Where, &[cond, zero, big])?;
        self.op(bin(BinaryOp::Add), &[s, mask])
    }

    fn softmax(&mut self) -> Option<NodeId> {
        let mut x = self.float_value(0);
        if self.rng.chance(0.35) {
            x = self.masked(x)?;
        } else {
            x = self.scaled(x)?;
        }
        let dim = self.dim_of(self.meta(x).dims.len());
        let op = if self.rng.chance(0.5) {
            Op::Softmax { dim }
        } else {
            Op::LogSoftmax { dim }
        };
        self.op(op, &[x])
    }

    fn logsumexp(&mut self) -> Option<NodeId> {
        let mut x = self.float_value(0);
        if self.rng.chance(0.25) {
            x = self.masked(x)?;
        } else {
            x = self.scaled(x)?;
        }
        let dims = self.reduce_dims(self.meta(x).dims.len());
        let keepdim = self.rng.chance(0.5);
        self.op(Op::LogSumExp { dims, keepdim }, &[x])
    }

    /// `x * s + c` sometimes: large scales and offsets for the statistics
    /// (a mean far from 0 strains a one-pass variance; large logits the lse shift).
    fn scaled(&mut self, x: NodeId) -> Option<NodeId> {
        if !self.rng.chance(0.25) {
            return Some(x);
        }
        let s = scal(BinaryOp::Mul, self.rng.pick(&[0.01, 10.0, 100.0]));
        let x = self.op(s, &[x])?;
        let c = scal(BinaryOp::Add, self.rng.pick(&[-50.0, 30.0, 1000.0]));
        self.op(c, &[x])
    }

    fn var_std(&mut self) -> Option<NodeId> {
        let x = self.float_value(0);
        let x = self.scaled(x)?;
        let d = self.meta(x).dims;
        let dims = self.reduce_dims(d.len());
        let n: usize = if dims.is_empty() {
            d.iter().product()
        } else {
            let r = d.len() as i64;
            dims.iter().map(|&k| d[((k + r) % r) as usize]).product()
        };
        let mut correction = self.rng.pick(&[0.0, 1.0, 1.0, 2.0]);
        if n as f64 <= correction {
            correction = 0.0;
        }
        let (correction, keepdim) = (Float(correction), self.rng.chance(0.5));
        let op = if self.rng.chance(0.5) {
            Op::Var {
                dims,
                correction,
                keepdim,
            }
        } else {
            Op::Std {
                dims,
                correction,
                keepdim,
            }
        };
        self.op(op, &[x])
    }

    fn eps(&mut self) -> Float {
        Float(self.rng.pick(&[1e-5, 1e-5, 1e-3, 0.1]))
    }

    fn layer_norm(&mut self) -> Option<NodeId> {
        let x = self.float_value(1);
        let x = self.scaled(x)?;
        let m = self.meta(x);
        let k = self.rng.range(1, m.dims.len().min(3) as i64) as usize;
        let normalized_shape = m.dims[m.dims.len() - k..].to_vec();
        let (w, b) = (self.rng.chance(0.5), self.rng.chance(0.5));
        let mut args = vec![x];
        for present in [w, b] {
            if present {
                let cap = self.rng.chance(0.5);
                args.push(self.input(Meta::new(m.dtype, &normalized_shape), cap));
            }
        }
        let op = Op::LayerNorm {
            normalized_shape,
            eps: self.eps(),
            has_weight: w,
            has_bias: b,
        };
        self.op(op, &args)
    }

    /// An (N, C, *) float value: from the pool, or a new input.
    fn channels_value(&mut self) -> NodeId {
        if self.rng.chance(0.7) {
            return self.float_value(2);
        }
        let mut d = vec![self.rng.range(1, 3) as usize, self.rng.pick(&[2, 3, 4, 6])];
        d.extend((0..self.rng.below(3)).map(|_| self.rng.range(1, 5) as usize));
        self.input(Meta::new(DType::F32, &d), false)
    }

    fn group_norm(&mut self) -> Option<NodeId> {
        let x = self.channels_value();
        let x = self.scaled(x)?;
        let m = self.meta(x);
        let c = m.dims[1];
        let divisors: Vec<usize> = (1..=c).filter(|g| c.is_multiple_of(*g)).collect();
        let groups = self.rng.pick(&divisors);
        let (w, b) = (self.rng.chance(0.5), self.rng.chance(0.5));
        let mut args = vec![x];
        for present in [w, b] {
            if present {
                args.push(self.input(Meta::new(m.dtype, &[c]), true));
            }
        }
        let op = Op::GroupNorm {
            groups,
            eps: self.eps(),
            has_weight: w,
            has_bias: b,
        };
        self.op(op, &args)
    }

    fn batch_norm(&mut self) -> Option<NodeId> {
        let x = self.channels_value();
        let m = self.meta(x);
        let c = m.dims[1];
        let cm = Meta::new(m.dtype, &[c]);
        let mean = self.input(cm.clone(), true);
        let var: Vec<f64> = (0..c).map(|_| self.rng.normal().abs() + 0.1).collect();
        let var = self.input_data(cm.clone(), var, true);
        let mut args = vec![x, mean, var];
        let (w, b) = (self.rng.chance(0.5), self.rng.chance(0.5));
        for present in [w, b] {
            if present {
                args.push(self.input(cm.clone(), true));
            }
        }
        let op = Op::BatchNorm {
            training: false,
            momentum: Float(0.1),
            eps: self.eps(),
            has_running_stats: true,
            has_weight: w,
            has_bias: b,
        };
        self.op(op, &args)
    }

    /// cross_entropy on logits or nll_loss on log-probabilities (a
    /// log_softmax node mostly), with class-index targets.
    fn class_loss(&mut self) -> Option<NodeId> {
        let mut x = self.float_value(1);
        if self.meta(x).dims.len() > 3 {
            x = self.float_value(1);
        }
        let m = self.meta(x);
        let cd = usize::from(m.dims.len() >= 2);
        let c = m.dims[cd];
        let nll = self.rng.chance(0.4);
        if nll && self.rng.chance(0.7) {
            x = self.op(Op::LogSoftmax { dim: cd as i64 }, &[x])?;
        }
        let ignore_index = if self.rng.chance(0.3) {
            self.rng.below(c) as i64
        } else {
            -100
        };
        let mut tdims = m.dims.to_vec();
        tdims.remove(cd);
        let n: usize = tdims.iter().product();
        let mut targets: Vec<f64> = (0..n)
            .map(|_| {
                if ignore_index == -100 && self.rng.chance(0.15) {
                    -100.0
                } else {
                    self.rng.below(c) as f64
                }
            })
            .collect();
        // at least one kept position, or a mean would be 0/0
        if !targets.iter().any(|&t| t as i64 != ignore_index) {
            let keep: Vec<usize> = (0..c).filter(|&k| k as i64 != ignore_index).collect();
            if keep.is_empty() {
                return None;
            }
            targets[0] = self.rng.pick(&keep) as f64;
        }
        let t = self.input_data(Meta::new(DType::I64, &tdims), targets, false);
        let mut args = vec![x, t];
        let has_weight = self.rng.chance(0.4);
        if has_weight {
            let w: Vec<f64> = (0..c).map(|_| self.rng.normal().abs() + 0.2).collect();
            let cap = self.rng.chance(0.5);
            args.push(self.input_data(Meta::new(m.dtype, &[c]), w, cap));
        }
        let reduction = self.rng.pick(&Reduction::ALL);
        let op = if nll {
            Op::NllLoss {
                reduction,
                ignore_index,
                has_weight,
            }
        } else {
            let smoothing = if self.rng.chance(0.25) { 0.1 } else { 0.0 };
            Op::CrossEntropy {
                reduction,
                ignore_index,
                label_smoothing: Float(smoothing),
                has_weight,
            }
        };
        self.op(op, &args)
    }

    /// mse, l1, smooth_l1 or huber of a float value and a target of its
    /// dtype that broadcasts against it.
    fn pair_loss(&mut self) -> Option<NodeId> {
        let x = self.float_value(0);
        let m = self.meta(x);
        let ok = |t: &Meta| {
            t.dtype == m.dtype
                && kiln_ir::shape::broadcast_shapes("gen", &t.dims, &m.dims).is_ok()
                && !t.dims.contains(&0)
        };
        let y = match self.operand_where(ok) {
            Some(y) if y != x && self.rng.chance(0.6) => y,
            _ => {
                let d = if self.rng.chance(0.7) {
                    m.dims.to_vec()
                } else {
                    self.bcast_shape(&m.dims)
                };
                self.input(Meta::new(m.dtype, &d), false)
            }
        };
        let name = self.rng.pick(&["mse", "l1", "smooth_l1", "huber"]);
        let op = Op::PairLoss {
            name,
            reduction: self.rng.pick(&Reduction::ALL),
            has_weight: false,
            has_pos_weight: false,
        };
        self.op(op, &[x, y])
    }
}
