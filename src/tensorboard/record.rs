//! TFRecord framing: length, masked CRC-32C of the length, payload, masked
//! CRC-32C of the payload.

use std::io::{self, Read, Write};

/// TensorFlow's masked CRC-32C (Castagnoli): a CRC of data that holds CRCs
/// is itself a poor CRC, so the stored value is rotated and offset.
///
/// ```
/// // The CRC-32C of "123456789" is 0xe3069283.
/// let crc = 0xe3069283u32;
/// let masked = ((crc >> 15) | (crc << 17)).wrapping_add(0xa282ead8);
/// assert_eq!(kiln::tensorboard::masked_crc32c(b"123456789"), masked);
/// ```
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Writes one record around `payload`.
pub fn write_record(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = (payload.len() as u64).to_le_bytes();
    w.write_all(&len)?;
    w.write_all(&masked_crc32c(&len).to_le_bytes())?;
    w.write_all(payload)?;
    w.write_all(&masked_crc32c(payload).to_le_bytes())
}

/// Reads the next record's payload; `Ok(None)` at a clean end of file. A
/// truncated record (a writer still running) or a CRC mismatch is an error
/// saying which.
pub fn read_record(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut head = [0u8; 12];
    let got = read_full(r, &mut head)?;
    if got == 0 {
        return Ok(None);
    }
    if got < head.len() {
        return Err(bad(format!("truncated record header ({got} of 12 bytes)")));
    }
    let (len, len_crc) = head.split_at(8);
    if masked_crc32c(len) != u32::from_le_bytes(len_crc.try_into().expect("4 bytes")) {
        return Err(bad("length CRC-32C mismatch".into()));
    }
    let n = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    if n > 1 << 30 {
        return Err(bad(format!(
            "record length {n} is implausible (over 1 GiB)"
        )));
    }
    let mut payload = vec![0u8; n as usize + 4];
    let got = read_full(r, &mut payload)?;
    if got < payload.len() {
        return Err(bad(format!("truncated record ({got} of {} bytes)", n + 4)));
    }
    let crc = u32::from_le_bytes(payload[n as usize..].try_into().expect("4 bytes"));
    payload.truncate(n as usize);
    if masked_crc32c(&payload) != crc {
        return Err(bad("payload CRC-32C mismatch".into()));
    }
    Ok(Some(payload))
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..])? {
            0 => break,
            k => got += k,
        }
    }
    Ok(got)
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_flipped_bit_is_caught() {
        let mut buf = vec![];
        write_record(&mut buf, b"hello").unwrap();
        write_record(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_record(&mut r).unwrap().unwrap(), b"hello");
        assert_eq!(read_record(&mut r).unwrap().unwrap(), b"");
        assert!(read_record(&mut r).unwrap().is_none());
        buf[13] ^= 1;
        let e = read_record(&mut &buf[..]).unwrap_err();
        assert!(e.to_string().contains("payload CRC-32C"), "{e}");
        let e = read_record(&mut &buf[..7]).unwrap_err();
        assert!(e.to_string().contains("truncated record header"), "{e}");
    }
}
