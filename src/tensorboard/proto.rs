//! The few protobuf fields of TensorBoard's `Event` and `Summary` messages
//! that scalar curves use, hand-encoded (field numbers from
//! `tensorboard/compat/proto/event.proto` and `summary.proto`).
//!
//! ```text
//! Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//! Summary { repeated Value value = 1; }
//! Value   { string tag = 1; float simple_value = 2; }
//! ```

/// One decoded `Event` (fields this module does not know are skipped).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub file_version: Option<String>,
    /// `(tag, simple_value)` of each summary value that has one.
    pub scalars: Vec<(String, f32)>,
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, ((field as u64) << 3) | wire as u64);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

impl Event {
    /// The protobuf encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![];
        key(&mut out, 1, FIXED64);
        out.extend_from_slice(&self.wall_time.to_le_bytes());
        if self.step != 0 {
            key(&mut out, 2, VARINT);
            varint(&mut out, self.step as u64);
        }
        if let Some(v) = &self.file_version {
            bytes(&mut out, 3, v.as_bytes());
        }
        if !self.scalars.is_empty() {
            let mut summary = vec![];
            for (tag, v) in &self.scalars {
                let mut value = vec![];
                bytes(&mut value, 1, tag.as_bytes());
                key(&mut value, 2, FIXED32);
                value.extend_from_slice(&v.to_le_bytes());
                bytes(&mut summary, 1, &value);
            }
            bytes(&mut out, 5, &summary);
        }
        out
    }

    /// Decodes an `Event`; a malformed message is an error naming the field.
    pub fn decode(buf: &[u8]) -> Result<Event, String> {
        let mut e = Event::default();
        for f in Fields::new(buf) {
            match f? {
                (1, Field::Fixed64(v)) => e.wall_time = f64::from_le_bytes(v),
                (2, Field::Varint(v)) => e.step = v as i64,
                (3, Field::Bytes(b)) => e.file_version = Some(utf8(b, "Event.file_version")?),
                (5, Field::Bytes(b)) => e.scalars.extend(decode_summary(b)?),
                _ => {}
            }
        }
        Ok(e)
    }
}

fn decode_summary(buf: &[u8]) -> Result<Vec<(String, f32)>, String> {
    let mut out = vec![];
    for f in Fields::new(buf) {
        if let (1, Field::Bytes(b)) = f? {
            let (mut tag, mut value) = (String::new(), None);
            for g in Fields::new(b) {
                match g? {
                    (1, Field::Bytes(t)) => tag = utf8(t, "Summary.Value.tag")?,
                    (2, Field::Fixed32(v)) => value = Some(f32::from_le_bytes(v)),
                    _ => {}
                }
            }
            out.extend(value.map(|v| (tag, v)));
        }
    }
    Ok(out)
}

fn utf8(b: &[u8], what: &str) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
}

enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// Iterates `(field number, value)` over one message's bytes.
struct Fields<'a> {
    buf: &'a [u8],
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Fields { buf, failed: false }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first().ok_or("truncated varint")?;
            self.buf = rest;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!("field of {n} bytes runs past the message end"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    fn field(&mut self) -> Result<(u32, Field<'a>), String> {
        let k = self.varint()?;
        let (num, wire) = ((k >> 3) as u32, (k & 7) as u8);
        let f = match wire {
            VARINT => Field::Varint(self.varint()?),
            FIXED64 => Field::Fixed64(self.take(8)?.try_into().expect("8 bytes")),
            LEN => {
                let n = self.varint()? as usize;
                Field::Bytes(self.take(n)?)
            }
            FIXED32 => Field::Fixed32(self.take(4)?.try_into().expect("4 bytes")),
            w => return Err(format!("field {num} has unsupported wire type {w}")),
        };
        Ok((num, f))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Field<'a>), String>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() || self.failed {
            return None;
        }
        let r = self.field();
        self.failed = r.is_err();
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_round_trips_and_matches_protobufs_bytes() {
        let e = Event {
            wall_time: 1.5,
            step: 300,
            file_version: None,
            scalars: vec![("loss".into(), 0.25)],
        };
        let b = e.encode();
        // wall_time (tag 0x09, 1.5 as f64 LE), step (0x10, varint 300 = ac 02),
        // summary (0x2a, len 13) { value (0x0a, len 11) { tag (0x0a, "loss"), simple_value (0x15, 0.25f32) } }
        let mut want = vec![0x09];
        want.extend(1.5f64.to_le_bytes());
        want.extend([0x10, 0xac, 0x02, 0x2a, 13, 0x0a, 11, 0x0a, 4]);
        want.extend(b"loss");
        want.push(0x15);
        want.extend(0.25f32.to_le_bytes());
        assert_eq!(b, want);
        assert_eq!(Event::decode(&b).unwrap(), e);
        assert!(Event::decode(&b[..b.len() - 2]).is_err());
    }
}
