//! The `.kiln` file layout: a fixed header, then three sections.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KILNEXPT"
//!      8     4  format version (u32 little-endian; this kiln writes and reads 1)
//!     12     4  CRC-32 (IEEE) of everything after the header
//!     16     8  manifest length (u64 LE): JSON — names, dtypes, shapes, dims, sites
//!     24     8  graph length: the IR text at the example sizes
//!     32     8  weights length: a safetensors file of the weights
//!     40     …  manifest, graph, weights
//! ```
//!
//! A file from a newer kiln, a truncated file, a checksum mismatch and a
//! file that is no `.kiln` at all are each their own error.

use kiln_ir::{bail, Result};

pub const MAGIC: &[u8; 8] = b"KILNEXPT";
/// The format version this kiln writes; it reads this and older.
pub const VERSION: u32 = 1;
const HEADER: usize = 40;

/// The three sections of a `.kiln` file.
pub struct Sections {
    pub manifest: Vec<u8>,
    pub graph: Vec<u8>,
    pub weights: Vec<u8>,
}

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
pub fn crc32(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    !bytes.iter().fold(!0u32, |c, &b| {
        table[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8)
    })
}

/// The whole file.
pub fn encode(s: &Sections) -> Vec<u8> {
    let mut body = Vec::with_capacity(s.manifest.len() + s.graph.len() + s.weights.len());
    body.extend_from_slice(&s.manifest);
    body.extend_from_slice(&s.graph);
    body.extend_from_slice(&s.weights);
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&crc32(&body).to_le_bytes());
    for len in [s.manifest.len(), s.graph.len(), s.weights.len()] {
        out.extend_from_slice(&(len as u64).to_le_bytes());
    }
    out.extend_from_slice(&body);
    out
}

/// Splits a file into its sections, checking magic, version, lengths and checksum.
pub fn decode(path: &str, bytes: &[u8]) -> Result<Sections> {
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        bail!(
            "export::load",
            "{path}: not a kiln export (.kiln) file: it does not start with \"KILNEXPT\""
        );
    }
    if bytes.len() < HEADER {
        bail!(
            "export::load",
            "{path}: truncated: {} bytes, shorter than the {HEADER}-byte header",
            bytes.len()
        );
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let version = u32_at(8);
    if version > VERSION {
        bail!(
            "export::load",
            "{path}: written by a newer kiln (format version {version}; this kiln reads versions up to {VERSION}): upgrade kiln to load it"
        );
    }
    if version == 0 {
        bail!("export::load", "{path}: corrupt header: format version 0");
    }
    let lens = [u64_at(16), u64_at(24), u64_at(32)];
    let want = lens
        .iter()
        .try_fold(HEADER as u64, |a, &l| a.checked_add(l))
        .unwrap_or(u64::MAX);
    if (bytes.len() as u64) < want {
        bail!(
            "export::load",
            "{path}: truncated: the header promises {want} bytes, the file has {}",
            bytes.len()
        );
    }
    if (bytes.len() as u64) > want {
        bail!(
            "export::load",
            "{path}: corrupt: {} bytes after the last section",
            bytes.len() as u64 - want
        );
    }
    let body = &bytes[HEADER..];
    let (crc, got) = (u32_at(12), crc32(body));
    if crc != got {
        bail!(
            "export::load",
            "{path}: corrupt: checksum mismatch (header {crc:08x}, contents {got:08x})"
        );
    }
    let (m, g) = (lens[0] as usize, lens[1] as usize);
    Ok(Sections {
        manifest: body[..m].to_vec(),
        graph: body[m..m + g].to_vec(),
        weights: body[m + g..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn round_trip_and_damage() {
        let s = Sections {
            manifest: b"{}".to_vec(),
            graph: b"graph".to_vec(),
            weights: vec![1, 2, 3],
        };
        let bytes = encode(&s);
        let back = decode("f", &bytes).unwrap();
        assert_eq!(back.graph, b"graph");
        let e = decode("f", &bytes[..bytes.len() - 1]).err().unwrap();
        assert!(e.to_string().contains("truncated"), "{e}");
        let mut bad = bytes.clone();
        *bad.last_mut().unwrap() ^= 1;
        let e = decode("f", &bad).err().unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        let mut newer = bytes.clone();
        newer[8] = 2;
        let e = decode("f", &newer).err().unwrap();
        assert!(e.to_string().contains("newer kiln"), "{e}");
        let e = decode("f", b"PK\x03\x04 zip").err().unwrap();
        assert!(e.to_string().contains("not a kiln export"), "{e}");
    }
}
