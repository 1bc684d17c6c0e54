//! NumPy `.npy` files (format versions 1-3, C order): what `numpy.save`
//! writes and `numpy.load` reads, for `kiln run`'s inputs and outputs.
//!
//! ```
//! let t = kiln::Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let back = kiln::npy::from_bytes("t.npy", &kiln::npy::to_bytes(&t)?)?;
//! assert_eq!(back.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
//! # Ok::<(), kiln::Error>(())
//! ```

use crate::{DType, Result, Tensor};
use kiln_ir::bail;
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr(d: DType) -> &'static str {
    match d {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        // numpy has no bfloat16: written as its raw 16-bit pattern
        DType::BF16 => "<u2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
    }
}

fn dtype_of(path: &str, descr: &str) -> Result<DType> {
    Ok(match descr {
        "|b1" => DType::Bool,
        "|u1" => DType::U8,
        "|i1" => DType::I8,
        "<i2" => DType::I16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "<f2" => DType::F16,
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        d => bail!(
            "npy",
            "{path}: dtype `{d}` is not supported (little-endian bool, int, float)"
        ),
    })
}

/// The `.npy` bytes of `t` (format 1.0).
pub fn to_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let shape = match t.dims() {
        [n] => format!("({n},)"),
        d => format!(
            "({})",
            d.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut h = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype())
    );
    // the header is padded so the data starts on a 64-byte boundary
    let total = MAGIC.len() + 2 + 2 + h.len() + 1;
    h.push_str(&" ".repeat((64 - total % 64) % 64));
    h.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&t.contiguous()?.to_bytes());
    Ok(out)
}

/// Reads the value of `key` in the header dict (`'descr': '<f4'` -> `<f4`).
fn field<'a>(path: &str, header: &'a str, key: &str) -> Result<&'a str> {
    let k = format!("'{key}':");
    let Some(i) = header.find(&k) else {
        bail!("npy", "{path}: the header has no `{key}`");
    };
    let rest = header[i + k.len()..].trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|e| e + 1)
    } else if let Some(r) = rest.strip_prefix('\'') {
        r.find('\'').map(|e| e + 2)
    } else {
        rest.find([',', '}'])
    };
    match end {
        Some(e) => Ok(rest[..e].trim()),
        None => bail!("npy", "{path}: cannot read `{key}` in the header"),
    }
}

/// A tensor from `.npy` bytes (`path` names the file in errors).
pub fn from_bytes(path: &str, b: &[u8]) -> Result<Tensor> {
    if b.len() < 10 || &b[..6] != MAGIC {
        bail!("npy", "{path}: not a .npy file (no \\x93NUMPY magic)");
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => bail!("npy", "{path}: format version {v} is not supported"),
    };
    let Some(header) = b.get(start..start + hlen) else {
        bail!("npy", "{path}: truncated header");
    };
    let header = std::str::from_utf8(header)
        .map_err(|_| kiln_ir::Error::op("npy", format!("{path}: header is not text")))?;
    let dtype = dtype_of(path, field(path, header, "descr")?.trim_matches('\''))?;
    if field(path, header, "fortran_order")? != "False" {
        bail!(
            "npy",
            "{path}: Fortran-order arrays are not supported (save with C order)"
        );
    }
    let shape = field(path, header, "shape")?;
    let dims = shape
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| kiln_ir::Error::op("npy", format!("{path}: bad shape {shape}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let data = &b[start + hlen..];
    let want = dims.iter().product::<usize>() * dtype.size();
    if data.len() != want {
        bail!(
            "npy",
            "{path}: {} data bytes for shape {dims:?} of {dtype} ({want} expected)",
            data.len()
        );
    }
    Ok(Tensor::from_bytes(dtype, &dims, data))
}

/// Reads a `.npy` file.
pub fn load(path: impl AsRef<Path>) -> Result<Tensor> {
    let p = path.as_ref();
    let b = std::fs::read(p)
        .map_err(|e| kiln_ir::Error::op("npy", format!("{}: cannot read: {e}", p.display())))?;
    from_bytes(&p.display().to_string(), &b)
}

/// Writes a `.npy` file atomically.
pub fn save(path: impl AsRef<Path>, t: &Tensor) -> Result<()> {
    crate::serialize::write_atomic(path.as_ref(), &to_bytes(t)?)
}
