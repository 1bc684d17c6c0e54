//! The decomposition [`Builder`] over pending expressions: the primitives
//! eager composites are written in, each a [`Lazy`] node or a kernel run.

use super::*;

impl Builder for Fuser {
    type T = Lazy;
    fn dims(&self, x: &Lazy) -> Dims {
        x.0.meta.dims.clone()
    }
    fn dtype(&self, x: &Lazy) -> DType {
        x.0.meta.dtype
    }
    fn unary(&mut self, op: UnaryOp, x: &Lazy) -> Result<Lazy> {
        let s = infer::unary(op, &x.0.meta)?;
        Ok(Lazy::new(
            Meta {
                dtype: s.out,
                dims: s.dims,
            },
            Kind::Unary(op, s.compute, x.clone()),
        ))
    }
    fn binary(&mut self, op: BinaryOp, a: &Lazy, b: &Lazy) -> Result<Lazy> {
        let s = infer::binary(op, Arg::Tensor(&a.0.meta), Arg::Tensor(&b.0.meta))?;
        Ok(Lazy::new(
            Meta {
                dtype: s.out,
                dims: s.dims,
            },
            Kind::Binary(op, s.compute, a.clone(), b.clone()),
        ))
    }
    fn scalar(&mut self, op: BinaryOp, a: &Lazy, v: f64) -> Result<Lazy> {
        self.binary_scalar(op, a, scalar_for(a.0.meta.dtype, v), false)
    }
    fn select(&mut self, c: &Lazy, a: &Lazy, b: &Lazy) -> Result<Lazy> {
        let s = infer::where_(&c.0.meta, Arg::Tensor(&a.0.meta), Arg::Tensor(&b.0.meta))?;
        Ok(Lazy::new(
            Meta {
                dtype: s.out,
                dims: s.dims,
            },
            Kind::Select(s.compute, c.clone(), a.clone(), b.clone()),
        ))
    }
    fn select_scalar(&mut self, c: &Lazy, a: &Lazy, v: f64) -> Result<Lazy> {
        let sc = scalar_for(a.0.meta.dtype, v);
        let s = infer::where_(
            &c.0.meta,
            Arg::Tensor(&a.0.meta),
            Arg::Scalar(sc.category()),
        )?;
        let k = Lazy::new(
            Meta {
                dtype: s.compute,
                dims: Dims::new(),
            },
            Kind::Scalar(sc.value(), s.compute),
        );
        Ok(Lazy::new(
            Meta {
                dtype: s.out,
                dims: s.dims,
            },
            Kind::Select(s.compute, c.clone(), a.clone(), k),
        ))
    }
    fn reduce(&mut self, kind: ReduceKind, x: &Lazy, dims: &[i64], keepdim: bool) -> Result<Lazy> {
        let t = self.reduce_lazy(kind.name(), kind, x, dims, keepdim, None, |_, acc, _, _| {
            vec![acc]
        })?;
        Ok(Lazy::tensor(&t))
    }
    fn mean(&mut self, x: &Lazy, dims: &[i64], keepdim: bool) -> Result<Lazy> {
        infer::require_float("mean", &x.0.meta)?;
        let t = self.reduce_lazy(
            "mean",
            ReduceKind::Sum,
            x,
            dims,
            keepdim,
            None,
            |k, acc, n, c| vec![mean_epilogue(k, acc, n, c)],
        )?;
        Ok(Lazy::tensor(&t))
    }
    /// One online log-sum-exp kernel storing (shift, logsum) per row (run
    /// by its reader as a row pass where it can: [`rows`]).
    fn lse_parts(&mut self, x: &Lazy, dims: &[i64]) -> Result<(Lazy, Lazy)> {
        let p = self.one_pass(ReduceKind::LogSumExp, x, dims, 0.0, true)?;
        Ok((p[0].clone(), p[1].clone()))
    }
    /// One Welford kernel storing (mean, var, rstd) per row (run by its
    /// reader as a row pass where it can: [`rows`]).
    fn moments(&mut self, x: &Lazy, dims: &[i64], eps: f64) -> Result<Moments<Lazy>> {
        let p = self.one_pass(ReduceKind::Welford, x, dims, eps, true)?;
        Ok(Moments {
            mean: p[0].clone(),
            var: p[1].clone(),
            rstd: p[2].clone(),
        })
    }
    fn reshape(&mut self, x: &Lazy, shape: &[i64]) -> Result<Lazy> {
        Ok(Lazy::tensor(&x.materialize()?.reshape(shape)?))
    }
    fn cast(&mut self, x: &Lazy, dt: DType) -> Result<Lazy> {
        if dt == x.0.meta.dtype {
            return Ok(x.clone());
        }
        Ok(Lazy::new(
            Meta {
                dtype: dt,
                dims: x.0.meta.dims.clone(),
            },
            Kind::Cast(x.clone()),
        ))
    }
    fn gather(&mut self, x: &Lazy, dim: i64, index: &Lazy) -> Result<Lazy> {
        Ok(Lazy::tensor(
            &x.materialize()?.gather(dim, &index.materialize()?)?,
        ))
    }
}
