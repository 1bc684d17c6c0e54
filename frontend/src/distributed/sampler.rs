//! `DistributedSampler`: each rank's share of a dataset, PyTorch's
//! algorithm — one permutation per epoch from `seed + epoch` (the same on
//! every rank), padded by repeating its start up to a multiple of the world
//! size (or cut down to one with `drop_last`), and rank `r` taking
//! positions `r, r + world, r + 2 world, ...`. So the shards are disjoint,
//! equally long, and together cover the dataset; batch `k` of every rank
//! together are the samples `k*B*world .. (k+1)*B*world` of the epoch's
//! order — what one process with batch `B*world` would see.

use crate::data::{DataLoader, Dataset, Subset};
use crate::random::Generator;
use kiln_ir::{Error, Result};
use std::sync::Arc;

/// The indices one rank loads in each epoch.
///
/// ```
/// use kiln_frontend::distributed::DistributedSampler;
/// let s0 = DistributedSampler::with_replicas(10, 3, 0).unwrap().shuffle(false);
/// let s2 = DistributedSampler::with_replicas(10, 3, 2).unwrap().shuffle(false);
/// assert_eq!(s0.indices(), vec![0, 3, 6, 9]);
/// assert_eq!(s2.indices(), vec![2, 5, 8, 1]); // padded with the first index
/// ```
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
}

impl DistributedSampler {
    /// A sampler for the default group's rank and size (rank 0 of 1 without one).
    pub fn new(dataset_len: usize) -> DistributedSampler {
        DistributedSampler::with_replicas(dataset_len, super::world_size(), super::rank())
            .expect("the default group's rank is below its size")
    }

    /// A sampler for rank `rank` of `num_replicas`.
    pub fn with_replicas(
        dataset_len: usize,
        num_replicas: usize,
        rank: usize,
    ) -> Result<DistributedSampler> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(Error::op(
                "DistributedSampler",
                format!("invalid rank {rank}: it must be below num_replicas ({num_replicas})"),
            ));
        }
        Ok(DistributedSampler {
            len: dataset_len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
        })
    }

    /// Reshuffle every epoch (default true).
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }
    /// The seed every rank must share (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Drop the tail that does not divide evenly instead of padding.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }
    /// `sampler.set_epoch(e)`: call before each epoch, or every epoch repeats the order.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Samples per rank (`len(sampler)`).
    pub fn len(&self) -> usize {
        let (n, w) = (self.len, self.num_replicas);
        if self.drop_last {
            n / w // PyTorch's ceil((n - w) / w) when w does not divide n
        } else {
            n.div_ceil(w)
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This rank's indices for the current epoch.
    pub fn indices(&self) -> Vec<usize> {
        let n = self.len;
        let mut order: Vec<usize> = if self.shuffle {
            Generator::new(self.seed.wrapping_add(self.epoch)).permutation(n)
        } else {
            (0..n).collect()
        };
        let total = self.len() * self.num_replicas;
        if !self.drop_last {
            let mut k = 0;
            while order.len() < total && n > 0 {
                order.push(order[k % n]);
                k += 1;
            }
        } else {
            order.truncate(total);
        }
        order
            .into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }

    /// A loader over this rank's shard of `dataset` for the current epoch
    /// (in the sampler's order), `batch_size` samples per batch.
    pub fn loader(&self, dataset: Arc<dyn Dataset>, batch_size: usize) -> Result<DataLoader> {
        if dataset.len() != self.len {
            return Err(Error::op(
                "DistributedSampler",
                format!(
                    "the sampler was made for {} samples but the dataset has {}",
                    self.len,
                    dataset.len()
                ),
            ));
        }
        Ok(DataLoader::new(
            Subset::new(dataset, self.indices())?,
            batch_size,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_cover_and_reshuffle() {
        for (n, w) in [(10usize, 3usize), (12, 4), (7, 2), (1438, 2), (2, 3)] {
            let shards: Vec<Vec<usize>> = (0..w)
                .map(|r| {
                    let mut s = DistributedSampler::with_replicas(n, w, r).unwrap().seed(5);
                    s.set_epoch(1);
                    s.indices()
                })
                .collect();
            let per = n.div_ceil(w);
            assert!(shards.iter().all(|s| s.len() == per), "n {n} w {w}");
            let mut all: Vec<usize> = shards.concat();
            all.sort();
            let mut uniq = all.clone();
            uniq.dedup();
            assert_eq!(uniq, (0..n).collect::<Vec<_>>(), "cover n {n} w {w}");
            assert_eq!(
                all.len() - uniq.len(),
                per * w - n,
                "only the padding repeats"
            );
        }
        // drop_last: equal shards, no repeats, the tail dropped
        let shards: Vec<Vec<usize>> = (0..3)
            .map(|r| {
                DistributedSampler::with_replicas(10, 3, r)
                    .unwrap()
                    .drop_last(true)
                    .indices()
            })
            .collect();
        assert!(shards.iter().all(|s| s.len() == 3));
        let mut all = shards.concat();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 9);
        let mut s = DistributedSampler::with_replicas(100, 2, 0).unwrap();
        let e0 = s.indices();
        s.set_epoch(1);
        assert_ne!(e0, s.indices(), "set_epoch reshuffles");
        s.set_epoch(0);
        assert_eq!(e0, s.indices(), "and repeats per epoch");
        let e = DistributedSampler::with_replicas(4, 2, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid rank 2"), "{e}");
    }
}
