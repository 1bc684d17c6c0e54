//! Shape inference and argument checks for 2-D pooling: `max_pool2d`,
//! `avg_pool2d`, `adaptive_avg_pool2d`, `adaptive_max_pool2d`.

use crate::shape::{fmt_dims, Dims};
use crate::{bail, Result};
use smallvec::SmallVec;

/// Window of a 2-D pooling op, per `[H, W]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    pub kernel: [usize; 2],
    /// PyTorch's default stride is the kernel size (see [`Pool2dParams::new`]).
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
}

impl Pool2dParams {
    /// Kernel `kernel`, stride = kernel, no padding, dilation 1, floor mode.
    pub fn new(kernel: [usize; 2]) -> Self {
        Pool2dParams {
            kernel,
            stride: kernel,
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
        }
    }

    /// `stride=` (PyTorch's `nn.MaxPool2d(3, stride=2, padding=1)` is
    /// `Pool2dParams::new([3, 3]).stride([2, 2]).padding([1, 1])`).
    ///
    /// ```
    /// use kiln_ir::op::pool::Pool2dParams;
    /// let p = Pool2dParams::new([3, 3]).stride([2, 2]).padding([1, 1]).ceil_mode(true);
    /// assert_eq!((p.kernel, p.stride, p.padding, p.ceil_mode), ([3, 3], [2, 2], [1, 1], true));
    /// ```
    pub fn stride(mut self, stride: [usize; 2]) -> Self {
        self.stride = stride;
        self
    }
    /// `padding=`.
    pub fn padding(mut self, padding: [usize; 2]) -> Self {
        self.padding = padding;
        self
    }
    /// `dilation=`.
    pub fn dilation(mut self, dilation: [usize; 2]) -> Self {
        self.dilation = dilation;
        self
    }
    /// `ceil_mode=`.
    pub fn ceil_mode(mut self, on: bool) -> Self {
        self.ceil_mode = on;
        self
    }
}

/// A checked 2-D pooling: input `[N, C, H, W]` (or unbatched `[C, H, W]`, then `n == 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool2dGeometry {
    pub batched: bool,
    pub n: usize,
    pub c: usize,
    pub in_size: [usize; 2],
    pub out_size: [usize; 2],
    pub params: Pool2dParams,
}

impl Pool2dGeometry {
    /// Number of independent `H x W` planes (`N * C`).
    pub fn planes(&self) -> usize {
        self.n * self.c
    }
    pub fn out_shape(&self) -> Dims {
        let mut d: Dims = SmallVec::new();
        if self.batched {
            d.push(self.n);
        }
        d.extend_from_slice(&[self.c, self.out_size[0], self.out_size[1]]);
        d
    }
}

/// PyTorch's pooling output size for one dim (may be <= 0 for too-small inputs).
///
/// With `ceil_mode`, the last window must start inside the input or the left
/// padding, so a window lying wholly in the right padding is dropped.
pub fn pool_output_size(
    input: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    ceil_mode: bool,
) -> i64 {
    let (i, k, s, p, d) = (
        input as i64,
        kernel as i64,
        stride as i64,
        pad as i64,
        dilation as i64,
    );
    let num = i + 2 * p - d * (k - 1) - 1 + if ceil_mode { s - 1 } else { 0 };
    let mut out = num.div_euclid(s) + 1;
    if ceil_mode && (out - 1) * s >= i + p {
        out -= 1;
    }
    out
}

/// Splits a pooling input into `(batched, n, c, [h, w])`.
fn split_input(op: &str, input: &[usize]) -> Result<(bool, usize, usize, [usize; 2])> {
    let (batched, n, rest) = match input.len() {
        3 => (false, 1, input),
        4 => (true, input[0], &input[1..]),
        _ => bail!(
            op,
            "input {} must be 3-D [C,H,W] or 4-D [N,C,H,W]",
            fmt_dims(input)
        ),
    };
    if rest.contains(&0) {
        bail!(
            op,
            "input {} has a zero-sized non-batch dim",
            fmt_dims(input)
        );
    }
    Ok((batched, n, rest[0], [rest[1], rest[2]]))
}

/// Checks a `max_pool2d`/`avg_pool2d` call and computes its output size.
/// An op whose name starts with `avg` must have dilation 1.
pub fn pool2d_geometry(op: &str, input: &[usize], params: &Pool2dParams) -> Result<Pool2dGeometry> {
    let (batched, n, c, in_size) = split_input(op, input)?;
    let pr = params;
    if pr.kernel.contains(&0) {
        bail!(op, "kernel_size {} must be positive", fmt_dims(&pr.kernel));
    }
    if pr.stride.contains(&0) {
        bail!(op, "stride {} must be positive", fmt_dims(&pr.stride));
    }
    if pr.dilation.contains(&0) {
        bail!(op, "dilation {} must be positive", fmt_dims(&pr.dilation));
    }
    if op.starts_with("avg") && pr.dilation != [1, 1] {
        bail!(
            op,
            "dilation {} is not supported (must be [1,1])",
            fmt_dims(&pr.dilation)
        );
    }
    if pr.padding[0] > pr.kernel[0] / 2 || pr.padding[1] > pr.kernel[1] / 2 {
        bail!(
            op,
            "padding {} should be at most half of kernel_size {}",
            fmt_dims(&pr.padding),
            fmt_dims(&pr.kernel)
        );
    }
    let o: Vec<i64> = (0..2)
        .map(|d| {
            pool_output_size(
                in_size[d],
                pr.kernel[d],
                pr.stride[d],
                pr.padding[d],
                pr.dilation[d],
                pr.ceil_mode,
            )
        })
        .collect();
    if o[0] < 1 || o[1] < 1 {
        bail!(
            op,
            "input {} with kernel_size {}, padding {}, dilation {}: output size [{},{}] is too small",
            fmt_dims(input),
            fmt_dims(&pr.kernel),
            fmt_dims(&pr.padding),
            fmt_dims(&pr.dilation),
            o[0],
            o[1]
        );
    }
    Ok(Pool2dGeometry {
        batched,
        n,
        c,
        in_size,
        out_size: [o[0] as usize, o[1] as usize],
        params: *pr,
    })
}

/// Output shape of `max_pool2d`/`avg_pool2d`; see [`pool2d_geometry`].
///
/// ```
/// use kiln_ir::op::pool::{pool2d_shape, Pool2dParams};
/// let p = Pool2dParams { ceil_mode: true, ..Pool2dParams::new([2, 2]) };
/// assert_eq!(pool2d_shape("max_pool2d", &[1, 3, 5, 5], &p).unwrap().as_slice(), &[1, 3, 3, 3]);
/// ```
pub fn pool2d_shape(op: &str, input: &[usize], params: &Pool2dParams) -> Result<Dims> {
    Ok(pool2d_geometry(op, input, params)?.out_shape())
}

/// Checks `divisor_override` of `avg_pool2d` (must not be zero).
pub fn check_divisor_override(op: &str, divisor: Option<i64>) -> Result<()> {
    if divisor == Some(0) {
        bail!(op, "divisor_override must not be zero");
    }
    Ok(())
}

/// Checks an adaptive pooling call; the result's `params` is unused (kernel 1).
pub fn adaptive_pool2d_geometry(
    op: &str,
    input: &[usize],
    output_size: [usize; 2],
) -> Result<Pool2dGeometry> {
    let (batched, n, c, in_size) = split_input(op, input)?;
    if output_size.contains(&0) && n * c > 0 {
        bail!(
            op,
            "output_size {} must be positive for input {}",
            fmt_dims(&output_size),
            fmt_dims(input)
        );
    }
    Ok(Pool2dGeometry {
        batched,
        n,
        c,
        in_size,
        out_size: output_size,
        params: Pool2dParams::new([1, 1]),
    })
}

/// Output shape of `adaptive_avg_pool2d`/`adaptive_max_pool2d`.
pub fn adaptive_pool2d_shape(op: &str, input: &[usize], output_size: [usize; 2]) -> Result<Dims> {
    Ok(adaptive_pool2d_geometry(op, input, output_size)?.out_shape())
}

/// The input range `[start, end)` of adaptive output cell `i`:
/// `start = floor(i*in/out)`, `end = ceil((i+1)*in/out)`.
pub fn adaptive_range(i: usize, input: usize, output: usize) -> (usize, usize) {
    let start = (i * input) / output;
    let end = ((i + 1) * input).div_ceil(output);
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes() {
        assert_eq!(pool_output_size(5, 2, 2, 0, 1, false), 2);
        assert_eq!(pool_output_size(5, 2, 2, 0, 1, true), 3);
        // ceil mode: a window starting at 5 would lie wholly in the right padding -> dropped.
        assert_eq!(pool_output_size(4, 2, 3, 1, 1, true), 2);
        assert_eq!(pool_output_size(6, 3, 2, 1, 1, true), 4);
        assert_eq!(pool_output_size(6, 3, 2, 1, 1, false), 3);
        assert_eq!(pool_output_size(5, 3, 2, 1, 1, true), 3);
        assert_eq!(pool_output_size(4, 3, 3, 1, 1, true), 2);
        assert_eq!(pool_output_size(7, 3, 2, 0, 2, false), 2);
        let p = Pool2dParams {
            stride: [1, 2],
            padding: [1, 0],
            ..Pool2dParams::new([3, 2])
        };
        assert_eq!(
            pool2d_shape("max_pool2d", &[3, 6, 7], &p)
                .unwrap()
                .as_slice(),
            &[3, 6, 3]
        );
    }

    #[test]
    fn errors() {
        let p = Pool2dParams {
            padding: [2, 0],
            ..Pool2dParams::new([3, 3])
        };
        assert_eq!(
            pool2d_shape("max_pool2d", &[1, 1, 8, 8], &p)
                .unwrap_err()
                .to_string(),
            "max_pool2d: padding [2,0] should be at most half of kernel_size [3,3]"
        );
        assert_eq!(
            pool2d_shape("max_pool2d", &[1, 1, 2, 2], &Pool2dParams::new([3, 3])).unwrap_err().to_string(),
            "max_pool2d: input [1,1,2,2] with kernel_size [3,3], padding [0,0], dilation [1,1]: output size [0,0] is too small"
        );
        assert_eq!(
            pool2d_shape("avg_pool2d", &[8, 8], &Pool2dParams::new([2, 2]))
                .unwrap_err()
                .to_string(),
            "avg_pool2d: input [8,8] must be 3-D [C,H,W] or 4-D [N,C,H,W]"
        );
        let d = Pool2dParams {
            dilation: [2, 2],
            ..Pool2dParams::new([2, 2])
        };
        assert!(pool2d_shape("avg_pool2d", &[1, 8, 8], &d).is_err());
        assert!(check_divisor_override("avg_pool2d", Some(0)).is_err());
    }

    #[test]
    fn adaptive() {
        assert_eq!(adaptive_range(0, 10, 3), (0, 4));
        assert_eq!(adaptive_range(1, 10, 3), (3, 7));
        assert_eq!(adaptive_range(2, 10, 3), (6, 10));
        assert_eq!(adaptive_range(4, 3, 5), (2, 3));
        assert_eq!(
            adaptive_pool2d_shape("adaptive_avg_pool2d", &[2, 3, 10, 9], [3, 1])
                .unwrap()
                .as_slice(),
            &[2, 3, 3, 1]
        );
    }
}
