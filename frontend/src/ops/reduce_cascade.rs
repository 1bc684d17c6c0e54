//! Accurate float sums: a reduced row longer than [`CASCADE_MIN`] is summed
//! as a cascade of blocks. Each block of [`BLOCK`] elements is one row of the ordinary
//! reduction kernel (PyTorch's order: 4 vector accumulators), giving one
//! partial per block; the partials are summed the same way, level after
//! level, until one row of at most [`BLOCK`] is left, which the final kernel
//! reduces with the caller's epilogue (the mean's scale, ...). The rounding
//! error then grows with log(n) instead of n: a sum of 20M f32 values of
//! 0.1 is off by about 1e-7 relative instead of 0.6%. The block partials
//! also give a full reduction a kept dim, so its blocks run on every thread.

use super::kernel::KernelCall;
use super::reduce::{reduce_one, to_reduce_layout};
use crate::Tensor;
use kiln_ir::op::Meta;
use kiln_ir::{DType, ReduceKind, Result};

/// Elements summed by one kernel row before its partial is taken: 16 per
/// accumulator lane of PyTorch's 4 x 8 f32 lanes, so no lane adds more than
/// 16 values at any level (a longer lane's rounding piles up when the
/// values are alike).
pub(crate) const BLOCK: usize = 512;

/// Rows up to this length stay one kernel (PyTorch's order, bit for bit).
pub(crate) const CASCADE_MIN: usize = 8192;

/// Whether a reduction of `n` elements per output goes through the cascade
/// (`KILN_SUM_CASCADE=0` turns it off, for benchmarking against one row).
pub(crate) fn applies(kind: ReduceKind, out_dtype: DType, n: usize) -> bool {
    kind == ReduceKind::Sum
        && out_dtype.is_float()
        && n > CASCADE_MIN
        && std::env::var_os("KILN_SUM_CASCADE").is_none_or(|v| v != "0")
}

/// The cascade: `leaves` and `body` as in `reduce_kernel`, reduced over
/// `rd` (`kept` the other dims); the result has `value`'s dims without the
/// reduced ones (the caller reshapes for keepdim) and `epilogue` runs once
/// on the total.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cascade_sum(
    name: &str,
    value: &Meta,
    leaves: &[Tensor],
    kept: &[usize],
    rd: &[usize],
    out_dtype: DType,
    body: &mut dyn FnMut(&mut KernelCall, &[usize]) -> usize,
    epilogue: impl FnOnce(&mut KernelCall, usize, usize) -> Vec<usize>,
) -> Result<Tensor> {
    let n: usize = rd.iter().map(|&d| value.dims[d]).product();
    let kept_dims: Vec<usize> = kept.iter().map(|&d| value.dims[d]).collect();
    // the partials keep the accumulator's precision (f32 for f16/bf16)
    let acc = out_dtype.compute();
    let laid: Vec<Tensor> = leaves
        .iter()
        .map(|t| to_reduce_layout(&t.detach().expand_to(&value.dims)?, kept, rd))
        .collect::<Result<_>>()?;
    let mut partials = block_level(name, value.dtype, &laid, &kept_dims, n, acc, body)?;
    while partials.dims()[kept_dims.len()] > BLOCK {
        let len = partials.dims()[kept_dims.len()];
        let mut load = |_: &mut KernelCall, v: &[usize]| v[0];
        partials = block_level(name, acc, &[partials], &kept_dims, len, acc, &mut load)?;
    }
    let pm = partials.meta();
    let last = [kept_dims.len() as i64];
    reduce_one(
        name,
        ReduceKind::Sum,
        &pm,
        std::slice::from_ref(&partials),
        Some(&last),
        false,
        out_dtype,
        |_, v| v[0],
        |k, a, _| epilogue(k, a, n),
    )
}

/// One level: `leaves` (laid out `kept ++ [len]`) cut into rows of
/// [`BLOCK`] plus a shorter last one, each summed to one partial:
/// `kept ++ [ceil(len / BLOCK)]` values of `acc`.
fn block_level(
    name: &str,
    dtype: DType,
    leaves: &[Tensor],
    kept: &[usize],
    len: usize,
    acc: DType,
    body: &mut dyn FnMut(&mut KernelCall, &[usize]) -> usize,
) -> Result<Tensor> {
    let (blocks, tail) = (len / BLOCK, len % BLOCK);
    let last = kept.len() as i64;
    let mut parts = vec![];
    if blocks > 0 {
        let mut dims: Vec<i64> = kept.iter().map(|&d| d as i64).collect();
        dims.extend([blocks as i64, BLOCK as i64]);
        let split: Vec<Tensor> = leaves
            .iter()
            .map(|t| t.narrow(last, 0, blocks * BLOCK)?.reshape(&dims))
            .collect::<Result<_>>()?;
        let m = Meta {
            dtype,
            dims: split[0].dims().into(),
        };
        let rows = [last + 1];
        parts.push(reduce_one(
            name,
            ReduceKind::Sum,
            &m,
            &split,
            Some(&rows),
            false,
            acc,
            &mut *body,
            |_, a, _| vec![a],
        )?);
    }
    if tail > 0 {
        let rest: Vec<Tensor> = leaves
            .iter()
            .map(|t| t.narrow(last, (blocks * BLOCK) as i64, tail))
            .collect::<Result<_>>()?;
        let m = Meta {
            dtype,
            dims: rest[0].dims().into(),
        };
        parts.push(reduce_one(
            name,
            ReduceKind::Sum,
            &m,
            &rest,
            Some(&[last]),
            true,
            acc,
            &mut *body,
            |_, a, _| vec![a],
        )?);
    }
    match parts.as_slice() {
        [one] => Ok(one.clone()),
        _ => Tensor::cat(&parts.iter().collect::<Vec<_>>(), last),
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Tensor};

    /// The f32 sum of n copies of 0.1, against the f64 sum of the same
    /// f32 values, as a relative error.
    fn rel_error(n: usize) -> f64 {
        let x = Tensor::full(&[n], 0.1, DType::F32);
        let got = x.sum(None, false).unwrap().item().unwrap();
        let want = n as f64 * (0.1f32 as f64);
        ((got - want) / want).abs()
    }

    #[test]
    fn long_sums_stay_accurate() {
        // 1M in CI; KILN_SUM_ERROR_SIZES=1000000,20000000,100000000 for the full table
        let sizes: Vec<usize> = std::env::var("KILN_SUM_ERROR_SIZES")
            .ok()
            .map(|s| s.split(',').filter_map(|v| v.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![1_000_000]);
        for n in sizes {
            let e = rel_error(n);
            println!("f32 sum error at {n}: {e:.3e} (relative to the f64 sum)");
            assert!(e < 1e-6, "sum of {n} x 0.1: relative error {e:e}");
        }
    }

    #[test]
    fn mean_and_row_sums_and_halves_use_it_too() {
        let n = super::CASCADE_MIN + 3 * super::BLOCK + 17;
        let x = Tensor::full(&[2, n], 0.1, DType::F32);
        let m = x.mean(Some(&[1]), false).unwrap().to_f64_vec();
        for v in m {
            assert!((v - 0.1f32 as f64).abs() < 1e-7, "{v}");
        }
        let s = x.sum(Some(&[1]), true).unwrap();
        assert_eq!(s.dims(), &[2, 1]);
        let h = Tensor::full(&[n], 1.0, DType::F16)
            .sum(None, false)
            .unwrap();
        assert_eq!(h.dtype(), DType::F16);
        assert_eq!(h.item().unwrap(), half::f16::from_f64(n as f64).to_f64());
    }
}
