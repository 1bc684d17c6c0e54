//! The generator's layout and extern ops: views, reductions, matmul,
//! convolution and cat (see `gen.rs`).

use super::Gen;
use kiln_ir::graph::NodeId;
use kiln_ir::op::conv::{ConvParams, Padding};
use kiln_ir::op::{Meta, Op};
use kiln_ir::{DType, ReduceKind};

impl Gen {
    pub(crate) fn view(&mut self) -> Option<NodeId> {
        let x = self.operand();
        let d = self.meta(x).dims;
        let r = d.len();
        let op = match self.rng.below(6) {
            0 if r >= 2 => {
                let mut p: Vec<i64> = (0..r as i64).collect();
                for i in (1..r).rev() {
                    p.swap(i, self.rng.below(i + 1));
                }
                Op::Permute(p)
            }
            1 => {
                // grow size-1 dims, sometimes add a leading dim
                let mut s: Vec<i64> = d
                    .iter()
                    .map(|&k| {
                        if k == 1 {
                            self.rng.range(1, 4)
                        } else if self.rng.chance(0.5) {
                            -1
                        } else {
                            k as i64
                        }
                    })
                    .collect();
                if r == 0 || self.rng.chance(0.4) {
                    s.insert(0, self.rng.range(1, 3));
                }
                Op::Expand(s)
            }
            2 => {
                let n: usize = d.iter().product();
                let choices: Vec<Vec<i64>> = [2usize, 3, 4]
                    .iter()
                    .filter(|&&f| n.is_multiple_of(f) && n > f)
                    .map(|&f| vec![f as i64, -1])
                    .chain([vec![-1], vec![n as i64, 1], vec![1, -1]])
                    .collect();
                Op::View(self.rng.pick(&choices))
            }
            3 if r >= 1 => {
                let k = self.rng.below(r);
                let n = d[k] as i64;
                let start = if self.rng.chance(0.5) {
                    Some(self.rng.range(-n, n - 1))
                } else {
                    None
                };
                let stop = if self.rng.chance(0.5) {
                    Some(self.rng.range(-n, n + 1))
                } else {
                    None
                };
                Op::Slice {
                    dim: k as i64 - if self.rng.chance(0.3) { r as i64 } else { 0 },
                    start,
                    stop,
                    step: self.rng.range(1, 2),
                }
            }
            4 if r >= 1 => {
                let k = self.rng.below(r);
                Op::Select {
                    dim: k as i64,
                    index: self.rng.range(-(d[k] as i64), d[k] as i64 - 1),
                }
            }
            _ if r >= 1 => {
                // a transpose of the last two dims (or a no-op permute)
                let mut p: Vec<i64> = (0..r as i64).collect();
                if r >= 2 {
                    p.swap(r - 1, r - 2);
                }
                Op::Permute(p)
            }
            _ => Op::View(vec![1]),
        };
        // an empty slice is legal but compares nothing: skip it
        let id = self.op(op, &[x])?;
        if self.meta(id).dims.contains(&0) {
            self.pool.pop();
            return None;
        }
        Some(id)
    }

    pub(crate) fn reduce(&mut self) -> Option<NodeId> {
        let x = self.operand();
        let m = self.meta(x);
        let r = m.dims.len();
        let keepdim = self.rng.chance(0.5);
        let mut dims: Vec<i64> = Vec::new();
        if r > 0 && self.rng.chance(0.75) {
            for k in 0..r {
                if self.rng.chance(0.4) {
                    dims.push(k as i64 - if self.rng.chance(0.3) { r as i64 } else { 0 });
                }
            }
            if dims.is_empty() {
                dims.push(self.rng.below(r) as i64);
            }
        }
        use ReduceKind::*;
        let kind = self.rng.pick(&[Sum, Sum, Prod, Max, Min, ArgMax, ArgMin]);
        match kind {
            ArgMax | ArgMin if dims.len() > 1 => dims.truncate(1),
            Prod if dims.len() != 1 || m.dtype != DType::F32 && m.dtype != DType::F64 => {
                return None;
            }
            _ => {}
        }
        if self.rng.chance(0.25) && m.dtype.is_float() {
            return self.op(Op::Mean { dims, keepdim }, &[x]);
        }
        self.op(
            Op::Reduce {
                kind,
                dims,
                keepdim,
            },
            &[x],
        )
    }

    fn float_operand(&mut self, min_rank: usize) -> Option<NodeId> {
        self.operand_where(|m| m.dtype == DType::F32 && m.dims.len() >= min_rank)
    }

    pub(crate) fn matmul(&mut self) -> Option<NodeId> {
        let a = self.float_operand(1)?;
        let da = self.meta(a).dims;
        let k = da[da.len() - 1];
        let mut db: Vec<usize> = vec![k];
        if self.rng.chance(0.8) {
            db.push(self.rng.range(1, 5) as usize);
            if self.rng.chance(0.3) {
                // batch dims broadcast against a's
                let batch = if da.len() > 2 {
                    self.bcast_shape(&da[..da.len() - 2])
                } else {
                    vec![self.rng.range(1, 3) as usize]
                };
                db.splice(0..0, batch);
            }
        }
        let cap = self.rng.chance(0.5);
        let b = self.input(Meta::new(DType::F32, &db), cap);
        let (a, b) = if db.len() == 1 && self.rng.chance(0.3) {
            // vector @ matrix: the vector on the left of a transposed a
            let r = da.len();
            if r >= 2 {
                let mut p: Vec<i64> = (0..r as i64).collect();
                p.swap(r - 1, r - 2);
                let at = self.op(Op::Permute(p), &[a])?;
                (b, at)
            } else {
                (a, b)
            }
        } else {
            (a, b)
        };
        self.op(Op::Matmul, &[a, b])
    }

    pub(crate) fn conv(&mut self) -> Option<NodeId> {
        let spatial = if self.rng.chance(0.7) { 2 } else { 1 };
        let x = match self.float_operand(spatial + 1) {
            Some(x) if self.meta(x).dims.len() <= spatial + 2 && self.rng.chance(0.7) => x,
            _ => {
                let mut d = vec![self.rng.range(1, 2) as usize, self.rng.range(1, 4) as usize];
                d.extend((0..spatial).map(|_| self.rng.range(3, 6) as usize));
                self.input(Meta::new(DType::F32, &d), false)
            }
        };
        let dx = self.meta(x).dims;
        let c = dx[dx.len() - spatial - 1];
        let groups = if c.is_multiple_of(2) && self.rng.chance(0.3) {
            2
        } else {
            1
        };
        let o = groups * self.rng.range(1, 3) as usize;
        let mut dw = vec![o, c / groups];
        dw.extend((0..spatial).map(|_| self.rng.range(1, 3) as usize));
        let cap = self.rng.chance(0.5);
        let w = self.input(Meta::new(DType::F32, &dw), cap);
        let mut args = vec![x, w];
        if self.rng.chance(0.5) {
            args.push(self.input(Meta::new(DType::F32, &[o]), true));
        }
        let padding = match self.rng.below(4) {
            0 => Padding::Same,
            1 => Padding::Valid,
            _ => Padding::Explicit(vec![self.rng.range(0, 1) as usize]),
        };
        let stride = if matches!(padding, Padding::Same) {
            1
        } else {
            self.rng.range(1, 2) as usize
        };
        let params = ConvParams {
            stride: vec![stride],
            padding,
            dilation: vec![self.rng.range(1, 2) as usize],
            groups,
        };
        self.op(Op::Conv { params, spatial }, &args)
    }

    pub(crate) fn cat(&mut self) -> Option<NodeId> {
        let a = self.operand_where(|m| !m.dims.is_empty())?;
        let d = self.meta(a);
        let k = self.rng.below(d.dims.len());
        let mut parts = vec![a];
        for _ in 0..self.rng.range(1, 2) {
            let mut dims = d.dims.to_vec();
            dims[k] = self.rng.range(1, 3) as usize;
            let b = match self.operand_where(|m| m.dims.as_slice() == dims.as_slice()) {
                Some(b) => b,
                None if self.rng.chance(0.5) => a,
                None => self.input(Meta::new(d.dtype, &dims), false),
            };
            parts.push(b);
        }
        self.op(Op::Cat { dim: k as i64 }, &parts)
    }
}
