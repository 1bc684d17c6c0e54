//! 2-D pooling on a CUDA device from generated reductions, forward and
//! backward, with the CPU externs' semantics (`kiln_runtime::externs::pool`).
//!
//! A window is separable: its max (or sum) is the max over its rows of the
//! max over each row's columns. So a pool is two reductions, one window axis
//! each, read in place through strided views of a zero-padded copy of the
//! input (stride and dilation are strides of the view) — no im2col copy.
//! Each axis is a table `[out, taps]` of input positions (-1 in the padding)
//! that masks the padding and gives max-pool indices. Adaptive windows start
//! at `floor(i*in/out)`, which no stride can express: unless `out` divides
//! `in` (then they are regular windows) they read the whole axis under a mask
//! of their `[start, end)` ranges, costing `out * in` per line instead of
//! `out * kernel`.
//!
//! Backward reads the output gradient the other way round: each input
//! position sums the outputs whose windows hold it, through a view of the
//! gradient spread (stride-dilated) into a zero buffer — again reductions
//! over taps, with no scatter and no atomics, so it is deterministic.

use crate::ops::kernel::KernelCall;
use crate::ops::pointwise::copy_into;
use crate::Tensor;
use kiln_codegen::ValueId;
use kiln_ir::op::pool::{adaptive_range, Pool2dGeometry};
use kiln_ir::op::Layout;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result};
use kiln_runtime::Device;

/// Above every flat index: the key of a window element that is not a
/// candidate (the geometry checks leave every window some input position).
const NOT_A_CANDIDATE: i64 = 1 << 40;

/// Where one axis of the windows reads: output `i`, tap `k` reads position
/// `i*step + k*dil` of the axis padded by `pad_begin` zeros.
struct Axis {
    size: usize,
    out: usize,
    taps: usize,
    step: usize,
    dil: usize,
    pad_begin: usize,
    pad_end: usize,
    /// `[out, taps]`: the input position each tap reads, -1 outside the input
    /// (or, for adaptive windows over the whole axis, outside the window)
    table: Vec<i64>,
    regular: bool,
}

impl Axis {
    fn new(geo: &Pool2dGeometry, adaptive: bool, d: usize) -> Axis {
        let (size, out) = (geo.in_size[d], geo.out_size[d]);
        if adaptive && !size.is_multiple_of(out) {
            let table = (0..out)
                .flat_map(|i| {
                    let (lo, hi) = adaptive_range(i, size, out);
                    (0..size).map(move |k| if k >= lo && k < hi { k as i64 } else { -1 })
                })
                .collect();
            return Axis {
                size,
                out,
                taps: size,
                step: 0,
                dil: 1,
                pad_begin: 0,
                pad_end: 0,
                table,
                regular: false,
            };
        }
        let (taps, step, dil, pad) = if adaptive {
            let k = size / out;
            (k, k, 1, 0)
        } else {
            let p = geo.params;
            (p.kernel[d], p.stride[d], p.dilation[d], p.padding[d])
        };
        // ceil_mode's last window may run past the padding
        let span = (out - 1) * step + (taps - 1) * dil + 1;
        let table = (0..out)
            .flat_map(|i| {
                (0..taps).map(move |k| {
                    let at = (i * step + k * dil) as i64 - pad as i64;
                    if at >= 0 && at < size as i64 {
                        at
                    } else {
                        -1
                    }
                })
            })
            .collect();
        Axis {
            size,
            out,
            taps,
            step,
            dil,
            pad_begin: pad,
            pad_end: span.saturating_sub(size + pad),
            table,
            regular: true,
        }
    }

    fn padded(&self) -> usize {
        self.size + self.pad_begin + self.pad_end
    }

    /// The table as an i64 tensor on `dev` of `dims` (`out * taps` elements).
    fn table_on(&self, dev: Device, dims: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(self.table.clone(), dims)?.to_device(dev)
    }

    /// Window `i`'s extent counting the padding (clipped to the padded input,
    /// as `count_include_pad` counts it), and counting the input only.
    fn extents(&self, i: usize) -> (i64, i64) {
        if !self.regular {
            let (lo, hi) = adaptive_range(i, self.size, self.out);
            return ((hi - lo) as i64, (hi - lo) as i64);
        }
        let (size, pad) = (self.size as i64, self.pad_begin as i64);
        let start = (i * self.step) as i64 - pad;
        let end = (start + self.taps as i64).min(size + pad);
        (end - start, end.min(size) - start.max(0))
    }

    /// How the backward pass reads this axis: input position `h`, tap `k`
    /// reads position `read_off + h*read_h + k*read_k` of a buffer of `len`
    /// holding output `i` at `place_off + i*place_step` (zeros elsewhere).
    /// Regular windows: the taps in reverse (`k = taps-1-tap`), which keeps
    /// every stride positive. Adaptive windows: every output, masked by
    /// `member` (`[size, out]`: the position, -1 when outside window `i`).
    fn back(&self) -> Back {
        if self.regular {
            let reach = (self.taps - 1) * self.dil;
            return Back {
                len: self.size + self.pad_begin + reach,
                place_off: reach,
                place_step: self.step,
                read_off: self.pad_begin,
                read_h: 1,
                read_k: self.dil,
                taps: self.taps,
                member: None,
            };
        }
        let member = (0..self.size)
            .flat_map(|h| (0..self.out).map(move |i| (h, i)))
            .map(|(h, i)| self.table[i * self.size + h])
            .collect();
        Back {
            len: self.out,
            place_off: 0,
            place_step: 1,
            read_off: 0,
            read_h: 0,
            read_k: 1,
            taps: self.out,
            member: Some(member),
        }
    }
}

/// See [`Axis::back`].
struct Back {
    len: usize,
    place_off: usize,
    place_step: usize,
    read_off: usize,
    read_h: usize,
    read_k: usize,
    taps: usize,
    member: Option<Vec<i64>>,
}

/// A view of `t`'s storage (offset relative to `t`'s own).
fn strided(t: &Tensor, dims: &[usize], strides: &[usize], offset: usize) -> Tensor {
    t.with_layout(Layout {
        dims: dims.iter().copied().collect(),
        strides: strides.iter().map(|&s| s as isize).collect(),
        offset: t.offset() + offset,
    })
}

/// Both axes of `geo`'s windows.
fn axes(geo: &Pool2dGeometry, adaptive: bool) -> (Axis, Axis) {
    (Axis::new(geo, adaptive, 0), Axis::new(geo, adaptive, 1))
}

/// `x` (contiguous) as `[planes, Hp, Wp]` with the axes' zero padding.
fn padded(x: &Tensor, planes: usize, ah: &Axis, aw: &Axis) -> Result<Tensor> {
    let x3 = x.reshape_dims(&[planes, ah.size, aw.size])?;
    if ah.padded() == ah.size && aw.padded() == aw.size {
        return Ok(x3);
    }
    let p = Tensor::zeros_on(&[planes, ah.padded(), aw.padded()], x.dtype(), x.device())?;
    let inner =
        p.narrow(1, ah.pad_begin as i64, ah.size)?
            .narrow(2, aw.pad_begin as i64, aw.size)?;
    copy_into(&x3, &inner)?;
    Ok(p)
}

/// The first level's view of `xp` `[P, Hp, Wp]`: the column windows of
/// every padded row, `[P, Hp, OW, KW]`.
fn row_view(xp: &Tensor, aw: &Axis) -> Tensor {
    let d = xp.dims();
    let s: Vec<usize> = xp.strides().iter().map(|&s| s as usize).collect();
    strided(
        xp,
        &[d[0], d[1], aw.out, aw.taps],
        &[s[0], s[1], aw.step * s[2], aw.dil * s[2]],
        0,
    )
}

/// The second level's view of a per-row result `r` `[P, Hp, OW]`: its row
/// windows, `[P, OH, OW, KH]`.
fn col_view(r: &Tensor, ah: &Axis) -> Tensor {
    let (p, hp, ow) = (r.dims()[0], r.dims()[1], r.dims()[2]);
    strided(
        r,
        &[p, ah.out, ow, ah.taps],
        &[hp * ow, ah.step * ow, 1, ah.dil * ow],
        0,
    )
}

/// Max of `v` over the last loop dim where `pos` (an i64 position) is not
/// -1, NaN winning; -inf where there is none.
fn masked_max(name: &str, v: &Tensor, pos: &Tensor, loop_dims: &[usize]) -> Result<Tensor> {
    let dt = v.dtype();
    let mut k = KernelCall::new();
    let x = k.input(v, dt);
    let at = k.input(pos, DType::I64);
    let zero = k.scalar(0.0, DType::I64);
    let valid = k.binary(BinaryOp::Ge, at, zero, DType::I64);
    let ninf = k.scalar(f64::NEG_INFINITY, dt);
    let x = k.select(valid, x, ninf, dt);
    k.reduce(name, ReduceKind::Max, x, loop_dims, dt, |_, acc| vec![acc])
}

/// Where the window max `m` of `v` is, as PyTorch's max pool reports it: the
/// first maximum in window order, or the last NaN when there is one (its
/// update rule is `v > max || isnan(v)`). `place(k)` gives each candidate's
/// flat position, increasing along the window, and whether it is in the
/// input. Taking the minimum of the position (or of minus the position, for
/// the last NaN) over the matching candidates makes it one Min reduction.
fn arg_of_max(
    name: &str,
    v: &Tensor,
    m: &Tensor,
    loop_dims: &[usize],
    place: impl FnOnce(&mut KernelCall) -> Result<(ValueId, ValueId)>,
) -> Result<Tensor> {
    let dt = v.dtype();
    let mut k = KernelCall::new();
    let (valid, pos) = place(&mut k)?;
    let x = k.input(v, dt);
    let mx = k.input(&m.unsqueeze(-1)?, dt);
    let x_nan = k.binary(BinaryOp::Ne, x, x, dt);
    let m_nan = k.binary(BinaryOp::Ne, mx, mx, dt);
    let eq = k.binary(BinaryOp::Eq, x, mx, dt);
    let hit = k.select(m_nan, x_nan, eq, DType::Bool);
    let hit = k.binary(BinaryOp::And, valid, hit, DType::Bool);
    let zero = k.scalar(0.0, DType::I64);
    let neg = k.binary(BinaryOp::Sub, zero, pos, DType::I64);
    let key = k.select(m_nan, neg, pos, DType::I64);
    let none = k.scalar(NOT_A_CANDIDATE as f64, DType::I64);
    let key = k.select(hit, key, none, DType::I64);
    k.reduce(
        name,
        ReduceKind::Min,
        key,
        loop_dims,
        DType::I64,
        |k, acc| {
            let zero = k.scalar(0.0, DType::I64);
            let is_neg = k.binary(BinaryOp::Lt, acc, zero, DType::I64);
            let flipped = k.binary(BinaryOp::Sub, zero, acc, DType::I64);
            vec![k.select(is_neg, flipped, acc, DType::I64)]
        },
    )
}

/// Max pool values and flat `h*W + w` indices, `[planes, OH, OW]` each, of
/// `x` (compute dtype, contiguous): four reductions (value then index, per axis).
pub(super) fn max_pool_kernel(
    geo: &Pool2dGeometry,
    adaptive: bool,
    x: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (ah, aw) = axes(geo, adaptive);
    let (dev, planes) = (x.device(), geo.planes());
    let xp = padded(x, planes, &ah, &aw)?;
    let tw = aw.table_on(dev, &[aw.out, aw.taps])?;
    let th = ah.table_on(dev, &[ah.out, 1, ah.taps])?;
    // per padded row: each column window's max and where it is
    let l1 = [planes, ah.padded(), aw.out, aw.taps];
    let xv = row_view(&xp, &aw);
    let m1 = masked_max("max_pool2d_cols", &xv, &tw, &l1)?;
    let c1 = arg_of_max("max_pool2d_cols_at", &xv, &m1, &l1, |k| {
        let at = k.input(&tw, DType::I64);
        let zero = k.scalar(0.0, DType::I64);
        Ok((k.binary(BinaryOp::Ge, at, zero, DType::I64), at))
    })?;
    // then over each row window
    let l2 = [planes, ah.out, aw.out, ah.taps];
    let (mv, cv) = (col_view(&m1, &ah), col_view(&c1, &ah));
    let m = masked_max("max_pool2d", &mv, &th, &l2)?;
    let w = aw.size as f64;
    let idx = arg_of_max("max_pool2d_at", &mv, &m, &l2, |k| {
        let row = k.input(&th, DType::I64);
        let col = k.input(&cv, DType::I64);
        let zero = k.scalar(0.0, DType::I64);
        let valid = k.binary(BinaryOp::Ge, row, zero, DType::I64);
        let wv = k.scalar(w, DType::I64);
        let flat = k.binary(BinaryOp::Mul, row, wv, DType::I64);
        Ok((valid, k.binary(BinaryOp::Add, flat, col, DType::I64)))
    })?;
    Ok((m, idx))
}

/// Average pool of `x` (compute dtype, contiguous) as `[planes, OH, OW]`:
/// zero padding sums to nothing, so only adaptive windows need their mask;
/// the divisor (count_include_pad, ceil_mode clipping, divisor_override) is
/// a small `[OH, OW]` table read once per output.
pub(super) fn avg_pool_kernel(
    geo: &Pool2dGeometry,
    adaptive: bool,
    count_include_pad: bool,
    divisor_override: Option<i64>,
    x: &Tensor,
) -> Result<Tensor> {
    let (ah, aw) = axes(geo, adaptive);
    let (dev, planes, dt) = (x.device(), geo.planes(), x.dtype());
    let xp = padded(x, planes, &ah, &aw)?;
    let sum =
        |name: &str, v: &Tensor, mask: Option<Tensor>, dims: &[usize], div: Option<&Tensor>| {
            let mut k = KernelCall::new();
            let mut x = k.input(v, dt);
            if let Some(m) = mask {
                let at = k.input(&m, DType::I64);
                let zero = k.scalar(0.0, DType::I64);
                let valid = k.binary(BinaryOp::Ge, at, zero, DType::I64);
                let z = k.scalar(0.0, dt);
                x = k.select(valid, x, z, dt);
            }
            k.reduce(name, ReduceKind::Sum, x, dims, dt, |k, acc| match div {
                Some(d) => {
                    let d = k.input(d, dt);
                    vec![k.binary(BinaryOp::Div, acc, d, dt)]
                }
                None => vec![acc],
            })
        };
    let mask = |a: &Axis, dims: &[usize]| (!a.regular).then(|| a.table_on(dev, dims)).transpose();
    let l1 = [planes, ah.padded(), aw.out, aw.taps];
    let s1 = sum(
        "avg_pool2d_cols",
        &row_view(&xp, &aw),
        mask(&aw, &[aw.out, aw.taps])?,
        &l1,
        None,
    )?;
    let div = divisors(&ah, &aw, count_include_pad, divisor_override);
    let div = Tensor::from_vec(div, &[ah.out, aw.out])?
        .to_dtype(dt)?
        .to_device(dev)?;
    let l2 = [planes, ah.out, aw.out, ah.taps];
    let m = mask(&ah, &[ah.out, 1, ah.taps])?;
    sum("avg_pool2d", &col_view(&s1, &ah), m, &l2, Some(&div))
}

/// `[OH, OW]` divisors of an average pool; 1 for an empty window (its sum is 0,
/// and PyTorch's output there is 0).
fn divisors(ah: &Axis, aw: &Axis, include_pad: bool, divisor_override: Option<i64>) -> Vec<f64> {
    let mut out = Vec::with_capacity(ah.out * aw.out);
    for i in 0..ah.out {
        for j in 0..aw.out {
            let ((hp, hi), (wp, wi)) = (ah.extents(i), aw.extents(j));
            out.push(if hi <= 0 || wi <= 0 {
                1.0
            } else if let Some(d) = divisor_override {
                d as f64
            } else if include_pad {
                (hp * wp) as f64
            } else {
                (hi * wi) as f64
            });
        }
    }
    out
}

/// `src` (`[planes, OH, OW]`, transformed by `f` on the way) written into a
/// zero buffer `[planes, Lh, Lw]` at the positions [`Axis::back`] reads.
fn spread(
    src: &Tensor,
    dt: DType,
    bh: &Back,
    bw: &Back,
    f: impl FnOnce(&mut KernelCall, ValueId) -> Result<ValueId>,
) -> Result<Tensor> {
    let p = src.dims()[0];
    let buf = Tensor::zeros_on(&[p, bh.len, bw.len], dt, src.device())?;
    let place = strided(
        &buf,
        src.dims(),
        &[bh.len * bw.len, bh.place_step * bw.len, bw.place_step],
        bh.place_off * bw.len + bw.place_off,
    );
    let mut k = KernelCall::new();
    let v = k.input(src, dt);
    let v = f(&mut k, v)?;
    k.store_into("pool2d_backward_spread", v, &place)?;
    Ok(buf)
}

/// The input gradient `[planes, H, W]` (compute dtype) of an average pool given
/// its output gradient `g` (`[planes, OH, OW]`, compute dtype).
pub(crate) fn avg_pool_backward_kernel(
    geo: &Pool2dGeometry,
    adaptive: bool,
    count_include_pad: bool,
    divisor_override: Option<i64>,
    g: &Tensor,
) -> Result<Tensor> {
    let (ah, aw) = axes(geo, adaptive);
    let (bh, bw) = (ah.back(), aw.back());
    let (dev, dt, planes) = (g.device(), g.dtype(), geo.planes());
    let div = divisors(&ah, &aw, count_include_pad, divisor_override);
    let div = Tensor::from_vec(div, &[ah.out, aw.out])?
        .to_dtype(dt)?
        .to_device(dev)?;
    let buf = spread(g, dt, &bh, &bw, |k, v| {
        let d = k.input(&div, dt);
        Ok(k.binary(BinaryOp::Div, v, d, dt))
    })?;
    let sum =
        |name: &str, v: &Tensor, member: Option<&Vec<i64>>, mdims: &[usize], dims: &[usize]| {
            let mut k = KernelCall::new();
            let mut x = k.input(v, dt);
            if let Some(m) = member {
                let m = Tensor::from_vec(m.clone(), mdims)?.to_device(dev)?;
                let at = k.input(&m, DType::I64);
                let zero = k.scalar(0.0, DType::I64);
                let valid = k.binary(BinaryOp::Ge, at, zero, DType::I64);
                let z = k.scalar(0.0, dt);
                x = k.select(valid, x, z, dt);
            }
            k.reduce(name, ReduceKind::Sum, x, dims, dt, |_, acc| vec![acc])
        };
    // over the column taps of every buffer row, then over the row taps
    let (h, w) = (ah.size, aw.size);
    let l1 = [planes, bh.len, w, bw.taps];
    let v1 = strided(
        &buf,
        &l1,
        &[bh.len * bw.len, bw.len, bw.read_h, bw.read_k],
        bw.read_off,
    );
    let t = sum(
        "avg_pool2d_backward_cols",
        &v1,
        bw.member.as_ref(),
        &[w, bw.taps],
        &l1,
    )?;
    let l2 = [planes, h, w, bh.taps];
    let v2 = strided(
        &t,
        &l2,
        &[bh.len * w, bh.read_h * w, 1, bh.read_k * w],
        bh.read_off * w,
    );
    sum(
        "avg_pool2d_backward",
        &v2,
        bh.member.as_ref(),
        &[h, 1, bh.taps],
        &l2,
    )
}

/// The input gradient `[planes, H, W]` (compute dtype) of a max pool given its
/// output gradient `g` and indices `idx` (`[planes, OH, OW]`): each input
/// position sums the gradients of the outputs whose index names it.
pub(crate) fn max_pool_backward_kernel(
    geo: &Pool2dGeometry,
    adaptive: bool,
    g: &Tensor,
    idx: &Tensor,
) -> Result<Tensor> {
    let (ah, aw) = axes(geo, adaptive);
    let (bh, bw) = (ah.back(), aw.back());
    let (dev, dt, planes) = (g.device(), g.dtype(), geo.planes());
    let (h, w) = (ah.size, aw.size);
    let gb = spread(g, dt, &bh, &bw, |_, v| Ok(v))?;
    // indices shifted by one, so the buffer's zeros match no position
    let ib = spread(idx, DType::I64, &bh, &bw, |k, v| {
        let one = k.scalar(1.0, DType::I64);
        Ok(k.binary(BinaryOp::Add, v, one, DType::I64))
    })?;
    let flat: Vec<i64> = (1..=(h * w) as i64).collect();
    let flat = Tensor::from_vec(flat, &[h, 1, w, 1])?.to_device(dev)?;
    // the taps of both axes at once: whether a tap holds this position's
    // index couples the row and the column
    let l1 = [planes, h, bh.taps, w, bw.taps];
    let st = [
        bh.len * bw.len,
        bh.read_h * bw.len,
        bh.read_k * bw.len,
        bw.read_h,
        bw.read_k,
    ];
    let off = bh.read_off * bw.len + bw.read_off;
    let (gv, iv) = (strided(&gb, &l1, &st, off), strided(&ib, &l1, &st, off));
    let mut k = KernelCall::new();
    let x = k.input(&gv, dt);
    let at = k.input(&iv, DType::I64);
    let me = k.input(&flat, DType::I64);
    let hit = k.binary(BinaryOp::Eq, at, me, DType::I64);
    let z = k.scalar(0.0, dt);
    let x = k.select(hit, x, z, dt);
    let t = k.reduce(
        "max_pool2d_backward",
        ReduceKind::Sum,
        x,
        &l1,
        dt,
        |_, acc| vec![acc],
    )?;
    t.sum(Some(&[2]), false)
}
