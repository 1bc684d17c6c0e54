//! Bad inputs: broken or mismatched files.

use super::support::*;
use super::{Case, Class};
use kiln::DType;

pub fn cases() -> Vec<Case> {
    vec![
        // ---- files: every problem names the file and the key
        case!(
            File,
            "missing.safetensors",
            ["cannot read"],
            ok(kiln::serialize::load(dir().join("missing.safetensors")))
        ),
        case!(File, "short.safetensors", ["truncated"], {
            std::fs::write(dir().join("short.safetensors"), [1u8, 2, 3]).unwrap();
            ok(kiln::serialize::load(dir().join("short.safetensors")))
        }),
        case!(
            File,
            "past.safetensors",
            ["key `w`", "data offsets [0, 800]", "past the end"],
            ok(kiln::serialize::load(st_file(
                "past.safetensors",
                r#"{"w":{"dtype":"F32","shape":[200],"data_offsets":[0,800]}}"#,
                8
            )))
        ),
        case!(
            File,
            "mismatch.safetensors",
            ["key `w`", "shape [3]", "needs 12 bytes", "hold 8"],
            ok(kiln::serialize::load(st_file(
                "mismatch.safetensors",
                r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8
            )))
        ),
        case!(
            File,
            "overflow.safetensors",
            ["key `big`", "too many elements"],
            ok(kiln::serialize::load(st_file(
                "overflow.safetensors",
                r#"{"big":{"dtype":"F64","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}}"#,
                8
            )))
        ),
        case!(
            File,
            "meta_num.safetensors",
            ["`__metadata__` key `epoch` must be a string, got a number"],
            ok(kiln::serialize::load(st_file(
                "meta_num.safetensors",
                r#"{"__metadata__":{"epoch":3},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                8
            )))
        ),
        case!(
            File,
            "meta_list.safetensors",
            ["`__metadata__` must be a map of strings to strings, got a list"],
            ok(kiln::serialize::load(st_file(
                "meta_list.safetensors",
                r#"{"__metadata__":["a"],"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                8
            )))
        ),
        case!(
            File,
            "json.safetensors",
            ["corrupt header"],
            ok(kiln::serialize::load(st_file(
                "json.safetensors",
                r#"{"w":{"dtype":"F32""#,
                8
            )))
        ),
        case!(
            File,
            "u16.safetensors",
            ["key `w`", "U16"],
            ok(kiln::serialize::load(st_file(
                "u16.safetensors",
                r#"{"w":{"dtype":"U16","shape":[4],"data_offsets":[0,8]}}"#,
                8
            )))
        ),
        case!(
            File,
            "bool.safetensors",
            ["key `m`", "bool"],
            ok(kiln::serialize::load(st_file(
                "bool.safetensors",
                r#"{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}"#,
                2
            ))
            .map(|_| ())
            .and_then(|_| {
                // bytes of 1 are valid bools: make one a 2
                let p = dir().join("bool.safetensors");
                let mut b = std::fs::read(&p).unwrap();
                *b.last_mut().unwrap() = 2;
                std::fs::write(&p, b).unwrap();
                ok(kiln::serialize::load(&p))
            }))
        ),
        case!(File, "keys.safetensors", ["missing key `b`"], {
            let p = saved("keys.safetensors");
            ok(kiln::serialize::load_into(
                &p,
                &[kiln::serialize::Expected::new("b", &[2, 3], DType::F32)],
            ))
        }),
        case!(
            File,
            "shape.safetensors",
            ["key `w`", "shape mismatch", "[2,3]", "[3,2]"],
            {
                let p = saved("shape.safetensors");
                ok(kiln::serialize::load_into(
                    &p,
                    &[kiln::serialize::Expected::new("w", &[3, 2], DType::F32)],
                ))
            }
        ),
        case!(
            File,
            "dtype.safetensors",
            ["key `w`", "dtype mismatch", "f32", "f16"],
            {
                let p = saved("dtype.safetensors");
                ok(kiln::serialize::load_into(
                    &p,
                    &[kiln::serialize::Expected::new("w", &[2, 3], DType::F16)],
                ))
            }
        ),
    ]
}
