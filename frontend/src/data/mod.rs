//! Data loading, `torch.utils.data` style: the [`Dataset`] trait,
//! [`TensorDataset`], [`Subset`] and [`random_split`], and the [`DataLoader`]
//! (batching, seeded shuffling, collate, worker threads).
//!
//! ```
//! use kiln_frontend::data::{DataLoader, TensorDataset};
//! use kiln_frontend::Tensor;
//! let x = Tensor::from_vec((0..10).map(|i| i as f32).collect(), &[5, 2]).unwrap();
//! let y = Tensor::from_vec(vec![0i64, 1, 0, 1, 1], &[5]).unwrap();
//! let ds = TensorDataset::new(vec![x, y]).unwrap();
//! let mut loader = DataLoader::new(ds, 2).shuffle(true).seed(0);
//! let batches: Vec<_> = loader.iter().collect::<Result<_, _>>().unwrap();
//! assert_eq!(batches.len(), 3);
//! assert_eq!(batches[0][0].dims(), &[2, 2]);
//! assert_eq!(batches[2][1].dims(), &[1]);
//! ```

pub mod digits;
mod loader;
#[cfg(test)]
mod tests;
mod workers;

pub use loader::{default_collate, Batch, Batches, DataLoader, WorkerContext};

use crate::random::{with_generator, Generator};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};
use std::sync::Arc;

/// One example: the tensors of a row (e.g. `[image, label]`).
pub type Sample = Vec<Tensor>;

/// A map-style dataset (`torch.utils.data.Dataset` with `__len__`/`__getitem__`).
///
/// `Send + Sync` so that [`DataLoader`] workers can read it from their threads.
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Sample `i` (`0 <= i < len()`); out of range is an error.
    fn get(&self, i: usize) -> Result<Sample>;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, i: usize) -> Result<Sample> {
        (**self).get(i)
    }
}

impl<D: Dataset + ?Sized> Dataset for Box<D> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, i: usize) -> Result<Sample> {
        (**self).get(i)
    }
}

/// `torch.utils.data.TensorDataset`: sample `i` is row `i` (a view) of each tensor.
#[derive(Clone, Debug)]
pub struct TensorDataset {
    tensors: Vec<Tensor>,
}

impl TensorDataset {
    /// All tensors must have the same, non-zero-rank, size in dim 0.
    pub fn new(tensors: Vec<Tensor>) -> Result<TensorDataset> {
        let Some(first) = tensors.first() else {
            bail!("TensorDataset", "expected at least one tensor");
        };
        for (k, t) in tensors.iter().enumerate() {
            if t.rank() == 0 || t.dims()[0] != first.dims().first().copied().unwrap_or(0) {
                bail!(
                    "TensorDataset",
                    "size mismatch between tensors: tensor {k} has shape {} but tensor 0 has shape {} (dim 0 must match)",
                    fmt_dims(t.dims()),
                    fmt_dims(first.dims())
                );
            }
        }
        Ok(TensorDataset { tensors })
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.tensors[0].dims()[0]
    }
    fn get(&self, i: usize) -> Result<Sample> {
        check_index("TensorDataset", i, self.len())?;
        self.tensors.iter().map(|t| t.select(0, i as i64)).collect()
    }
}

fn check_index(what: &str, i: usize, len: usize) -> Result<()> {
    if i >= len {
        bail!(
            what,
            "index {i} is out of range for a dataset of {len} samples"
        );
    }
    Ok(())
}

/// `torch.utils.data.Subset`: the samples of `dataset` at `indices`.
#[derive(Clone)]
pub struct Subset {
    pub dataset: Arc<dyn Dataset>,
    pub indices: Vec<usize>,
}

impl std::fmt::Debug for Subset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Subset({} of {} samples)",
            self.indices.len(),
            self.dataset.len()
        )
    }
}

impl Subset {
    pub fn new(dataset: Arc<dyn Dataset>, indices: Vec<usize>) -> Result<Subset> {
        let n = dataset.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= n) {
            bail!(
                "Subset",
                "index {bad} is out of range for a dataset of {n} samples"
            );
        }
        Ok(Subset { dataset, indices })
    }
}

impl Dataset for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, i: usize) -> Result<Sample> {
        check_index("Subset", i, self.len())?;
        self.dataset.get(self.indices[i])
    }
}

/// How [`random_split`] sizes its parts.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitLengths {
    /// Exact sizes, summing to the dataset's length.
    Counts(Vec<usize>),
    /// Fractions summing to 1: each part gets `floor(n * f)`, and the remainder
    /// goes one by one to the parts in order (PyTorch's rule).
    Fractions(Vec<f64>),
}

impl From<&[usize]> for SplitLengths {
    fn from(v: &[usize]) -> Self {
        SplitLengths::Counts(v.to_vec())
    }
}
impl<const N: usize> From<[usize; N]> for SplitLengths {
    fn from(v: [usize; N]) -> Self {
        SplitLengths::Counts(v.to_vec())
    }
}
impl From<&[f64]> for SplitLengths {
    fn from(v: &[f64]) -> Self {
        SplitLengths::Fractions(v.to_vec())
    }
}
impl<const N: usize> From<[f64; N]> for SplitLengths {
    fn from(v: [f64; N]) -> Self {
        SplitLengths::Fractions(v.to_vec())
    }
}

impl SplitLengths {
    /// The part sizes for a dataset of `n` samples.
    pub fn counts(&self, n: usize) -> Result<Vec<usize>> {
        match self {
            SplitLengths::Counts(c) => {
                let s: usize = c.iter().sum();
                if s != n {
                    bail!(
                        "random_split",
                        "sum of input lengths {c:?} is {s}, which does not equal the length of the input dataset ({n})"
                    );
                }
                Ok(c.clone())
            }
            SplitLengths::Fractions(f) => {
                let s: f64 = f.iter().sum();
                if (s - 1.0).abs() > 1e-6 || f.iter().any(|x| !(0.0..=1.0).contains(x)) {
                    bail!(
                        "random_split",
                        "fractions {f:?} must each be in [0, 1] and sum to 1 (they sum to {s})"
                    );
                }
                let mut c: Vec<usize> = f.iter().map(|x| (n as f64 * x).floor() as usize).collect();
                let rest = n - c.iter().sum::<usize>();
                let parts = c.len();
                for i in 0..rest {
                    c[i % parts] += 1;
                }
                Ok(c)
            }
        }
    }
}

/// `torch.utils.data.random_split`: disjoint random subsets covering `dataset`,
/// from a permutation drawn from `gen` (the default generator for `None`).
///
/// ```
/// use kiln_frontend::data::{random_split, Dataset, TensorDataset};
/// use kiln_frontend::{random::Generator, Tensor};
/// let ds = TensorDataset::new(vec![Tensor::arange(10, kiln_frontend::DType::F32)]).unwrap();
/// let parts = random_split(ds, [0.8, 0.2], Some(&mut Generator::new(0))).unwrap();
/// assert_eq!((parts[0].len(), parts[1].len()), (8, 2));
/// ```
pub fn random_split<D: Dataset + 'static>(
    dataset: D,
    lengths: impl Into<SplitLengths>,
    gen: Option<&mut Generator>,
) -> Result<Vec<Subset>> {
    let n = dataset.len();
    let counts = lengths.into().counts(n)?;
    let perm = with_generator(gen, |g| g.permutation(n));
    let ds: Arc<dyn Dataset> = Arc::new(dataset);
    let mut at = 0;
    let mut out = Vec::with_capacity(counts.len());
    for c in counts {
        out.push(Subset {
            dataset: ds.clone(),
            indices: perm[at..at + c].to_vec(),
        });
        at += c;
    }
    Ok(out)
}
