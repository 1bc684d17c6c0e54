//! A safetensors header checked before the `safetensors` crate reads it, so
//! that every problem names the key it is in: data offsets past the end of
//! the file, offsets that disagree with the shape and dtype, a shape whose
//! element count overflows, and a `__metadata__` that is not a map of
//! strings to strings (which the crate reports without naming anything).

use serde_json::Value;

/// Checks the header of safetensors `bytes`; `Err` is the message (the
/// caller adds the path). Structural problems the crate already reports
/// well (truncation, bad JSON) are left to it: this returns `Ok` for them.
pub(super) fn check(bytes: &[u8]) -> Result<(), String> {
    let Some(len_bytes) = bytes.get(..8) else {
        return Ok(());
    };
    let n = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    let Some(header) = usize::try_from(n)
        .ok()
        .and_then(|n| bytes.get(8..8usize.checked_add(n)?))
    else {
        return Ok(());
    };
    let data_len = (bytes.len() - 8 - header.len()) as u64;
    let Ok(Value::Object(entries)) = serde_json::from_slice::<Value>(header) else {
        return Ok(());
    };
    for (key, v) in &entries {
        if key == "__metadata__" {
            check_metadata(v)?;
        } else {
            check_entry(key, v, data_len)?;
        }
    }
    Ok(())
}

fn check_metadata(v: &Value) -> Result<(), String> {
    let Value::Object(m) = v else {
        return Err(format!(
            "corrupt header: `__metadata__` must be a map of strings to strings, got {}",
            kind(v)
        ));
    };
    for (k, v) in m {
        if !v.is_string() {
            return Err(format!(
                "corrupt header: `__metadata__` key `{k}` must be a string, got {}",
                kind(v)
            ));
        }
    }
    Ok(())
}

fn check_entry(key: &str, v: &Value, data_len: u64) -> Result<(), String> {
    let bad = |what: String| Err(format!("corrupt header: key `{key}`: {what}"));
    let Some(shape) = v.get("shape").and_then(Value::as_array) else {
        return bad("no `shape` list".into());
    };
    let dims: Option<Vec<u64>> = shape.iter().map(Value::as_u64).collect();
    let Some(dims) = dims else {
        return bad(format!(
            "shape {} is not a list of sizes",
            Value::Array(shape.clone())
        ));
    };
    let Some(numel) = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) else {
        return bad(format!(
            "shape {dims:?} has too many elements (the count overflows)"
        ));
    };
    let size = match v.get("dtype").and_then(Value::as_str) {
        Some("BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2") => 1,
        Some("I16" | "U16" | "F16" | "BF16") => 2,
        Some("I32" | "U32" | "F32") => 4,
        Some("I64" | "U64" | "F64") => 8,
        // unknown dtypes are reported by the loader, with the key
        _ => return Ok(()),
    };
    let offsets: Option<Vec<u64>> = v
        .get("data_offsets")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect());
    let Some([begin, end]) = offsets
        .as_deref()
        .map(|o| <[u64; 2]>::try_from(o).ok())
        .flatten()
    else {
        return bad("`data_offsets` is not a pair of offsets".into());
    };
    if begin > end || end > data_len {
        // most often a file cut short: say so, as the crate's own message does
        return Err(format!(
            "truncated or corrupt: key `{key}`: data offsets [{begin}, {end}] run past the end of the data ({data_len} bytes)"
        ));
    }
    let Some(want) = numel.checked_mul(size) else {
        return bad(format!("shape {dims:?} has a byte size that overflows"));
    };
    if end - begin != want {
        return bad(format!(
            "shape {dims:?} of {size}-byte elements needs {want} bytes but its data offsets [{begin}, {end}] hold {}",
            end - begin
        ));
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend(std::iter::repeat_n(0u8, data));
        b
    }

    #[test]
    fn each_problem_names_the_key() {
        let cases = [
            (
                r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}}"#,
                "key `w`: data offsets [0, 80] run past",
            ),
            (
                r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                "key `w`: shape [3] of 4-byte elements needs 12 bytes",
            ),
            (
                r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
                "key `w`: shape [4294967296, 4294967296, 16] has too many",
            ),
            (
                r#"{"__metadata__":{"a":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                "`__metadata__` key `a` must be a string, got a number",
            ),
            (
                r#"{"__metadata__":[1]}"#,
                "`__metadata__` must be a map of strings to strings, got a list",
            ),
        ];
        for (h, want) in cases {
            let e = check(&file(h, 8)).unwrap_err();
            assert!(e.contains(want), "{e}\n  wanted: {want}");
        }
        let ok =
            r#"{"__metadata__":{"a":"b"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        assert_eq!(check(&file(ok, 8)), Ok(()));
    }
}
