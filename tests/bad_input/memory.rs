//! Bad inputs: fallible memory and checked element counts.

use super::support::*;
use super::{Case, Class};
use kiln::functional as F;
use kiln::{DType, Tensor};

pub fn cases() -> Vec<Case> {
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
        // the weight gradient's im2col columns span the whole output: 2^46
        // f32 (256 TiB, past any address space) for a 1x1 input padded to a
        // 4096x4096 kernel's reach — an Err from the scratch allocation
        case!(
            Alloc,
            "conv2d_weight_grad",
            [
                "cannot allocate 281474976710656 bytes",
                "scratch buffer",
                "input [1, 1, 1, 1], weight [1, 1, 4096, 4096]"
            ],
            ok(F::conv2d_weight_grad(
                &Tensor::zeros(&[1, 1, 1, 1], DType::F32),
                &Tensor::zeros(&[1, 1, 2048, 2048], DType::F32),
                &kiln::ir::op::conv::ConvParams {
                    padding: kiln::ir::op::conv::Padding::Explicit(vec![3071]),
                    ..Default::default()
                },
                [4096, 4096],
            ))
        ),
    ]
}
