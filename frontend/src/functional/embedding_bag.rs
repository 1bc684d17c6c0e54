//! `F.embedding_bag` as graph ops: the rows of every index (`embedding`),
//! optionally scaled by `per_sample_weights`, then each bag reduced through
//! a membership matrix `M[bag, i] = offsets[bag] <= i < end[bag]` (and the
//! index is not `padding_idx`) compared from the offsets tensor, so the
//! offsets' values never leave the graph: sum and mean are one matmul by
//! M, max a masked `amax`. An empty bag gives zeros in every mode.

use super::{embedding, matmul};
use crate::ops::view_more::index_on;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, Result};

/// `mode=` of `F.embedding_bag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BagMode {
    Sum,
    Mean,
    Max,
}

impl BagMode {
    /// PyTorch's spelling (`sum`, `mean`, `max`).
    pub fn parse(s: &str) -> Result<BagMode> {
        match s {
            "sum" => Ok(BagMode::Sum),
            "mean" => Ok(BagMode::Mean),
            "max" => Ok(BagMode::Max),
            _ => bail!(
                "embedding_bag",
                "mode has to be one of sum, mean or max, got '{s}'"
            ),
        }
    }
}

/// The keyword arguments of `F.embedding_bag` past the tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BagOpts {
    pub mode: BagMode,
    pub include_last_offset: bool,
    pub padding_idx: Option<i64>,
}

/// `F.embedding_bag(input, weight, offsets, mode, per_sample_weights,
/// include_last_offset, padding_idx)`: 1-D `input` with `offsets` (bag
/// starts), or 2-D `input` (one bag per row, no offsets).
///
/// ```
/// use kiln_frontend::functional::{self as F, BagMode, BagOpts};
/// use kiln_frontend::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3, 1]).unwrap();
/// let i = Tensor::from_vec(vec![0i64, 1, 2], &[3]).unwrap();
/// let off = Tensor::from_vec(vec![0i64, 2], &[2]).unwrap();
/// let o = BagOpts { mode: BagMode::Sum, include_last_offset: false, padding_idx: None };
/// let y = F::embedding_bag(&i, &w, Some(&off), None, o).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![3.0, 3.0]);
/// ```
pub fn embedding_bag(
    input: &Tensor,
    weight: &Tensor,
    offsets: Option<&Tensor>,
    per_sample_weights: Option<&Tensor>,
    o: BagOpts,
) -> Result<Tensor> {
    let op = "embedding_bag";
    if weight.rank() != 2 {
        bail!(op, "weight must be 2-D, got {}", fmt_dims(weight.dims()));
    }
    if per_sample_weights.is_some() && o.mode != BagMode::Sum {
        bail!(op, "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for mode='sum' (got mode='{:?}')", o.mode);
    }
    if let Some(p) = per_sample_weights {
        if p.dims() != input.dims() {
            bail!(
                op,
                "per_sample_weights {} must match input {}",
                fmt_dims(p.dims()),
                fmt_dims(input.dims())
            );
        }
    }
    match (input.rank(), offsets) {
        (2, None) => fixed_bags(input, weight, per_sample_weights, o),
        (1, Some(off)) if off.rank() == 1 => offset_bags(input, weight, off, per_sample_weights, o),
        _ => bail!(
            op,
            "expected 2-D input without offsets or 1-D input with 1-D offsets, got input {} and offsets {}",
            fmt_dims(input.dims()),
            offsets.map_or("None".into(), |t| fmt_dims(t.dims()))
        ),
    }
}

/// Whether each index is not `padding_idx` (negative counts from the end).
fn not_padding(idx: &Tensor, rows: usize, padding_idx: Option<i64>) -> Result<Option<Tensor>> {
    padding_idx
        .map(|p| {
            let p = if p < 0 { p + rows as i64 } else { p };
            idx.binary_scalar(BinaryOp::Ne, p, false)
        })
        .transpose()
}

/// The bags' reduction of `rows` `(.., n, D)` over dim `dim` where `member`
/// (broadcast to rows, bool) holds; an empty bag gives zeros.
fn reduce_bags(rows: &Tensor, member: &Tensor, dim: i64, mode: BagMode) -> Result<Tensor> {
    match mode {
        BagMode::Sum | BagMode::Mean => {
            let m = member.to_dtype(rows.dtype())?;
            let s = rows.mul(&m)?.sum(Some(&[dim]), false)?;
            if mode == BagMode::Sum {
                return Ok(s);
            }
            s.div(&m.sum(Some(&[dim]), false)?.clamp_min(1.0)?)
        }
        BagMode::Max => {
            let masked = Tensor::where_scalar(member, rows, f64::NEG_INFINITY)?;
            let empty = member.any(Some(&[dim]), false)?.logical_not()?;
            masked.amax(Some(&[dim]), false)?.masked_fill(&empty, 0.0)
        }
    }
}

/// 2-D input: each row one bag.
fn fixed_bags(input: &Tensor, weight: &Tensor, psw: Option<&Tensor>, o: BagOpts) -> Result<Tensor> {
    let mut rows = embedding(input, weight, None)?;
    if let Some(p) = psw {
        rows = rows.mul(&p.unsqueeze(2)?)?;
    }
    match not_padding(input, weight.dims()[0], o.padding_idx)? {
        Some(keep) => reduce_bags(&rows, &keep.unsqueeze(2)?, 1, o.mode),
        None => match o.mode {
            BagMode::Sum => rows.sum(Some(&[1]), false),
            BagMode::Mean => rows.mean(Some(&[1]), false),
            BagMode::Max => rows.amax(Some(&[1]), false),
        },
    }
}

/// 1-D input with bag starts `offsets`.
fn offset_bags(
    input: &Tensor,
    weight: &Tensor,
    off: &Tensor,
    psw: Option<&Tensor>,
    o: BagOpts,
) -> Result<Tensor> {
    let n = input.dims()[0];
    let off = off.to_dtype(DType::I64)?;
    let k = off.dims()[0];
    let (starts, ends) = if o.include_last_offset {
        if k == 0 {
            bail!(
                "embedding_bag",
                "include_last_offset needs at least one offset"
            );
        }
        (off.narrow(0, 0, k - 1)?, off.narrow(0, 1, k - 1)?)
    } else {
        // the last bag ends at the number of indices
        let last = index_on(input, vec![n as i64])?;
        let next = off.narrow(0, 1, k.saturating_sub(1))?;
        (off.clone(), Tensor::cat(&[&next, &last], 0)?)
    };
    let pos = index_on(input, (0..n as i64).collect())?.unsqueeze(0)?;
    let mut member = pos
        .ge(&starts.unsqueeze(1)?)?
        .binary(BinaryOp::And, &pos.lt(&ends.unsqueeze(1)?)?)?;
    if let Some(keep) = not_padding(input, weight.dims()[0], o.padding_idx)? {
        member = member.binary(BinaryOp::And, &keep.unsqueeze(0)?)?;
    }
    let mut rows = embedding(input, weight, None)?;
    if let Some(p) = psw {
        rows = rows.mul(&p.unsqueeze(1)?)?;
    }
    if o.mode == BagMode::Max {
        return reduce_bags(&rows.unsqueeze(0)?, &member.unsqueeze(2)?, 1, o.mode);
    }
    // sum and mean as one matmul by the membership matrix
    let m = member.to_dtype(weight.dtype())?;
    let s = matmul(&m, &rows)?;
    if o.mode == BagMode::Sum {
        return Ok(s);
    }
    s.div(&m.sum(Some(&[1]), true)?.clamp_min(1.0)?)
}
