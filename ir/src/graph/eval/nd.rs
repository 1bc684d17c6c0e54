//! The reference interpreter's non-pointwise ops: views (by explicit index
//! arithmetic, not the runtime's layout code), reductions, matmul, linear,
//! convolution and cat. Float results accumulate in `f64` and round once.

use super::{bcast_index, cast_val, for_each_index, mul0, too_close, unit_roundoff};
use super::{Bounded, HostTensor};
use crate::interp::{round_to, wrap};
use crate::op::conv::{ConvParams, Padding};
use crate::op::Meta;
use crate::shape::{fmt_dims, Dims};
use crate::{bail, DType, ReduceKind, Result};

fn norm(op: &str, d: i64, rank: usize) -> Result<usize> {
    let r = rank.max(1) as i64;
    if d < -r || d >= r {
        bail!(op, "dim {d} out of range for rank {rank}");
    }
    Ok(if d < 0 { d + r } else { d } as usize)
}

/// A new value of `dims` whose element `o` is element `src(o_index)` of `x`.
fn gather(x: &Bounded, dims: &[usize], src: impl Fn(&[usize]) -> usize) -> Bounded {
    let n: usize = dims.iter().product();
    let mut out = Bounded {
        value: HostTensor {
            meta: Meta::new(x.dtype(), dims),
            data: vec![0.0; n],
        },
        err: vec![0.0; n],
        unsure: vec![false; n],
    };
    for_each_index(dims, |flat, idx| {
        let i = src(idx);
        out.value.data[flat] = x.value.data[i];
        out.err[flat] = x.err[i];
        out.unsure[flat] = x.unsure[i];
    });
    out
}

pub(super) fn flat_of(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// `view`/`reshape`: the same elements in row-major order, new dims.
pub(super) fn reshape(x: &Bounded, dims: &[usize]) -> Result<Bounded> {
    if dims.iter().product::<usize>() != x.value.numel() {
        bail!("view", "{} cannot become {}", x.meta(), fmt_dims(dims));
    }
    let mut out = x.clone();
    out.value.meta.dims = dims.into();
    Ok(out)
}

pub(super) fn permute(x: &Bounded, perm: &[i64]) -> Result<Bounded> {
    let d = &x.meta().dims;
    if perm.len() != d.len() {
        bail!("permute", "{perm:?} for {}", x.meta());
    }
    let p = perm
        .iter()
        .map(|&k| norm("permute", k, d.len()))
        .collect::<Result<Vec<_>>>()?;
    let dims: Dims = p.iter().map(|&k| d[k]).collect();
    Ok(gather(x, &dims, |o| {
        let mut i = vec![0; d.len()];
        for (k, &pk) in p.iter().enumerate() {
            i[pk] = o[k];
        }
        flat_of(&i, d)
    }))
}

pub(super) fn expand(x: &Bounded, sizes: &[i64]) -> Result<Bounded> {
    let d = &x.meta().dims;
    if sizes.len() < d.len() {
        bail!("expand", "{sizes:?} for {}", x.meta());
    }
    let lead = sizes.len() - d.len();
    let mut dims = Dims::new();
    for (k, &s) in sizes.iter().enumerate() {
        let have = if k >= lead { d[k - lead] } else { 1 };
        dims.push(if s == -1 { have } else { s as usize });
        if k >= lead && have != 1 && dims[k] != have {
            bail!("expand", "{sizes:?} for {}", x.meta());
        }
    }
    Ok(gather(x, &dims, |o| bcast_index(o, d)))
}

pub(super) fn slice(
    x: &Bounded,
    dim: i64,
    start: Option<i64>,
    stop: Option<i64>,
    step: i64,
) -> Result<Bounded> {
    let d = &x.meta().dims;
    let k = norm("slice", dim, d.len())?;
    if step < 1 {
        bail!("slice", "step {step}");
    }
    let n = d[k] as i64;
    // Python: negative bounds count from the end, then clamp to [0, n]
    let fix = |v: i64| (if v < 0 { v + n } else { v }).clamp(0, n);
    let s = start.map_or(0, fix);
    let e = stop.map_or(n, fix);
    let len = if e > s { (e - s + step - 1) / step } else { 0 };
    let mut dims: Dims = d.clone();
    dims[k] = len as usize;
    Ok(gather(x, &dims, |o| {
        let mut i = o.to_vec();
        i[k] = (s + o[k] as i64 * step) as usize;
        flat_of(&i, d)
    }))
}

pub(super) fn select(x: &Bounded, dim: i64, index: i64) -> Result<Bounded> {
    let d = &x.meta().dims;
    let k = norm("select", dim, d.len())?;
    let n = d[k] as i64;
    let at = if index < 0 { index + n } else { index };
    if at < 0 || at >= n {
        bail!("select", "index {index} for dim {k} of {}", x.meta());
    }
    let mut dims: Dims = d.clone();
    dims.remove(k);
    Ok(gather(x, &dims, |o| {
        let mut i = o.to_vec();
        i.insert(k, at as usize);
        flat_of(&i, d)
    }))
}

pub(super) fn cat(xs: &[&Bounded], dim: i64, dtype: DType) -> Result<Bounded> {
    let d0 = &xs[0].meta().dims;
    let k = norm("cat", dim, d0.len())?;
    let mut dims: Dims = d0.clone();
    dims[k] = xs.iter().map(|x| x.meta().dims[k]).sum();
    let n: usize = dims.iter().product();
    let mut out = Bounded {
        value: HostTensor {
            meta: Meta::new(dtype, &dims),
            data: vec![0.0; n],
        },
        err: vec![0.0; n],
        unsure: vec![false; n],
    };
    for_each_index(&dims, |flat, idx| {
        let (mut at, mut j) = (idx[k], 0);
        while at >= xs[j].meta().dims[k] {
            at -= xs[j].meta().dims[k];
            j += 1;
        }
        let mut i = idx.to_vec();
        i[k] = at;
        let x = xs[j];
        let src = flat_of(&i, &x.meta().dims);
        let (v, e, u) = cast_val(x.val(src), x.err[src], x.dtype(), dtype);
        out.value.data[flat] = v.as_f64();
        out.err[flat] = e;
        out.unsure[flat] = u || x.unsure[src];
    });
    Ok(out)
}

/// For each element of `x`: its output index, and its index within the
/// reduced dims (row-major over them); plus the output dims.
fn reduce_plan(x: &Meta, dims: &[i64], keepdim: bool) -> Result<(Vec<(usize, usize)>, Dims)> {
    let rank = x.dims.len();
    let mut red = vec![dims.is_empty(); rank];
    for &d in dims {
        let k = norm("reduce", d, rank)?;
        if red[k] && !dims.is_empty() {
            bail!("reduce", "dim {d} repeats in {dims:?}");
        }
        red[k] = true;
    }
    let mut out = Dims::new();
    for (&r, &d) in red.iter().zip(&x.dims) {
        if !r {
            out.push(d);
        } else if keepdim {
            out.push(1);
        }
    }
    let mut map = Vec::with_capacity(x.dims.iter().product());
    for_each_index(&x.dims, |_, idx| {
        let (mut o, mut r) = (0, 0);
        for k in 0..rank {
            if red[k] {
                r = r * x.dims[k] + idx[k];
            } else {
                o = o * x.dims[k] + idx[k];
            }
        }
        map.push((o, r));
    });
    Ok((map, out))
}

fn new_out(dtype: DType, dims: &[usize]) -> Bounded {
    let n: usize = dims.iter().product();
    Bounded {
        value: HostTensor {
            meta: Meta::new(dtype, dims),
            data: vec![0.0; n],
        },
        err: vec![0.0; n],
        unsure: vec![false; n],
    }
}

/// The elements of `x` (as `(index in x, index within the reduced dims)`)
/// grouped by output element.
type Groups = Vec<Vec<(usize, usize)>>;

pub(super) fn groups(x: &Meta, dims: &[i64], keepdim: bool) -> Result<(Groups, Dims)> {
    let (map, out) = reduce_plan(x, dims, keepdim)?;
    let mut g = vec![Vec::new(); out.iter().product()];
    for (i, (o, r)) in map.into_iter().enumerate() {
        g[o].push((i, r));
    }
    Ok((g, out))
}

pub(super) fn reduce(
    kind: ReduceKind,
    x: &Bounded,
    dims: &[i64],
    keepdim: bool,
    dtype: DType,
) -> Result<Bounded> {
    let (groups, odims) = groups(x.meta(), dims, keepdim)?;
    let mut out = new_out(dtype, &odims);
    let fl = x.dtype().is_float();
    let u = unit_roundoff(dtype);
    for (o, g) in groups.iter().enumerate() {
        let xs: Vec<f64> = g.iter().map(|&(i, _)| x.value.data[i]).collect();
        let es: Vec<f64> = g.iter().map(|&(i, _)| x.err[i]).collect();
        let unsure = g.iter().any(|&(i, _)| x.unsure[i]);
        let (v, e, un) = match kind {
            ReduceKind::Sum if fl => {
                let s: f64 = xs.iter().sum();
                let abs: f64 = xs.iter().map(|v| v.abs()).sum();
                let e = es.iter().sum::<f64>() + (xs.len() as f64 + 1.0) * u * abs;
                (round_to(s, dtype), e, false)
            }
            ReduceKind::Sum => {
                let s = xs.iter().fold(0i64, |a, &v| a.wrapping_add(v as i64));
                (wrap(s, dtype) as f64, 0.0, false)
            }
            ReduceKind::Prod if fl => {
                let p: f64 = xs.iter().product();
                let mut e = (xs.len() as f64 + 1.0) * u * p.abs();
                for (k, &ek) in es.iter().enumerate() {
                    let others: f64 = (0..xs.len())
                        .filter(|&j| j != k)
                        .map(|j| xs[j].abs())
                        .product();
                    e += mul0(others, ek);
                }
                (round_to(p, dtype), e, false)
            }
            ReduceKind::Prod => {
                let p = xs.iter().fold(1i64, |a, &v| a.wrapping_mul(v as i64));
                (wrap(p, dtype) as f64, 0.0, false)
            }
            ReduceKind::LogSumExp => {
                let m = xs
                    .iter()
                    .copied()
                    .fold(f64::NEG_INFINITY, crate::interp::fmax);
                let v = if m.is_infinite() || m.is_nan() {
                    m
                } else {
                    m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
                };
                let e = es.iter().copied().fold(0.0, f64::max)
                    + (xs.len() as f64 + 2.0) * u * (v.abs() + 1.0);
                (round_to(v, dtype), e, false)
            }
            ReduceKind::Welford => {
                // the biased variance
                let n = xs.len() as f64;
                let mean = xs.iter().sum::<f64>() / n;
                let v = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
                let spread = xs.iter().map(|x| (x - mean).abs()).fold(0.0, f64::max);
                let e = 2.0 * spread * es.iter().copied().fold(0.0, f64::max)
                    + (n + 2.0) * u * (v + spread * spread);
                (round_to(v, dtype), e, false)
            }
            ReduceKind::Max | ReduceKind::Min => {
                let pick = |a: f64, b: f64| match kind {
                    ReduceKind::Max => crate::interp::fmax(a, b),
                    _ => crate::interp::fmin(a, b),
                };
                let v = xs.iter().copied().reduce(pick).unwrap_or(f64::NAN);
                (v, es.iter().copied().fold(0.0, f64::max), false)
            }
            ReduceKind::ArgMax | ReduceKind::ArgMin => {
                let sign = if kind == ReduceKind::ArgMax {
                    1.0
                } else {
                    -1.0
                };
                // first NaN, else the first extreme element
                let best = match xs.iter().position(|v| v.is_nan()) {
                    Some(k) => k,
                    None => (0..xs.len()).fold(
                        0,
                        |b, k| {
                            if sign * xs[k] > sign * xs[b] {
                                k
                            } else {
                                b
                            }
                        },
                    ),
                };
                let close = (0..xs.len())
                    .any(|k| k != best && too_close((xs[best] - xs[k]).abs(), es[best] + es[k]));
                (g[best].1 as f64, 0.0, close)
            }
        };
        out.value.data[o] = v;
        out.err[o] = e;
        out.unsure[o] = unsure || un;
    }
    Ok(out)
}

pub(super) fn mean(x: &Bounded, dims: &[i64], keepdim: bool) -> Result<Bounded> {
    let dtype = x.dtype();
    let (groups, odims) = groups(x.meta(), dims, keepdim)?;
    let mut out = new_out(dtype, &odims);
    let u = unit_roundoff(dtype);
    for (o, g) in groups.iter().enumerate() {
        let n = g.len() as f64;
        let s: f64 = g.iter().map(|&(i, _)| x.value.data[i]).sum();
        let abs: f64 = g.iter().map(|&(i, _)| x.value.data[i].abs()).sum();
        let es: f64 = g.iter().map(|&(i, _)| x.err[i]).sum();
        out.value.data[o] = round_to(s / n, dtype);
        out.err[o] = es / n + (n + 2.0) * u * abs / n;
        out.unsure[o] = g.iter().any(|&(i, _)| x.unsure[i]);
    }
    Ok(out)
}

/// Accumulates products into out element `o`: value, error and unsure.
#[derive(Default)]
struct Dot {
    sum: f64,
    abs: f64,
    err: f64,
    terms: usize,
    unsure: bool,
}

impl Dot {
    fn add(&mut self, a: &Bounded, i: usize, b: &Bounded, j: usize) {
        let (x, y) = (a.value.data[i], b.value.data[j]);
        self.sum += x * y;
        self.abs += (x * y).abs();
        self.err += mul0(y.abs(), a.err[i]) + mul0(x.abs(), b.err[j]);
        self.terms += 1;
        self.unsure |= a.unsure[i] || b.unsure[j];
    }
    fn bias(&mut self, b: &Bounded, c: usize) {
        self.sum += b.value.data[c];
        self.abs += b.value.data[c].abs();
        self.err += b.err[c];
        self.terms += 1;
        self.unsure |= b.unsure[c];
    }
    fn store(&self, out: &mut Bounded, o: usize) {
        let dt = out.dtype();
        out.value.data[o] = round_to(self.sum, dt);
        out.err[o] = self.err + (self.terms as f64 + 2.0) * unit_roundoff(dt) * self.abs;
        out.unsure[o] = self.unsure;
    }
}

fn need_float(op: &str, xs: &[&Bounded]) -> Result<DType> {
    let dt = xs[0].dtype();
    if !dt.is_float() || xs.iter().any(|x| x.dtype() != dt) {
        let ts: Vec<String> = xs.iter().map(|x| x.meta().to_string()).collect();
        bail!(op, "expects floats of one dtype, got {}", ts.join(", "));
    }
    Ok(dt)
}

/// `torch.matmul` for every rank combination (1-D operands promoted and the
/// unit dim dropped; batch dims broadcast).
pub(super) fn matmul(a: &Bounded, b: &Bounded) -> Result<Bounded> {
    let dt = need_float("matmul", &[a, b])?;
    let (da, db) = (&a.meta().dims, &b.meta().dims);
    if da.is_empty() || db.is_empty() {
        bail!("matmul", "0-dim operand");
    }
    // view each operand as [batch..., rows, cols]
    let a2: Dims = if da.len() == 1 {
        [1, da[0]].into_iter().collect()
    } else {
        da.clone()
    };
    let b2: Dims = if db.len() == 1 {
        [db[0], 1].into_iter().collect()
    } else {
        db.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        bail!("matmul", "{} @ {}: inner dims differ", a.meta(), b.meta());
    }
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = crate::shape::broadcast_shapes("matmul", ba, bb)?;
    let mut full: Dims = batch.clone();
    full.extend([m, n]);
    let mut out_dims: Dims = batch.clone();
    if da.len() > 1 {
        out_dims.push(m);
    }
    if db.len() > 1 {
        out_dims.push(n);
    }
    let mut out = new_out(dt, &out_dims);
    let nb = batch.len();
    for_each_index(&full, |flat, idx| {
        let (bi, i, j) = (&idx[..nb], idx[nb], idx[nb + 1]);
        let oa = bcast_index(bi, ba) * m * k;
        let ob = bcast_index(bi, bb) * k * n;
        let mut d = Dot::default();
        for p in 0..k {
            d.add(a, oa + i * k + p, b, ob + p * n + j);
        }
        d.store(&mut out, flat);
    });
    Ok(out)
}

/// `x @ w^T + b` with `w` `[out, in]`.
pub(super) fn linear(x: &Bounded, w: &Bounded, bias: Option<&Bounded>) -> Result<Bounded> {
    let dt = need_float("linear", &[x, w])?;
    let (dx, dw) = (&x.meta().dims, &w.meta().dims);
    if dx.is_empty() || dw.len() != 2 || dx[dx.len() - 1] != dw[1] {
        bail!("linear", "{} with weight {}", x.meta(), w.meta());
    }
    let (k, n) = (dw[1], dw[0]);
    let rows = x.value.numel() / k.max(1);
    let mut out_dims: Dims = dx.clone();
    *out_dims.last_mut().expect("rank >= 1") = n;
    let mut out = new_out(dt, &out_dims);
    for r in 0..rows {
        for j in 0..n {
            let mut d = Dot::default();
            for p in 0..k {
                d.add(x, r * k + p, w, j * k + p);
            }
            if let Some(b) = bias {
                d.bias(b, j);
            }
            d.store(&mut out, r * n + j);
        }
    }
    Ok(out)
}

/// conv1d/conv2d: `x` `[N, C, (H,) W]` or unbatched, `w` `[O, C/groups, (kH,) kW]`.
pub(super) fn conv(
    x: &Bounded,
    w: &Bounded,
    bias: Option<&Bounded>,
    p: &ConvParams,
    spatial: usize,
) -> Result<Bounded> {
    let dt = need_float("conv", &[x, w])?;
    let (dx, dw) = (&x.meta().dims, &w.meta().dims);
    if dw.len() != spatial + 2 || !(spatial + 1..=spatial + 2).contains(&dx.len()) {
        bail!("conv", "input {} with weight {}", x.meta(), w.meta());
    }
    let batched = dx.len() == spatial + 2;
    let nb = if batched { dx[0] } else { 1 };
    let c = dx[batched as usize];
    // 2-D form: H = 1 for conv1d
    let sp = |d: &[usize], s: usize| -> [usize; 2] {
        if spatial == 1 {
            [1, d[s]]
        } else {
            [d[s], d[s + 1]]
        }
    };
    let ins = sp(dx, batched as usize + 1);
    let ks = sp(dw, 2);
    let per = |v: &[usize], fill: usize| -> [usize; 2] {
        let v2 = if v.len() == 1 {
            [v[0], v[0]]
        } else {
            [v[0], v[v.len() - 1]]
        };
        if spatial == 1 {
            [fill, v2[1]]
        } else {
            v2
        }
    };
    let stride = per(&p.stride, 1);
    let dil = per(&p.dilation, 1);
    let pad: [usize; 2] = match &p.padding {
        Padding::Valid => [0, 0],
        Padding::Explicit(v) => per(v, 0),
        // total = dil*(k-1), the smaller half before
        Padding::Same => [0, 1].map(|d| dil[d] * (ks[d] - 1) / 2),
    };
    let out_sz: [usize; 2] = [0, 1].map(|d| {
        let total = match p.padding {
            Padding::Same => ins[d] + dil[d] * (ks[d] - 1),
            _ => ins[d] + 2 * pad[d],
        };
        (total - dil[d] * (ks[d] - 1) - 1) / stride[d] + 1
    });
    let (o, g) = (dw[0], p.groups);
    let (cg, og) = (c / g, o / g);
    if dw[1] != cg || c % g != 0 || o % g != 0 {
        bail!(
            "conv",
            "input {} with weight {} groups={g}",
            x.meta(),
            w.meta()
        );
    }
    let mut out_dims = Dims::new();
    if batched {
        out_dims.push(nb);
    }
    out_dims.push(o);
    if spatial == 2 {
        out_dims.push(out_sz[0]);
    }
    out_dims.push(out_sz[1]);
    let mut out = new_out(dt, &out_dims);
    let [ih, iw] = ins;
    let [kh, kw] = ks;
    let [oh, ow] = out_sz;
    for bn in 0..nb {
        for co in 0..o {
            let grp = co / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut d = Dot::default();
                    for ci in 0..cg {
                        let cin = grp * cg + ci;
                        for ky in 0..kh {
                            let y = (oy * stride[0] + ky * dil[0]) as i64 - pad[0] as i64;
                            if y < 0 || y >= ih as i64 {
                                continue;
                            }
                            for kx in 0..kw {
                                let xx = (ox * stride[1] + kx * dil[1]) as i64 - pad[1] as i64;
                                if xx < 0 || xx >= iw as i64 {
                                    continue;
                                }
                                let xi = ((bn * c + cin) * ih + y as usize) * iw + xx as usize;
                                let wi = ((co * cg + ci) * kh + ky) * kw + kx;
                                d.add(x, xi, w, wi);
                            }
                        }
                    }
                    if let Some(b) = bias {
                        d.bias(b, co);
                    }
                    d.store(&mut out, ((bn * o + co) * oh + oy) * ow + ox);
                }
            }
        }
    }
    Ok(out)
}

/// Used by the tests: one value of dtype `dt` as the interpreter stores it.
#[cfg(test)]
pub(super) fn stored(v: f64, dt: DType) -> f64 {
    use crate::interp::{Interp, Val};
    use crate::scalar::ScalarOps;
    Interp.cast(Val::F(v), DType::F64, dt).as_f64()
}
