//! The digits dataset shipped in `data/digits.safetensors` (UCI optical
//! recognition of handwritten digits, as bundled with scikit-learn; see
//! `data/README.md`): 1797 images of 8x8 pixels valued 0..16, labels 0..9.

use super::TensorDataset;
use crate::serialize;
use crate::Tensor;
use kiln_ir::{DType, Error, Result};
use std::path::Path;

/// Where the copy shipped with the project is (resolved at build time from
/// this crate's folder).
pub fn default_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/digits.safetensors")
}

/// Loads the digits: images `[N, 1, 8, 8]` f32 scaled by 1/16 into `[0, 1]`
/// (as the README says), labels `[N]` i64 in `0..10`.
pub fn load_digits(path: impl AsRef<Path>) -> Result<(Tensor, Tensor)> {
    let path = path.as_ref();
    let mut f = serialize::open(path)?;
    let images = f.get("images")?;
    let n = images.dims().first().copied().unwrap_or(0);
    let images = f.take_checked("images", &[n, 8, 8], DType::U8)?;
    let labels = f.take_checked("labels", &[n], DType::U8)?;
    let bad = |msg: String| Error::Io {
        path: path.display().to_string(),
        msg,
    };
    if let Some(v) = images.to_vec::<u8>()?.into_iter().find(|&v| v > 16) {
        return Err(bad(format!(
            "key `images`: pixel value {v} is outside 0..16"
        )));
    }
    if let Some(v) = labels.to_vec::<u8>()?.into_iter().find(|&v| v > 9) {
        return Err(bad(format!("key `labels`: label {v} is outside 0..9")));
    }
    let images = images
        .to_dtype(DType::F32)?
        .div(&Tensor::scalar(16.0f32))?
        .reshape_dims(&[n, 1, 8, 8])?;
    Ok((images, labels.to_dtype(DType::I64)?))
}

/// [`load_digits`] as a [`TensorDataset`] of `(image [1,8,8], label [])` samples.
pub fn digits_dataset(path: impl AsRef<Path>) -> Result<TensorDataset> {
    let (x, y) = load_digits(path)?;
    TensorDataset::new(vec![x, y])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Dataset;

    #[test]
    fn shipped_digits_load_with_shapes_dtypes_and_ranges() {
        let (x, y) = load_digits(default_path()).unwrap();
        assert_eq!((x.dims(), x.dtype()), (&[1797, 1, 8, 8][..], DType::F32));
        assert_eq!((y.dims(), y.dtype()), (&[1797][..], DType::I64));
        let px = x.to_vec::<f32>().unwrap();
        assert!(px.iter().all(|&v| (0.0..=1.0).contains(&v)));
        assert!(px.contains(&1.0) && px.contains(&0.0));
        let labels = y.to_vec::<i64>().unwrap();
        let mut counts = [0usize; 10];
        for &l in &labels {
            counts[l as usize] += 1;
        }
        // Per-class counts from data/README.md.
        assert_eq!(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
        let ds = digits_dataset(default_path()).unwrap();
        assert_eq!(ds.len(), 1797);
        let s = ds.get(0).unwrap();
        assert_eq!((s[0].dims(), s[1].dims()), (&[1, 8, 8][..], &[][..]));
    }

    #[test]
    fn a_file_without_the_keys_is_a_clear_error() {
        let d = std::env::temp_dir().join(format!("kiln-digits-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("not_digits.safetensors");
        serialize::save(
            &p,
            &[("images".into(), Tensor::zeros(&[3, 8, 8], DType::U8))],
        )
        .unwrap();
        let e = load_digits(&p).unwrap_err().to_string();
        assert!(
            e.contains("not_digits.safetensors") && e.contains("`labels`"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
