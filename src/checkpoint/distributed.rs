//! Checkpoints in data-parallel runs: every rank holds the same model and
//! optimizer state, so rank 0 alone writes the file while the others wait
//! for it (a failed write is an error on every rank). Each rank's generator
//! differs (`manual_seed_for_rank`), so all of them are kept, as metadata
//! `extra/rng/rank{r}`, and each rank restores its own on resume.

use super::Checkpoint;
use crate::distributed::{self as dist, ReduceOp};
use crate::random::{self, GeneratorState};
use crate::{DType, Error, Result, Tensor};
use std::path::Path;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

fn rng_key(rank: usize) -> String {
    format!("rng/rank{rank}")
}

impl Checkpoint {
    /// Adds every rank's default-generator state (a collective: all ranks call it).
    pub fn capture_rank_rngs(&mut self) -> Result<()> {
        if !dist::is_initialized() {
            return Ok(());
        }
        let mine = random::get_rng_state().to_bytes();
        let t = Tensor::from_vec(mine, &[random::get_rng_state().to_bytes().len()])?;
        for (r, s) in dist::all_gather(&t)?.iter().enumerate() {
            self.extra.insert(rng_key(r), hex(&s.to_vec::<u8>()?));
        }
        Ok(())
    }

    /// Restores this rank's generator: its own state when the checkpoint has
    /// one (written by [`Checkpoint::capture_rank_rngs`]), else the default one.
    pub fn restore_rank_rng(&self, path: impl AsRef<Path>) -> Result<()> {
        let key = rng_key(dist::rank());
        match self.extra.get(&key) {
            None => self.restore_rng(),
            Some(h) => {
                let bad = |m: String| Error::Io {
                    path: path.as_ref().display().to_string(),
                    msg: format!("metadata key `extra/{key}`: {m}"),
                };
                let bytes = unhex(h).ok_or_else(|| bad("not hexadecimal".into()))?;
                random::set_rng_state(
                    &GeneratorState::from_bytes(&bytes).map_err(|e| bad(e.to_string()))?,
                );
            }
        }
        Ok(())
    }

    /// [`Checkpoint::save`] in a data-parallel run: rank 0 writes (atomically),
    /// then every rank learns whether it succeeded (so this is also a
    /// barrier); returns whether this rank wrote. Without a process group it
    /// is `save`.
    pub fn save_distributed(&self, path: impl AsRef<Path>) -> Result<bool> {
        if !dist::is_initialized() {
            self.save(path)?;
            return Ok(true);
        }
        let main = dist::is_main_process();
        let result = if main { self.save(&path) } else { Ok(()) };
        let failed = Tensor::full(&[1], result.is_err() as i64 as f64, DType::I64);
        dist::all_reduce(&failed, ReduceOp::Max)?;
        result?;
        if failed.item()? != 0.0 {
            return Err(Error::Io {
                path: path.as_ref().display().to_string(),
                msg: "rank 0 failed to write the checkpoint".into(),
            });
        }
        Ok(main)
    }
}
