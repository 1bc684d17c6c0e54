//! Builders the bad-input table shares: small tensors, files, datasets.

use kiln::data::{DataLoader, TensorDataset};
use kiln::functional as F;
use kiln::{ClassLossOpts, Error, Tensor};
use std::path::PathBuf;

pub fn t(v: Vec<f32>, d: &[usize]) -> Tensor {
    Tensor::from_vec(v, d).unwrap()
}
pub fn ti(v: Vec<i64>, d: &[usize]) -> Tensor {
    Tensor::from_vec(v, d).unwrap()
}
pub fn x23() -> Tensor {
    t(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])
}
pub fn ok<T>(r: kiln::Result<T>) -> kiln::Result<()> {
    r.map(|_| ())
}

pub fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A safetensors file with this JSON header and `data` bytes after it.
pub fn st_file(name: &str, header: &str, data: usize) -> PathBuf {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(1u8, data));
    let p = dir().join(name);
    std::fs::write(&p, b).unwrap();
    p
}

pub fn saved(name: &str) -> PathBuf {
    let p = dir().join(name);
    kiln::serialize::save(&p, &[("w".into(), x23())]).unwrap();
    p
}

pub fn ds(n: usize) -> TensorDataset {
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    TensorDataset::new(vec![t(x, &[n, 1]), ti((0..n as i64).collect(), &[n])]).unwrap()
}

/// A loader over 10 samples in batches of 3 whose transform fails on sample 4.
pub fn failing_loader(workers: usize) -> kiln::Result<()> {
    let mut l = DataLoader::new(ds(10), 3)
        .num_workers(workers)
        .transform(|s, _| {
            if s[1].item()? as i64 == 4 {
                return Err(Error::op("augment", "sample is bad"));
            }
            Ok(s)
        });
    for b in l.iter() {
        b?;
    }
    Ok(())
}

/// A dataset whose sample 7 cannot be read.
pub struct Failing;

impl kiln::data::Dataset for Failing {
    fn len(&self) -> usize {
        10
    }
    fn get(&self, i: usize) -> kiln::Result<Vec<Tensor>> {
        if i == 7 {
            return Err(Error::Io {
                path: "shard-3.bin".into(),
                msg: "disk gone".into(),
            });
        }
        Ok(vec![Tensor::scalar(i as f32)])
    }
}

pub fn ce(x: &Tensor, tg: &Tensor, ignore_index: i64) -> kiln::Result<()> {
    let o = ClassLossOpts {
        ignore_index,
        ..Default::default()
    };
    ok(F::cross_entropy(x, tg, None, o))
}

pub const PARTIAL: &str =
    "some elements of the input tensor and the written-to tensor refer to a single memory location";
pub const INTERNAL: &str =
    "more than one element of the written-to tensor refers to a single memory location";
