//! Bad inputs: indices, targets, padding_idx and values.

use super::support::*;
use super::{Case, Class};
use kiln::functional as F;
use kiln::ir::BinaryOp;
use kiln::{DType, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
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
    ]
}
