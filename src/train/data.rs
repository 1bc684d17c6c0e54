//! The digits dataset as `kiln train` uses it: where the file is, and the
//! seeded 80/20 split normalised with the training split's statistics.

use super::*;

/// `data/digits.safetensors` in the current folder if it is there, else the
/// copy in this crate's folder.
pub fn default_data_path() -> PathBuf {
    let here = Path::new("data/digits.safetensors");
    if here.exists() {
        here.to_path_buf()
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.safetensors")
    }
}

/// The normalised train and test splits.
pub struct Splits {
    pub train: (Tensor, Tensor),
    pub test: (Tensor, Tensor),
    pub mean: f64,
    pub std: f64,
}

/// Loads the digits, splits 80/20 with `Generator::new(seed)` and normalises
/// with the training split's pixel mean and std.
pub fn load_splits(path: &Path, seed: u64, limit: Option<usize>) -> Result<Splits> {
    let (mut x, mut y) = digits::load_digits(path)?;
    if let Some(n) = limit {
        let n = n.min(x.dims()[0]);
        x = x.narrow(0, 0, n)?;
        y = y.narrow(0, 0, n)?;
    }
    let ds = TensorDataset::new(vec![x.clone(), y.clone()])?;
    let parts = random_split(ds, [0.8, 0.2], Some(&mut Generator::new(seed)))?;
    let pick = |idx: &[usize]| -> Result<(Tensor, Tensor)> {
        let i = Tensor::from_vec(idx.iter().map(|&i| i as i64).collect(), &[idx.len()])?;
        Ok((x.index_select(0, &i)?, y.index_select(0, &i)?))
    };
    let (xtr, ytr) = pick(&parts[0].indices)?;
    let (xte, yte) = pick(&parts[1].indices)?;
    let px = xtr.to_f64_vec();
    let n = px.len().max(1) as f64;
    let mean = px.iter().sum::<f64>() / n;
    let std = (px.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n)
        .sqrt()
        .max(1e-6);
    let norm = |t: &Tensor| -> Result<Tensor> {
        t.sub(&Tensor::scalar(mean as f32))?
            .div(&Tensor::scalar(std as f32))
    };
    Ok(Splits {
        train: (norm(&xtr)?, ytr),
        test: (norm(&xte)?, yte),
        mean,
        std,
    })
}
