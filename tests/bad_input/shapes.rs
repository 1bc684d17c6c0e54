//! Bad inputs: shapes and dims.

use super::support::*;
use super::{Case, Class};
use kiln::functional as F;
use kiln::{DType, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
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
    ]
}
