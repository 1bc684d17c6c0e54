//! `nn.EmbeddingBag`: sums, means or maxima of bags of embeddings without
//! materialising per-bag Python lists.
//!
//! A bag's members are found with tensor ops (a (bags, L) membership mask
//! built from `offsets` by comparisons), so nothing reads index values on
//! the host: the same code runs eagerly and under `compile`, and the
//! gradient reaches `weight` (and `per_sample_weights`) through
//! `embedding`, `matmul` and `amax`.

use super::layers::param;
use super::{Entry, EntryMut, Module};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};

/// How a bag's embeddings are reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BagMode {
    Sum,
    Mean,
    Max,
}

impl BagMode {
    pub fn from_name(name: &str) -> Result<BagMode> {
        Ok(match name {
            "sum" => BagMode::Sum,
            "mean" => BagMode::Mean,
            "max" => BagMode::Max,
            other => bail!(
                "EmbeddingBag",
                "mode must be 'sum', 'mean' or 'max', got '{other}'"
            ),
        })
    }
    fn name(self) -> &'static str {
        match self {
            BagMode::Sum => "sum",
            BagMode::Mean => "mean",
            BagMode::Max => "max",
        }
    }
}

/// `nn.EmbeddingBag(num_embeddings, embedding_dim, mode=...,
/// include_last_offset=..., padding_idx=...)`; weight ~ N(0, 1).
/// An empty bag gives zeros; `padding_idx` entries are left out of their
/// bag (and of a mean's count).
///
/// ```
/// use kiln_frontend::nn::{BagMode, EmbeddingBag};
/// use kiln_frontend::Tensor;
/// let bag = EmbeddingBag::new(10, 3, BagMode::Mean).unwrap();
/// let input = Tensor::from_vec(vec![1i64, 2, 4, 5], &[4]).unwrap();
/// let offsets = Tensor::from_vec(vec![0i64, 1, 1], &[3]).unwrap();
/// let y = bag.forward_bag(&input, Some(&offsets), None).unwrap();
/// assert_eq!(y.dims(), &[3, 3]); // bag 1 is empty: zeros
/// ```
pub struct EmbeddingBag {
    pub weight: Tensor,
    pub mode: BagMode,
    pub include_last_offset: bool,
    pub padding_idx: Option<i64>,
}

impl EmbeddingBag {
    pub fn new(num_embeddings: usize, embedding_dim: usize, mode: BagMode) -> Result<EmbeddingBag> {
        let weight = param(&[num_embeddings, embedding_dim]);
        super::init::normal_(&weight, 0.0, 1.0)?;
        Ok(EmbeddingBag {
            weight,
            mode,
            include_last_offset: false,
            padding_idx: None,
        })
    }

    /// `bag(input, offsets, per_sample_weights)`: a 1-D `input` with
    /// `offsets` (each bag's start), or a 2-D `input` whose rows are bags.
    pub fn forward_bag(
        &self,
        input: &Tensor,
        offsets: Option<&Tensor>,
        per_sample_weights: Option<&Tensor>,
    ) -> Result<Tensor> {
        if input.dtype().is_float() || input.dtype() == DType::Bool {
            bail!(
                "EmbeddingBag",
                "input must hold integer indices, got {}",
                input.dtype()
            );
        }
        let (flat, offsets) = match (input.rank(), offsets) {
            (1, Some(o)) if o.rank() == 1 && !o.dtype().is_float() => (input.clone(), o.clone()),
            (2, None) => {
                let (b, l) = (input.dims()[0], input.dims()[1]);
                let starts: Vec<i64> = (0..b).map(|i| (i * l) as i64).collect();
                (
                    input.reshape_dims(&[b * l])?,
                    Tensor::from_vec(starts, &[b])?,
                )
            }
            (r, o) => {
                bail!(
                "EmbeddingBag",
                "expected a 1-D input with 1-D integer offsets or a 2-D input without offsets, \
                 got input {} and offsets {}",
                if r == 0 { "0-D".into() } else { fmt_dims(input.dims()) },
                o.map(|o| format!("{} {}", o.dtype(), fmt_dims(o.dims())))
                    .unwrap_or("None".into())
            )
            }
        };
        let psw = match per_sample_weights {
            None => None,
            Some(_) if self.mode != BagMode::Sum => bail!(
                "EmbeddingBag",
                "per_sample_weights is only supported for mode='sum', got mode='{}'",
                self.mode.name()
            ),
            Some(w) if w.dims() != input.dims() => bail!(
                "EmbeddingBag",
                "per_sample_weights {} must have the input's shape {}",
                fmt_dims(w.dims()),
                fmt_dims(input.dims())
            ),
            Some(w) => Some(w.reshape_dims(&[flat.numel()])?),
        };
        let member = self.membership(&flat, &offsets)?;
        let emb = F::embedding(&flat, &self.weight, self.padding_idx)?;
        let emb = match psw {
            Some(w) => emb.mul(&w.unsqueeze(1)?)?,
            None => emb,
        };
        self.reduce(&emb, &member)
    }

    /// The (bags, L) mask: position j belongs to bag b when
    /// offsets[b] <= j < offsets[b + 1] (the last bag runs to L), and is not
    /// `padding_idx`.
    fn membership(&self, flat: &Tensor, offsets: &Tensor) -> Result<Tensor> {
        let l = flat.numel();
        let offsets = offsets.to_dtype(DType::I64)?;
        let n_off = offsets.numel();
        let bags = if self.include_last_offset {
            n_off.saturating_sub(1)
        } else {
            n_off
        };
        if bags == 0 {
            bail!(
                "EmbeddingBag",
                "offsets {} give no bag",
                fmt_dims(offsets.dims())
            );
        }
        let starts = offsets.narrow(0, 0, bags)?;
        let ends = match self.include_last_offset {
            true => offsets.narrow(0, 1, bags)?,
            false => {
                let total = Tensor::from_vec(vec![l as i64], &[1])?;
                Tensor::cat(&[&offsets.narrow(0, 1, bags - 1)?, &total], 0)?
            }
        };
        let pos = Tensor::arange(l, DType::I64).unsqueeze(0)?;
        let inside = pos
            .ge(&starts.unsqueeze(1)?)?
            .logical_and(&pos.lt(&ends.unsqueeze(1)?)?)?;
        match self.padding_idx {
            None => Ok(inside),
            Some(p) => {
                let p = if p < 0 {
                    p + self.weight.dims()[0] as i64
                } else {
                    p
                };
                let keep = flat.to_dtype(DType::I64)?.ne(&Tensor::scalar(p))?;
                inside.logical_and(&keep.unsqueeze(0)?)
            }
        }
    }

    fn reduce(&self, emb: &Tensor, member: &Tensor) -> Result<Tensor> {
        let m = member.to_dtype(emb.dtype())?;
        let count = m.sum(Some(&[1]), true)?;
        match self.mode {
            BagMode::Sum => F::matmul(&m, emb),
            BagMode::Mean => F::matmul(&m, emb)?.div(&count.clamp_min(1.0)?),
            BagMode::Max => {
                let d = emb.dims()[1];
                let (bags, l) = (member.dims()[0], member.dims()[1]);
                let mask = member.unsqueeze(2)?.expand_to(&[bags, l, d])?;
                let none = Tensor::full(&[], f64::NEG_INFINITY, emb.dtype());
                let vals =
                    Tensor::where_(&mask, &emb.unsqueeze(0)?.expand_to(&[bags, l, d])?, &none)?;
                let max = vals.amax(Some(&[1]), false)?;
                let empty = count.le(&Tensor::zeros(&[], emb.dtype()))?;
                Tensor::where_(&empty, &Tensor::zeros(&[], emb.dtype()), &max)
            }
        }
    }
}

impl Module for EmbeddingBag {
    /// A 2-D input, each row one bag.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| self.forward_bag(x, None, None))
    }
    /// `[input, offsets, per_sample_weights]` to `[output]`.
    fn forward_many(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        match inputs {
            [Some(x), rest @ ..] if rest.len() <= 2 => {
                let get = |i: usize| rest.get(i).copied().flatten();
                Ok(vec![self.forward_bag(x, get(0), get(1))?])
            }
            _ => bail!(
                "EmbeddingBag",
                "forward_many takes [input, offsets, per_sample_weights], got {} inputs",
                inputs.len()
            ),
        }
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Param("weight", &self.weight))
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Param("weight", &mut self.weight))
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        let mut s = format!(
            "EmbeddingBag({}, {}, mode='{}'",
            d[0],
            d[1],
            self.mode.name()
        );
        if let Some(p) = self.padding_idx {
            s += &format!(", padding_idx={p}");
        }
        s + ")"
    }
}
