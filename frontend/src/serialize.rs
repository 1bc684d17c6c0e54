//! Saving and loading named tensors as safetensors (`torch.save` of a
//! state_dict, `safetensors.torch.save_file` / `load_file`).
//!
//! * Writes are atomic: the file is written to a temporary file in the same
//!   folder, fsynced, then renamed over the target, so a crash or a failed write
//!   never leaves a partial file where the old one was.
//! * Loading keeps every dtype kiln has (f32, f64, f16, bf16, i64, i32, i16, i8,
//!   u8, bool) and reports a truncated or corrupt file, a missing key, or a wrong
//!   shape or dtype as [`Error::Io`] naming the file and the key.
//!
//! ```
//! use kiln_frontend::{serialize, Tensor};
//! let dir = std::env::temp_dir().join(format!("kiln-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("w.safetensors");
//! let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
//! serialize::save(&path, &[("w".to_string(), w)]).unwrap();
//! let mut f = serialize::open(&path).unwrap();
//! let w = f.take_checked("w", &[2], kiln_frontend::DType::F32).unwrap();
//! assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
//! assert!(f.take("bias").unwrap_err().to_string().contains("bias"));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

mod header;

use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{DType, Error, Result};
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensorError, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

fn io_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Io {
        path: path.display().to_string(),
        msg: msg.into(),
    }
}

/// kiln's dtype as a safetensors dtype.
pub fn to_safetensors_dtype(d: DType) -> StDtype {
    match d {
        DType::Bool => StDtype::BOOL,
        DType::U8 => StDtype::U8,
        DType::I8 => StDtype::I8,
        DType::I16 => StDtype::I16,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
    }
}

/// A safetensors dtype as kiln's, if kiln has it.
pub fn from_safetensors_dtype(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::BOOL => DType::Bool,
        StDtype::U8 => DType::U8,
        StDtype::I8 => DType::I8,
        StDtype::I16 => DType::I16,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        _ => return None,
    })
}

/// Writes `bytes` to `path` atomically: temp file in the same folder with a
/// random name, fsync, rename, then fsync of the folder
/// ([`kiln_runtime::atomic_file`]). On error the old file (if any) is
/// intact and the temp file is removed; temp files left by writers that
/// were killed are removed by the next write to the same path.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    kiln_runtime::atomic_file::write(path, bytes).map_err(|e| {
        io_err(
            path,
            format!("cannot write (via a temporary file beside it): {e}"),
        )
    })
}

/// Serialises named tensors (any strides; written row-major) to safetensors bytes.
pub fn to_bytes(
    tensors: &[(String, Tensor)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<u8>> {
    let mut seen = std::collections::BTreeSet::new();
    for (k, _) in tensors {
        if !seen.insert(k.as_str()) {
            return Err(Error::op("save", format!("duplicate key `{k}`")));
        }
    }
    let data: Vec<(String, DType, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, t)| (k.clone(), t.dtype(), t.dims().to_vec(), t.to_bytes()))
        .collect();
    let views = data
        .iter()
        .map(|(k, d, dims, b)| {
            TensorView::new(to_safetensors_dtype(*d), dims.clone(), b)
                .map(|v| (k.as_str(), v))
                .map_err(|e| Error::op("save", format!("tensor `{k}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta: Option<HashMap<String, String>> =
        metadata.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    safetensors::serialize(views, meta).map_err(|e| Error::op("save", e.to_string()))
}

/// `save_file(tensors, path)`: writes named tensors atomically.
pub fn save(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    save_with_metadata(path, tensors, None)
}

/// [`save`] with string metadata in the header (`__metadata__`).
pub fn save_with_metadata(
    path: impl AsRef<Path>,
    tensors: &[(String, Tensor)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_bytes(tensors, metadata).map_err(|e| io_err(path, e.to_string()))?;
    write_atomic(path, &bytes)
}

/// [`save`] of a map (keys in order).
pub fn save_map(path: impl AsRef<Path>, tensors: &BTreeMap<String, Tensor>) -> Result<()> {
    let v: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(k, t)| (k.clone(), t.clone()))
        .collect();
    save(path, &v)
}

fn describe(e: SafeTensorError, len: usize) -> String {
    use SafeTensorError::*;
    match e {
        HeaderTooSmall => format!(
            "truncated: the file has {len} bytes, fewer than the 8-byte header length a safetensors file starts with"
        ),
        InvalidHeaderLength => format!(
            "truncated or corrupt: the header length in the first 8 bytes runs past the end of the file ({len} bytes)"
        ),
        HeaderTooLarge => "corrupt header: the header length in the first 8 bytes is implausibly large".into(),
        InvalidHeader(e) => format!("corrupt header: not UTF-8 ({e})"),
        InvalidHeaderDeserialization(e) | JsonError(e) => {
            format!("corrupt header: not a valid safetensors JSON header ({e})")
        }
        MetadataIncompleteBuffer => format!(
            "truncated or corrupt: the tensor data described in the header does not match the file size ({len} bytes)"
        ),
        InvalidOffset(k) => format!("corrupt header: invalid data offsets for key `{k}`"),
        TensorInvalidInfo => {
            "corrupt header: a tensor's shape and dtype do not match its data offsets".into()
        }
        other => format!("not a valid safetensors file: {other}"),
    }
}

/// A loaded safetensors file: its tensors by name and its metadata, with
/// checked accessors whose errors name the file and the key.
#[derive(Clone, Debug)]
pub struct Loaded {
    path: String,
    tensors: BTreeMap<String, Tensor>,
    metadata: BTreeMap<String, String>,
}

/// Parses safetensors `bytes` (`path` is only used in messages).
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Loaded> {
    header::check(bytes).map_err(|msg| io_err(path, msg))?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| io_err(path, describe(e, bytes.len())))?;
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| io_err(path, describe(e, bytes.len())))?;
    let metadata = header
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let mut tensors = BTreeMap::new();
    for (name, view) in st.iter() {
        let Some(dtype) = from_safetensors_dtype(view.dtype()) else {
            return Err(io_err(
                path,
                format!(
                    "key `{name}` has dtype {:?}, which kiln does not support",
                    view.dtype()
                ),
            ));
        };
        if dtype == DType::Bool && view.data().iter().any(|&b| b > 1) {
            return Err(io_err(
                path,
                format!("corrupt data: key `{name}` is bool but holds bytes other than 0 and 1"),
            ));
        }
        tensors.insert(
            name.to_string(),
            Tensor::from_bytes(dtype, view.shape(), view.data()),
        );
    }
    Ok(Loaded {
        path: path.display().to_string(),
        tensors,
        metadata,
    })
}

/// Reads and parses a safetensors file.
pub fn open(path: impl AsRef<Path>) -> Result<Loaded> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io_err(path, format!("cannot read: {e}")))?;
    from_bytes(path, &bytes)
}

/// `load_file(path)`: every tensor, by name in key order.
pub fn load(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    Ok(open(path)?.tensors.into_iter().collect())
}

/// [`load`] as a map.
pub fn load_map(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>> {
    Ok(open(path)?.tensors)
}

/// What [`load_into`] expects of one key.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    pub name: String,
    pub dims: Vec<usize>,
    pub dtype: DType,
}

impl Expected {
    pub fn new(name: impl Into<String>, dims: &[usize], dtype: DType) -> Expected {
        Expected {
            name: name.into(),
            dims: dims.to_vec(),
            dtype,
        }
    }
    /// The name, shape and dtype of an existing tensor (e.g. a parameter).
    pub fn like(name: impl Into<String>, t: &Tensor) -> Expected {
        Expected::new(name, t.dims(), t.dtype())
    }
}

/// Loads exactly the `expected` keys, in that order, checking shapes and
/// dtypes; every missing key and every mismatch is reported in one error.
/// Keys in the file that are not expected are ignored (see [`Loaded::keys`]).
pub fn load_into(path: impl AsRef<Path>, expected: &[Expected]) -> Result<Vec<Tensor>> {
    let mut f = open(path)?;
    let mut problems = vec![];
    let mut out = vec![];
    for e in expected {
        match f.take_checked(&e.name, &e.dims, e.dtype) {
            Ok(t) => out.push(t),
            Err(Error::Io { msg, .. }) => problems.push(msg),
            Err(other) => problems.push(other.to_string()),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(Error::Io {
            path: f.path,
            msg: problems.join("; "),
        })
    }
}

impl Loaded {
    /// The file this was read from.
    pub fn path(&self) -> &str {
        &self.path
    }
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
    pub fn contains(&self, key: &str) -> bool {
        self.tensors.contains_key(key)
    }
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    pub fn tensors(&self) -> &BTreeMap<String, Tensor> {
        &self.tensors
    }
    pub fn into_map(self) -> BTreeMap<String, Tensor> {
        self.tensors
    }

    fn err(&self, msg: String) -> Error {
        Error::Io {
            path: self.path.clone(),
            msg,
        }
    }

    /// The tensor at `key`; a missing key is an error naming it.
    pub fn get(&self, key: &str) -> Result<&Tensor> {
        self.tensors.get(key).ok_or_else(|| {
            self.err(format!(
                "missing key `{key}` ({} keys in the file)",
                self.tensors.len()
            ))
        })
    }

    /// Removes and returns the tensor at `key`.
    pub fn take(&mut self, key: &str) -> Result<Tensor> {
        self.get(key)?;
        Ok(self.tensors.remove(key).expect("checked"))
    }

    /// [`Loaded::take`], checking the shape and dtype.
    pub fn take_checked(&mut self, key: &str, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let t = self.get(key)?;
        if t.dims() != dims {
            return Err(self.err(format!(
                "key `{key}`: shape mismatch: the file has {} but {} is expected",
                fmt_dims(t.dims()),
                fmt_dims(dims)
            )));
        }
        if t.dtype() != dtype {
            return Err(self.err(format!(
                "key `{key}`: dtype mismatch: the file has {} but {dtype} is expected",
                t.dtype()
            )));
        }
        self.take(key)
    }

    /// A metadata string; missing is an error naming the key.
    pub fn meta(&self, key: &str) -> Result<&str> {
        self.metadata
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| self.err(format!("missing metadata key `{key}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("kiln-ser-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/modules.safetensors")
    }

    #[test]
    fn pytorch_state_dicts_load_as_they_are() {
        let f = open(fixture()).unwrap();
        let mlp: Vec<&str> = f.keys().filter(|k| k.starts_with("mlp/state/")).collect();
        assert_eq!(mlp.len(), 4, "{mlp:?}");
        let cnn: Vec<&str> = f.keys().filter(|k| k.starts_with("cnn/state/")).collect();
        assert_eq!(cnn.len(), 16, "{cnn:?}");
        let w = f.get("cnn/state/0.weight").unwrap();
        assert_eq!((w.dims(), w.dtype()), (&[8, 1, 3, 3][..], DType::F32));
        let n = f.get("cnn/state/1.num_batches_tracked").unwrap();
        assert_eq!((n.dims(), n.dtype()), (&[][..], DType::I64));
        let want = [
            Expected::new("mlp/state/0.weight", &[32, 64], DType::F32),
            Expected::new("mlp/state/2.bias", &[10], DType::F32),
        ];
        let got = load_into(fixture(), &want).unwrap();
        assert_eq!(got[1].dims(), &[10]);
        assert!(got[0].to_f64_vec().iter().all(|v| v.is_finite()));
    }

    #[test]
    fn every_dtype_round_trips_with_metadata() {
        let d = tmp("dtypes");
        let path = d.join("all.safetensors");
        let base = Tensor::from_vec(vec![0.0f64, 1.0, -2.5, 3.0, 0.0, 1.0], &[2, 3]).unwrap();
        let mut ts = vec![];
        for dt in DType::ALL {
            let src = if dt == DType::U8 || dt == DType::Bool {
                base.abs().unwrap()
            } else {
                base.clone()
            };
            // a transposed view: saving writes it row-major
            ts.push((format!("t_{dt}"), src.to_dtype(dt).unwrap().t().unwrap()));
        }
        ts.push(("scalar".into(), Tensor::scalar(7i64)));
        ts.push(("empty".into(), Tensor::zeros(&[0, 4], DType::F32)));
        let meta = BTreeMap::from([("epoch".to_string(), "3".to_string())]);
        save_with_metadata(&path, &ts, Some(&meta)).unwrap();
        let f = open(&path).unwrap();
        assert_eq!(f.meta("epoch").unwrap(), "3");
        assert!(f.meta("step").unwrap_err().to_string().contains("`step`"));
        for (k, t) in &ts {
            let g = f.get(k).unwrap();
            assert_eq!(g.dtype(), t.dtype(), "{k}");
            assert_eq!(g.dims(), t.dims(), "{k}");
            assert_eq!(g.to_bytes(), t.to_bytes(), "{k}");
        }
        let v = load(&path).unwrap();
        assert_eq!(v.len(), ts.len());
        assert!(v.windows(2).all(|w| w[0].0 < w[1].0));
        let m = load_map(&path).unwrap();
        save_map(&path, &m).unwrap();
        assert_eq!(load_map(&path).unwrap().len(), m.len());
        assert!(save(&path, &[("a".into(), base.clone()), ("a".into(), base)]).is_err());
    }

    #[test]
    fn truncated_and_corrupt_files_are_clear_errors() {
        let d = tmp("corrupt");
        let good = d.join("good.safetensors");
        let w = Tensor::from_vec(vec![1.0f32; 64], &[8, 8]).unwrap();
        save(&good, &[("layer.weight".into(), w)]).unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let check = |name: &str, data: &[u8], want: &str| {
            let p = d.join(name);
            std::fs::write(&p, data).unwrap();
            let e = open(&p).unwrap_err();
            let s = e.to_string();
            assert!(matches!(e, Error::Io { .. }), "{s}");
            assert!(s.contains(name) && s.contains(want), "{s}");
        };
        check("short.safetensors", &bytes[..5], "truncated");
        check("cut_header.safetensors", &bytes[..20], "truncated");
        check(
            "cut_data.safetensors",
            &bytes[..bytes.len() - 10],
            "truncated",
        );
        let mut bad = bytes.clone();
        bad[9] = b'#'; // inside the JSON header
        check("bad_json.safetensors", &bad, "corrupt header");
        let e = open(d.join("missing.safetensors")).unwrap_err().to_string();
        assert!(
            e.contains("missing.safetensors") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn missing_keys_and_mismatches_name_the_file_and_key() {
        let d = tmp("keys");
        let p = d.join("ckpt.safetensors");
        let w = Tensor::zeros(&[4, 3], DType::F32);
        save(&p, &[("fc.weight".into(), w)]).unwrap();
        let mut f = open(&p).unwrap();
        let e = f.take("fc.bias").unwrap_err().to_string();
        assert!(
            e.contains("ckpt.safetensors") && e.contains("missing key `fc.bias`"),
            "{e}"
        );
        let e = f
            .take_checked("fc.weight", &[3, 4], DType::F32)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`fc.weight`") && e.contains("[4,3]") && e.contains("[3,4]"),
            "{e}"
        );
        let e = f
            .take_checked("fc.weight", &[4, 3], DType::F64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`fc.weight`") && e.contains("dtype"), "{e}");
        let e = load_into(
            &p,
            &[
                Expected::new("fc.weight", &[4, 4], DType::F32),
                Expected::new("fc.bias", &[4], DType::F32),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("ckpt.safetensors") && e.contains("fc.weight") && e.contains("fc.bias"),
            "{e}"
        );
    }

    #[test]
    fn failed_write_leaves_the_old_file_intact() {
        let d = tmp("atomic");
        let p = d.join("model.safetensors");
        let old = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        save(&p, &[("w".into(), old)]).unwrap();
        let before = std::fs::read(&p).unwrap();
        // A key the format rejects (duplicate) fails before anything is written.
        let t = Tensor::zeros(&[3], DType::F32);
        assert!(save(&p, &[("w".into(), t.clone()), ("w".into(), t.clone())]).is_err());
        // The rename fails (the target is now a non-empty folder): the temp file
        // is removed and nothing partial is visible.
        let q = d.join("dir.safetensors");
        std::fs::create_dir_all(q.join("x")).unwrap();
        let e = save(&q, &[("w".into(), t.clone())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("dir.safetensors"), "{e}");
        // The temp file cannot be created (no such folder).
        assert!(save(d.join("nope/m.safetensors"), &[("w".into(), t)]).is_err());
        assert_eq!(std::fs::read(&p).unwrap(), before);
        let names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
