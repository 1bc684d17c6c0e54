//! Bad inputs: in-place writes into aliased memory, and dtypes.

use super::support::*;
use super::{Case, Class};
use kiln::functional as F;
use kiln::{DType, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
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
    ]
}
