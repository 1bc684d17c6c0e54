//! A table of hostile inputs, one class of defect each: every one must be an
//! `Err` of the right kind whose message names the op (or file) and the
//! offending shape, dtype, key or index — with PyTorch's own words where
//! PyTorch defines them ("Target -1 is out of bounds.", "ZeroDivisionError",
//! "refer to a single memory location"). Prints `bad inputs: P/T`.

use kiln::data::{DataLoader, TensorDataset};
use kiln::functional as F;
use kiln::ir::BinaryOp;
use kiln::{ClassLossOpts, DType, Error, Tensor};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    /// A shape too big to count or to allocate.
    Alloc,
    /// Shapes or dims that do not fit the op.
    Shape,
    /// An index, target or padding_idx outside its range.
    Index,
    /// A value the op cannot take (integer division by zero).
    Value,
    /// An in-place write whose destination aliases itself or its source.
    Overlap,
    /// A dtype the op does not accept.
    Dtype,
    /// A broken or mismatched file (an `Error::Io` naming the file).
    File,
    /// A failing sample in a DataLoader.
    Data,
}

struct Case {
    class: Class,
    /// The op (for `Error::Op`) or the file name (for `Error::Io`) the error must name.
    names: &'static str,
    /// Substrings the message must contain.
    needles: Vec<String>,
    run: Box<dyn Fn() -> kiln::Result<()>>,
}

fn t(v: Vec<f32>, d: &[usize]) -> Tensor {
    Tensor::from_vec(v, d).unwrap()
}
fn ti(v: Vec<i64>, d: &[usize]) -> Tensor {
    Tensor::from_vec(v, d).unwrap()
}
fn x23() -> Tensor {
    t(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])
}
fn ok<T>(r: kiln::Result<T>) -> kiln::Result<()> {
    r.map(|_| ())
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A safetensors file with this JSON header and `data` bytes after it.
fn st_file(name: &str, header: &str, data: usize) -> PathBuf {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(1u8, data));
    let p = dir().join(name);
    std::fs::write(&p, b).unwrap();
    p
}

fn saved(name: &str) -> PathBuf {
    let p = dir().join(name);
    kiln::serialize::save(&p, &[("w".into(), x23())]).unwrap();
    p
}

fn ds(n: usize) -> TensorDataset {
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    TensorDataset::new(vec![t(x, &[n, 1]), ti((0..n as i64).collect(), &[n])]).unwrap()
}

/// A loader over 10 samples in batches of 3 whose transform fails on sample 4.
fn failing_loader(workers: usize) -> kiln::Result<()> {
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
struct Failing;

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

macro_rules! case {
    ($class:ident, $names:expr, [$($n:expr),*], $body:expr) => {
        Case {
            class: Class::$class,
            names: $names,
            needles: vec![$($n.to_string()),*],
            run: Box::new(move || $body),
        }
    };
}

fn ce(x: &Tensor, tg: &Tensor, ignore_index: i64) -> kiln::Result<()> {
    let o = ClassLossOpts {
        ignore_index,
        ..Default::default()
    };
    ok(F::cross_entropy(x, tg, None, o))
}

const PARTIAL: &str =
    "some elements of the input tensor and the written-to tensor refer to a single memory location";
const INTERNAL: &str =
    "more than one element of the written-to tensor refers to a single memory location";

fn cases() -> Vec<Case> {
    let big = 1usize << 32;
    vec![
        // ---- fallible memory and checked element counts
        case!(
            Alloc,
            "zeros",
            ["[4294967296,4294967296]", "overflow"],
            ok(Tensor::try_zeros(&[big, big], DType::F32))
        ),
        case!(
            Alloc,
            "empty",
            ["[4611686018427387904,8]"],
            ok(Tensor::try_empty(&[1 << 62, 8], DType::F32))
        ),
        case!(
            Alloc,
            "from_vec",
            ["[4294967296,4294967296]"],
            ok(Tensor::from_vec(vec![0f32; 4], &[big, big]))
        ),
        case!(
            Alloc,
            "reshape",
            ["too many elements", "4294967296"],
            ok(x23().reshape(&[big as i64, big as i64]))
        ),
        case!(
            Alloc,
            "expand",
            ["too many elements"],
            ok(t(vec![1.0], &[1]).expand(&[1 << 40, 1 << 40]))
        ),
        case!(
            Alloc,
            "add",
            [
                "cannot allocate 4000000000000 bytes",
                "f32",
                "[1000000,1000000]"
            ],
            ok(Tensor::zeros(&[1_000_000, 1], DType::F32)
                .add(&Tensor::zeros(&[1, 1_000_000], DType::F32)))
        ),
        case!(
            Alloc,
            "mul",
            [
                "cannot allocate 8796093022208 bytes",
                "f64",
                "[1048576,1048576]"
            ],
            ok(Tensor::zeros(&[1 << 20, 1], DType::F64)
                .mul(&Tensor::zeros(&[1, 1 << 20], DType::F64)))
        ),
        case!(
            Alloc,
            "full",
            [
                "cannot allocate 72057594037927936 bytes",
                "u8",
                "[268435456,268435456]"
            ],
            ok(Tensor::try_full(&[1 << 28, 1 << 28], 1.0, DType::U8))
        ),
        case!(
            Alloc,
            "full",
            ["[4611686018427387904,4]", "overflows"],
            ok(Tensor::try_ones(&[1 << 62, 4], DType::F32))
        ),
        case!(
            Alloc,
            "matmul",
            ["cannot allocate", "[1048576,1048576]"],
            ok(F::matmul(
                &Tensor::zeros(&[1 << 20, 1], DType::F32),
                &Tensor::zeros(&[1, 1 << 20], DType::F32)
            ))
        ),
        // ---- shapes and dims
        case!(
            Shape,
            "add",
            ["[32,1]", "[3,4]", "dim 0"],
            ok(Tensor::zeros(&[32, 1], DType::F32).add(&Tensor::zeros(&[3, 4], DType::F32)))
        ),
        case!(
            Shape,
            "matmul",
            ["[2,3]", "[4,5]"],
            ok(F::matmul(&x23(), &Tensor::zeros(&[4, 5], DType::F32)))
        ),
        case!(Shape, "softmax", ["dim 2", "rank 2"], ok(x23().softmax(2))),
        case!(
            Shape,
            "log_softmax",
            ["dim -3", "rank 2"],
            ok(x23().log_softmax(-3))
        ),
        case!(Shape, "sum", ["dim 5"], ok(x23().sum(Some(&[5]), false))),
        case!(
            Shape,
            "mean",
            ["dim -4"],
            ok(x23().mean(Some(&[-4]), false))
        ),
        case!(Shape, "reshape", ["[4]", "6"], ok(x23().reshape(&[4]))),
        case!(
            Shape,
            "cat",
            ["[2,3]", "[3,2]"],
            ok(Tensor::cat(
                &[&x23(), &Tensor::zeros(&[3, 2], DType::F32)],
                0
            ))
        ),
        case!(
            Shape,
            "stack",
            ["[2,3]", "[3]"],
            ok(Tensor::stack(
                &[&x23(), &Tensor::zeros(&[3], DType::F32)],
                0
            ))
        ),
        case!(Shape, "permute", ["[2,3]"], ok(x23().permute(&[0, 0]))),
        case!(Shape, "transpose", ["dim 3"], ok(x23().transpose(0, 3))),
        case!(
            Shape,
            "select",
            ["index 5", "size 3"],
            ok(x23().select(1, 5))
        ),
        case!(Shape, "narrow", ["[2,3]"], ok(x23().narrow(1, 2, 5))),
        case!(
            Shape,
            "linear",
            ["[2,3]", "[4,5]"],
            ok(F::linear(&x23(), &Tensor::zeros(&[4, 5], DType::F32), None))
        ),
        case!(
            Shape,
            "conv2d",
            ["[2,3,8,8]", "[4,2,3,3]"],
            ok(F::conv2d(
                &Tensor::zeros(&[2, 3, 8, 8], DType::F32),
                &Tensor::zeros(&[4, 2, 3, 3], DType::F32),
                None,
                &Default::default()
            ))
        ),
        case!(
            Shape,
            "cross_entropy",
            ["[2,3]", "[3]"],
            ce(&x23(), &ti(vec![0, 1, 2], &[3]), -100)
        ),
        case!(
            Shape,
            "cross_entropy",
            ["[2,3]", "[2,2]"],
            ok(F::cross_entropy(
                &x23(),
                &Tensor::zeros(&[2, 2], DType::F32),
                None,
                Default::default()
            ))
        ),
        case!(
            Shape,
            "gather",
            ["[2,3]", "[1]"],
            ok(x23().gather(1, &ti(vec![0], &[1])))
        ),
        case!(
            Shape,
            "gather",
            ["index shape [3,1]", "[2,3]"],
            ok(x23().gather(1, &ti(vec![0, 0, 0], &[3, 1])))
        ),
        case!(
            Shape,
            "where",
            ["[2,3]", "[4]"],
            ok(Tensor::where_(
                &Tensor::zeros(&[4], DType::Bool),
                &x23(),
                &x23()
            ))
        ),
        case!(Shape, "squeeze", ["dim 4"], ok(x23().squeeze(Some(&[4])))),
        case!(Shape, "unsqueeze", ["dim 5"], ok(x23().unsqueeze(5))),
        case!(Shape, "item", ["6 elements", "[2,3]"], ok(x23().item())),
        // ---- indices, targets and padding_idx (PyTorch: negative indices do not wrap)
        case!(
            Index,
            "gather",
            ["index -1 is out of bounds for dimension 1 with size 3"],
            ok(x23().gather(1, &ti(vec![-1, 0], &[2, 1])))
        ),
        case!(
            Index,
            "gather",
            ["index 3 is out of bounds for dimension 1 with size 3"],
            ok(x23().gather(1, &ti(vec![3, 0], &[2, 1])))
        ),
        case!(
            Index,
            "gather",
            ["index -2 is out of bounds for dimension 0 with size 2"],
            ok(x23().gather(0, &ti(vec![0, -2, 1], &[1, 3])))
        ),
        case!(
            Index,
            "index_select",
            ["index -1", "dim 1 of size 3", "[2,3]"],
            ok(x23().index_select(1, &ti(vec![-1], &[1])))
        ),
        case!(
            Index,
            "index_select",
            ["index 3", "dim 1 of size 3"],
            ok(x23().index_select(1, &ti(vec![0, 3], &[2])))
        ),
        case!(
            Index,
            "index_select",
            ["index -3", "dim 0 of size 2"],
            ok(x23().index_select(0, &Tensor::from_vec(vec![-3i32], &[1]).unwrap()))
        ),
        case!(
            Index,
            "embedding",
            ["index 10", "[10,4]"],
            ok(F::embedding(
                &ti(vec![1, 10], &[2]),
                &Tensor::zeros(&[10, 4], DType::F32),
                None
            ))
        ),
        case!(
            Index,
            "embedding",
            ["index -1", "[10,4]"],
            ok(F::embedding(
                &ti(vec![-1], &[1]),
                &Tensor::zeros(&[10, 4], DType::F32),
                None
            ))
        ),
        case!(
            Index,
            "cross_entropy",
            ["Target -1 is out of bounds.", "[2,3]", "3 classes"],
            ce(&x23(), &ti(vec![-1, 0], &[2]), -100)
        ),
        case!(
            Index,
            "cross_entropy",
            ["Target 3 is out of bounds.", "3 classes"],
            ce(&x23(), &ti(vec![0, 3], &[2]), -100)
        ),
        case!(
            Index,
            "cross_entropy",
            ["Target -2 is out of bounds.", "ignore_index -1"],
            ce(&x23(), &ti(vec![-1, -2], &[2]), -1)
        ),
        case!(
            Index,
            "cross_entropy",
            ["Target -100 is out of bounds.", "ignore_index 0"],
            ce(&x23(), &ti(vec![0, -100], &[2]), 0)
        ),
        case!(
            Index,
            "nll_loss",
            ["Target -5 is out of bounds."],
            ok(F::nll_loss(
                &x23(),
                &ti(vec![-5, 0], &[2]),
                None,
                Default::default()
            ))
        ),
        case!(
            Index,
            "nll_loss",
            ["Target 7 is out of bounds.", "[3]"],
            ok(F::nll_loss(
                &t(vec![0.0, 1.0, 2.0], &[3]),
                &Tensor::scalar(7i64),
                None,
                Default::default()
            ))
        ),
        case!(
            Index,
            "cross_entropy",
            ["Target 9 is out of bounds.", "[2,3,2]"],
            ce(
                &Tensor::zeros(&[2, 3, 2], DType::F32),
                &ti(vec![0, 1, 2, 9], &[2, 2]),
                -100
            )
        ),
        case!(
            Index,
            "Embedding",
            ["padding_idx -20", "[10,4]"],
            ok(kiln::nn::Embedding::new(10, 4, Some(-20)))
        ),
        case!(
            Index,
            "Embedding",
            ["padding_idx 10", "[10,4]"],
            ok(kiln::nn::Embedding::new(10, 4, Some(10)))
        ),
        case!(
            Index,
            "embedding",
            ["padding_idx 11", "[10,4]"],
            ok(F::embedding(
                &ti(vec![0], &[1]),
                &Tensor::zeros(&[10, 4], DType::F32),
                Some(11)
            ))
        ),
        case!(
            Index,
            "select",
            ["index -4", "size 3"],
            ok(t(vec![1.0, 2.0, 3.0], &[3]).select(0, -4))
        ),
        // ---- values: integer division by zero (PyTorch: ZeroDivisionError)
        case!(
            Value,
            "floor_divide",
            ["ZeroDivisionError", "i64 [2]"],
            ok(ti(vec![5, 3], &[2]).binary(BinaryOp::FloorDiv, &ti(vec![0, 1], &[2])))
        ),
        case!(
            Value,
            "remainder",
            ["ZeroDivisionError", "i64 [2]"],
            ok(ti(vec![5, 3], &[2]).binary(BinaryOp::Remainder, &ti(vec![1, 0], &[2])))
        ),
        case!(
            Value,
            "fmod",
            ["ZeroDivisionError", "i32 [1]"],
            ok(Tensor::from_vec(vec![5i32], &[1])
                .unwrap()
                .binary(BinaryOp::Fmod, &Tensor::from_vec(vec![0i32], &[1]).unwrap()))
        ),
        case!(
            Value,
            "floor_divide",
            ["ZeroDivisionError", "scalar 0"],
            ok(ti(vec![5, 3], &[2]).binary_scalar(BinaryOp::FloorDiv, 0i64, false))
        ),
        case!(
            Value,
            "remainder",
            ["ZeroDivisionError", "scalar 0"],
            ok(ti(vec![5, 3], &[2]).binary_scalar(BinaryOp::Remainder, 0i64, false))
        ),
        case!(
            Value,
            "floor_divide",
            ["ZeroDivisionError", "i64 [3]"],
            ok(ti(vec![1, 0, 2], &[3]).binary_scalar(BinaryOp::FloorDiv, 7i64, true))
        ),
        case!(Value, "floor_divide", ["ZeroDivisionError", "u8 [2]"], {
            let a = Tensor::from_vec(vec![9u8, 8], &[2]).unwrap();
            ok(a.binary(
                BinaryOp::FloorDiv,
                &Tensor::from_vec(vec![3u8, 0], &[2]).unwrap(),
            ))
        }),
        case!(
            Value,
            "remainder",
            ["ZeroDivisionError", "i64 [2,2]"],
            ok(ti(vec![1, 2, 3, 4], &[2, 2])
                .binary(BinaryOp::Remainder, &ti(vec![1, 1, 0, 1], &[2, 2])))
        ),
        // ---- in-place writes into aliased memory (PyTorch's rule and words)
        case!(Overlap, "copy_", [PARTIAL, "source shape [4]"], {
            let a = t(vec![0.0, 1.0, 2.0, 3.0, 4.0], &[5]);
            a.slice(0, Some(1), None, 1)?
                .copy_(&a.slice(0, None, Some(-1), 1)?)
        }),
        case!(Overlap, "copy_", [PARTIAL], {
            let a = t(vec![0.0, 1.0, 2.0, 3.0, 4.0], &[5]);
            a.slice(0, None, Some(-1), 1)?
                .copy_(&a.slice(0, Some(1), None, 1)?)
        }),
        case!(
            Overlap,
            "copy_",
            [PARTIAL, "source shape [1,3] at offset 2"],
            {
                let flat = x23().reshape(&[6])?;
                let dst = flat.slice(0, Some(3), None, 1)?.reshape(&[1, 3])?;
                dst.copy_(&flat.slice(0, Some(2), Some(5), 1)?.reshape(&[1, 3])?)
            }
        ),
        case!(Overlap, "copy_", [INTERNAL, "[2,3]", "strides [0, 1]"], {
            let e = Tensor::zeros(&[1, 3], DType::F32).expand(&[2, 3])?;
            e.copy_(&Tensor::ones(&[2, 3], DType::F32))
        }),
        case!(Overlap, "copy_", [INTERNAL, "[4]"], {
            let e = Tensor::scalar(1.0f32).expand(&[4])?;
            e.copy_(&t(vec![1.0, 2.0, 3.0, 4.0], &[4]))
        }),
        case!(Overlap, "copy_", [PARTIAL], {
            let a = Tensor::from_vec(vec![half::f16::ZERO; 6], &[6])?;
            a.slice(0, Some(2), None, 1)?
                .copy_(&a.slice(0, None, Some(4), 1)?)
        }),
        // ---- dtypes
        case!(
            Dtype,
            "requires_grad_",
            [
                "only Tensors of floating point dtype can require gradients",
                "i64"
            ],
            ok(ti(vec![1, 2], &[2]).try_requires_grad_(true))
        ),
        case!(
            Dtype,
            "requires_grad_",
            [
                "only Tensors of floating point dtype can require gradients",
                "bool"
            ],
            ok(Tensor::zeros(&[1], DType::Bool).try_requires_grad_(true))
        ),
        case!(
            Dtype,
            "requires_grad_",
            ["floating point", "u8 [3]"],
            ok(Tensor::zeros(&[3], DType::U8).try_requires_grad_(true))
        ),
        case!(
            Dtype,
            "softmax",
            ["i64"],
            ok(ti(vec![1, 2], &[2]).softmax(0))
        ),
        case!(
            Dtype,
            "log_softmax",
            ["i32"],
            ok(Tensor::from_vec(vec![1i32], &[1]).unwrap().log_softmax(0))
        ),
        case!(
            Dtype,
            "mean",
            ["i64"],
            ok(ti(vec![1, 2], &[2]).mean(None, false))
        ),
        case!(
            Dtype,
            "to_vec",
            ["i64", "f32"],
            ok(ti(vec![1], &[1]).to_vec::<f32>())
        ),
        case!(
            Dtype,
            "gather",
            ["i32"],
            ok(x23().gather(1, &Tensor::from_vec(vec![0i32, 0], &[2, 1]).unwrap()))
        ),
        case!(
            Dtype,
            "index_select",
            ["f32"],
            ok(x23().index_select(0, &t(vec![0.0], &[1])))
        ),
        case!(
            Dtype,
            "cross_entropy",
            ["i64"],
            ce(
                &ti(vec![1, 2, 3, 4, 5, 6], &[2, 3]),
                &ti(vec![0, 1], &[2]),
                -100
            )
        ),
        case!(
            Dtype,
            "nll_loss",
            ["f32"],
            ok(F::nll_loss(
                &x23(),
                &t(vec![0.0, 1.0], &[2]),
                None,
                Default::default()
            ))
        ),
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
        // ---- DataLoader: which sample, which batch, which worker
        case!(
            Data,
            "DataLoader",
            ["dataset index 4", "batch 1", "main thread", "sample is bad"],
            failing_loader(0)
        ),
        case!(
            Data,
            "DataLoader",
            [
                "dataset index 4",
                "batch 1",
                "worker 1 of 2",
                "sample is bad"
            ],
            failing_loader(2)
        ),
        case!(
            Data,
            "DataLoader",
            ["collating batch 0", "dataset indices [0, 1, 2]"],
            {
                let mut l = DataLoader::new(ds(6), 3)
                    .collate(|_| Err(Error::op("collate", "shapes differ")));
                l.iter().try_for_each(|b| b.map(|_| ()))
            }
        ),
        case!(
            Data,
            "DataLoader",
            [
                "loading dataset index 7",
                "batch 3",
                "main thread",
                "disk gone"
            ],
            {
                let mut l = DataLoader::new(Failing, 2);
                l.iter().try_for_each(|b| b.map(|_| ()))
            }
        ),
    ]
}

#[test]
fn bad_inputs_are_clear_errors() {
    let cases = cases();
    let total = cases.len();
    let mut failures = vec![];
    for (i, c) in cases.iter().enumerate() {
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (c.run)()));
        let verdict = match got {
            Err(p) => Err(format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
            Ok(Ok(())) => Err("succeeded".to_string()),
            Ok(Err(e)) => {
                let msg = e.to_string();
                let named = match (&e, c.class) {
                    (Error::Io { path, .. }, Class::File) => path.ends_with(c.names),
                    (Error::Op { op, .. }, k) if k != Class::File => op == c.names,
                    _ => false,
                };
                let missing: Vec<&String> = c
                    .needles
                    .iter()
                    .filter(|n| !msg.contains(n.as_str()))
                    .collect();
                if !named {
                    Err(format!(
                        "wrong kind or name (want {:?} `{}`): {msg}",
                        c.class, c.names
                    ))
                } else if !missing.is_empty() {
                    Err(format!("missing {missing:?}: {msg}"))
                } else {
                    Ok(())
                }
            }
        };
        if let Err(why) = verdict {
            failures.push(format!("  #{i} {:?} {}: {why}", c.class, c.names));
        }
    }
    let passed = total - failures.len();
    println!("bad inputs: {passed}/{total}");
    assert!(total >= 80, "the table has {total} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The near misses of the table are accepted: PyTorch allows them too.
#[test]
fn near_misses_are_accepted() {
    let a = t(vec![0.0, 1.0, 2.0, 3.0], &[4]);
    a.copy_(&a).unwrap(); // the very same elements
    let m = x23();
    m.select(1, 0)
        .unwrap()
        .copy_(&m.select(1, 1).unwrap())
        .unwrap(); // interleaved columns
    assert_eq!(m.to_f64_vec(), vec![1.0, 1.0, 2.0, 4.0, 4.0, 5.0]);
    let l = F::cross_entropy(
        &x23(),
        &ti(vec![-1, 0], &[2]),
        None,
        ClassLossOpts {
            ignore_index: -1,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(l.item().unwrap().is_finite());
    kiln::nn::Embedding::new(10, 4, Some(-10)).unwrap();
    assert_eq!(
        ti(vec![-7], &[1])
            .binary(BinaryOp::FloorDiv, &ti(vec![2], &[1]))
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![-4]
    );
    // float division by 0 is not an error, as in PyTorch
    assert!(t(vec![1.0], &[1])
        .binary(BinaryOp::FloorDiv, &t(vec![0.0], &[1]))
        .is_ok());
    assert!(
        Tensor::try_zeros(&[1 << 32, 1 << 32, 0], DType::F32)
            .unwrap()
            .numel()
            == 0
    );
}
