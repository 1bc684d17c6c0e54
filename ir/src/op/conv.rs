//! Shape inference and argument checks for `conv1d`, `conv2d` and
//! `conv_transpose1d/2d`.
//!
//! Both ranks resolve to one [`ConvGeometry`] (a 1-D convolution is a 2-D one
//! with `H = 1`), which is what the runtime's kernels consume.

use crate::shape::{fmt_dims, Dims};
use crate::{bail, Result};
use smallvec::SmallVec;

/// Padding of a convolution, as PyTorch's `padding=` accepts it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Padding {
    /// Symmetric padding per spatial dim (one value applies to every dim).
    Explicit(Vec<usize>),
    /// Output size equals input size (stride must be 1). An even dilated kernel
    /// pads asymmetrically: total = dilation*(k-1), left = total/2, right = total-left.
    Same,
    /// No padding.
    Valid,
}

/// Arguments of `conv1d`/`conv2d`. `stride`, `dilation` and `Padding::Explicit`
/// hold one value (applied to every spatial dim) or one per spatial dim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvParams {
    pub stride: Vec<usize>,
    pub padding: Padding,
    pub dilation: Vec<usize>,
    pub groups: usize,
}

impl Default for ConvParams {
    fn default() -> Self {
        ConvParams {
            stride: vec![1],
            padding: Padding::Explicit(vec![0]),
            dilation: vec![1],
            groups: 1,
        }
    }
}

/// Arguments of `conv_transpose1d`/`conv_transpose2d` (same one-or-per-dim rule).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvTransposeParams {
    pub stride: Vec<usize>,
    pub padding: Vec<usize>,
    pub output_padding: Vec<usize>,
    pub dilation: Vec<usize>,
    pub groups: usize,
}

impl Default for ConvTransposeParams {
    fn default() -> Self {
        ConvTransposeParams {
            stride: vec![1],
            padding: vec![0],
            output_padding: vec![0],
            dilation: vec![1],
            groups: 1,
        }
    }
}

/// A fully resolved convolution, always in 2-D form: `[H, W]` per spatial
/// array; a 1-D convolution has `H = 1`, `kernel[0] = 1`, `stride[0] = 1`, no H padding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    /// 1 or 2: how many spatial dims the user's tensors have.
    pub spatial: usize,
    /// False for an unbatched input (`[C, ...]`); then `n == 1` and the output has no batch dim.
    pub batched: bool,
    pub n: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub groups: usize,
    pub in_size: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Padding before (top/left) each dim.
    pub pad_begin: [usize; 2],
    /// Padding after (bottom/right) each dim; also holds `output_padding` extras of a transpose.
    pub pad_end: [usize; 2],
    pub out_size: [usize; 2],
}

impl ConvGeometry {
    pub fn c_in_per_group(&self) -> usize {
        self.c_in / self.groups
    }
    pub fn c_out_per_group(&self) -> usize {
        self.c_out / self.groups
    }
    /// The output shape in the user's rank (`[N, C_out, (H,) W]`, no `N` if unbatched).
    pub fn out_shape(&self) -> Dims {
        let mut d: Dims = SmallVec::new();
        if self.batched {
            d.push(self.n);
        }
        d.push(self.c_out);
        if self.spatial == 2 {
            d.push(self.out_size[0]);
        }
        d.push(self.out_size[1]);
        d
    }
    /// Multiply-adds x 2 of a forward convolution.
    pub fn flops(&self) -> f64 {
        2.0 * (self.n * self.c_out * self.out_size[0] * self.out_size[1]) as f64
            * (self.c_in_per_group() * self.kernel[0] * self.kernel[1]) as f64
    }
}

/// A resolved transposed convolution (2-D form as in [`ConvGeometry`]).
/// `weight` is `[C_in, C_out/groups, kH, kW]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvTransposeGeometry {
    pub spatial: usize,
    pub batched: bool,
    pub n: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub groups: usize,
    pub in_size: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    pub padding: [usize; 2],
    pub output_padding: [usize; 2],
    pub out_size: [usize; 2],
}

impl ConvTransposeGeometry {
    pub fn c_in_per_group(&self) -> usize {
        self.c_in / self.groups
    }
    pub fn c_out_per_group(&self) -> usize {
        self.c_out / self.groups
    }
    pub fn out_shape(&self) -> Dims {
        let mut d: Dims = SmallVec::new();
        if self.batched {
            d.push(self.n);
        }
        d.push(self.c_out);
        if self.spatial == 2 {
            d.push(self.out_size[0]);
        }
        d.push(self.out_size[1]);
        d
    }
}

/// Expands a one-or-per-dim argument to `spatial` values, in 2-D form (`[fill, v]` for 1-D).
fn expand(op: &str, name: &str, v: &[usize], spatial: usize, fill: usize) -> Result<[usize; 2]> {
    let vals: Vec<usize> = match v.len() {
        1 => vec![v[0]; spatial],
        l if l == spatial => v.to_vec(),
        _ if spatial == 1 => bail!(op, "{name} {} must have 1 value", fmt_dims(v)),
        _ => bail!(op, "{name} {} must have 1 or {spatial} values", fmt_dims(v)),
    };
    Ok(if spatial == 1 {
        [fill, vals[0]]
    } else {
        [vals[0], vals[1]]
    })
}

fn spatial_of(op: &str, weight: &[usize], what: &str) -> Result<usize> {
    let want = if op.ends_with("1d") {
        Some(1)
    } else if op.ends_with("2d") {
        Some(2)
    } else {
        None
    };
    match (weight.len(), want) {
        (3, None | Some(1)) => Ok(1),
        (4, None | Some(2)) => Ok(2),
        (_, Some(1)) => bail!(op, "weight {} must be 3-D [{what}, kW]", fmt_dims(weight)),
        _ => bail!(
            op,
            "weight {} must be 4-D [{what}, kH, kW]",
            fmt_dims(weight)
        ),
    }
}

/// Splits input into (batched, n, c, in_size) for `spatial` dims.
fn split_input(
    op: &str,
    input: &[usize],
    weight: &[usize],
    spatial: usize,
) -> Result<(bool, usize, usize, [usize; 2])> {
    let batched = if input.len() == spatial + 2 {
        true
    } else if input.len() == spatial + 1 {
        false
    } else {
        bail!(
            op,
            "input {} must be {}-D (unbatched) or {}-D (batched) for weight {}",
            fmt_dims(input),
            spatial + 1,
            spatial + 2,
            fmt_dims(weight)
        );
    };
    let b = usize::from(batched);
    let n = if batched { input[0] } else { 1 };
    let c = input[b];
    let sz = if spatial == 1 {
        [1, input[b + 1]]
    } else {
        [input[b + 1], input[b + 2]]
    };
    Ok((batched, n, c, sz))
}

fn check_positive(op: &str, name: &str, v: [usize; 2], spatial: usize) -> Result<()> {
    if v.contains(&0) {
        let shown: &[usize] = if spatial == 1 { &v[1..] } else { &v };
        bail!(op, "{name} {} must be positive", fmt_dims(shown));
    }
    Ok(())
}

fn check_bias(op: &str, bias: Option<&[usize]>, c_out: usize, weight: &[usize]) -> Result<()> {
    if let Some(b) = bias {
        if b != [c_out] {
            bail!(
                op,
                "bias {} does not match out_channels {c_out} of weight {}",
                fmt_dims(b),
                fmt_dims(weight)
            );
        }
    }
    Ok(())
}

/// Resolves `padding` into per-dim `(begin, end)` amounts, for the given
/// per-dim kernel sizes, dilation and stride (all of the same length).
///
/// ```
/// use kiln_ir::op::conv::{resolve_padding, Padding};
/// // 'same' with an even kernel pads one less on the left, as PyTorch does.
/// let p = resolve_padding("conv2d", &Padding::Same, &[4, 3], &[1, 2], &[1, 1]).unwrap();
/// assert_eq!(p, vec![(1, 2), (2, 2)]);
/// ```
pub fn resolve_padding(
    op: &str,
    padding: &Padding,
    kernel: &[usize],
    dilation: &[usize],
    stride: &[usize],
) -> Result<Vec<(usize, usize)>> {
    let nd = kernel.len();
    match padding {
        Padding::Valid => Ok(vec![(0, 0); nd]),
        Padding::Explicit(p) => {
            if p.len() == 1 {
                Ok(vec![(p[0], p[0]); nd])
            } else if p.len() == nd {
                Ok(p.iter().map(|&x| (x, x)).collect())
            } else {
                bail!(op, "padding {} must have 1 or {nd} values", fmt_dims(p))
            }
        }
        Padding::Same => {
            if stride.iter().any(|&s| s != 1) {
                bail!(
                    op,
                    "padding='same' requires stride 1, got stride {}",
                    fmt_dims(stride)
                );
            }
            Ok(kernel
                .iter()
                .zip(dilation)
                .map(|(&k, &d)| {
                    let total = d * k.saturating_sub(1);
                    (total / 2, total - total / 2)
                })
                .collect())
        }
    }
}

/// Resolves and checks a `conv1d`/`conv2d` call (`op` names it in errors; its
/// `1d`/`2d` suffix, if any, must agree with the weight's rank).
/// `input` is `[N, C_in, (H,) W]` or unbatched `[C_in, (H,) W]`;
/// `weight` is `[C_out, C_in/groups, (kH,) kW]`; `bias` is `[C_out]`.
pub fn conv_geometry(
    op: &str,
    input: &[usize],
    weight: &[usize],
    bias: Option<&[usize]>,
    params: &ConvParams,
) -> Result<ConvGeometry> {
    let spatial = spatial_of(op, weight, "out_channels, in_channels/groups")?;
    let (batched, n, c_in, in_size) = split_input(op, input, weight, spatial)?;
    let groups = params.groups;
    if groups == 0 {
        bail!(op, "groups must be positive, got 0");
    }
    let c_out = weight[0];
    let kernel = if spatial == 1 {
        [1, weight[2]]
    } else {
        [weight[2], weight[3]]
    };
    if c_in != weight[1] * groups {
        bail!(
            op,
            "input {} has {c_in} channels but weight {} with groups={groups} expects {}",
            fmt_dims(input),
            fmt_dims(weight),
            weight[1] * groups
        );
    }
    if !c_out.is_multiple_of(groups) {
        bail!(
            op,
            "weight {}: out_channels {c_out} is not divisible by groups={groups}",
            fmt_dims(weight)
        );
    }
    check_bias(op, bias, c_out, weight)?;
    let stride = expand(op, "stride", &params.stride, spatial, 1)?;
    let dilation = expand(op, "dilation", &params.dilation, spatial, 1)?;
    check_positive(op, "stride", stride, spatial)?;
    check_positive(op, "dilation", dilation, spatial)?;
    let sp = 2 - spatial;
    let pads = resolve_padding(
        op,
        &params.padding,
        &kernel[sp..],
        &dilation[sp..],
        &stride[sp..],
    )?;
    let (mut pad_begin, mut pad_end) = ([0; 2], [0; 2]);
    for (i, &(b, e)) in pads.iter().enumerate() {
        pad_begin[sp + i] = b;
        pad_end[sp + i] = e;
    }
    let mut out_size = [0usize; 2];
    let mut bad = false;
    let mut shown = Vec::new();
    for d in 0..2 {
        let eff = dilation[d] as i64 * (kernel[d] as i64 - 1) + 1;
        let padded = (in_size[d] + pad_begin[d] + pad_end[d]) as i64;
        let o = if padded < eff {
            0
        } else {
            (padded - eff) / stride[d] as i64 + 1
        };
        if o <= 0 || kernel[d] == 0 {
            bad = true;
        }
        out_size[d] = o.max(0) as usize;
        if d >= sp {
            shown.push(o);
        }
    }
    if bad {
        let shown: Vec<String> = shown.iter().map(|x| x.to_string()).collect();
        bail!(
            op,
            "input {} with padding {} is too small for weight {} (dilation {}): output size would be [{}]",
            fmt_dims(input),
            fmt_pads(&pad_begin[sp..], &pad_end[sp..]),
            fmt_dims(weight),
            fmt_dims(&dilation[sp..]),
            shown.join(",")
        );
    }
    Ok(ConvGeometry {
        spatial,
        batched,
        n,
        c_in,
        c_out,
        groups,
        in_size,
        kernel,
        stride,
        dilation,
        pad_begin,
        pad_end,
        out_size,
    })
}

fn fmt_pads(b: &[usize], e: &[usize]) -> String {
    if b == e {
        fmt_dims(b)
    } else {
        let v: Vec<String> = b.iter().zip(e).map(|(x, y)| format!("({x},{y})")).collect();
        format!("[{}]", v.join(","))
    }
}

/// Output shape of `conv1d`/`conv2d`; see [`conv_geometry`].
///
/// ```
/// use kiln_ir::op::conv::{conv_shape, ConvParams, Padding};
/// let p = ConvParams { padding: Padding::Explicit(vec![1]), ..Default::default() };
/// let s = conv_shape("conv2d", &[8, 64, 56, 56], &[64, 64, 3, 3], None, &p).unwrap();
/// assert_eq!(s.as_slice(), &[8, 64, 56, 56]);
/// let e = conv_shape("conv2d", &[2, 3, 8, 8], &[4, 2, 3, 3], None, &ConvParams::default()).unwrap_err();
/// assert_eq!(e.to_string(), "conv2d: input [2,3,8,8] has 3 channels but weight [4,2,3,3] with groups=1 expects 2");
/// ```
pub fn conv_shape(
    op: &str,
    input: &[usize],
    weight: &[usize],
    bias: Option<&[usize]>,
    params: &ConvParams,
) -> Result<Dims> {
    Ok(conv_geometry(op, input, weight, bias, params)?.out_shape())
}

/// Resolves and checks `conv_transpose1d`/`conv_transpose2d`.
/// `input` is `[N, C_in, (H,) W]` (or unbatched), `weight` `[C_in, C_out/groups, (kH,) kW]`.
/// Output size per dim: `(in-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1`.
pub fn conv_transpose_geometry(
    op: &str,
    input: &[usize],
    weight: &[usize],
    bias: Option<&[usize]>,
    params: &ConvTransposeParams,
) -> Result<ConvTransposeGeometry> {
    let spatial = spatial_of(op, weight, "in_channels, out_channels/groups")?;
    let (batched, n, c_in, in_size) = split_input(op, input, weight, spatial)?;
    let groups = params.groups;
    if groups == 0 {
        bail!(op, "groups must be positive, got 0");
    }
    if c_in != weight[0] {
        bail!(
            op,
            "input {} has {c_in} channels but weight {} expects {} (weight is [in_channels, out_channels/groups, ...])",
            fmt_dims(input),
            fmt_dims(weight),
            weight[0]
        );
    }
    if !c_in.is_multiple_of(groups) {
        bail!(
            op,
            "weight {}: in_channels {c_in} is not divisible by groups={groups}",
            fmt_dims(weight)
        );
    }
    let c_out = weight[1] * groups;
    check_bias(op, bias, c_out, weight)?;
    let kernel = if spatial == 1 {
        [1, weight[2]]
    } else {
        [weight[2], weight[3]]
    };
    let stride = expand(op, "stride", &params.stride, spatial, 1)?;
    let dilation = expand(op, "dilation", &params.dilation, spatial, 1)?;
    let padding = expand(op, "padding", &params.padding, spatial, 0)?;
    let output_padding = expand(op, "output_padding", &params.output_padding, spatial, 0)?;
    check_positive(op, "stride", stride, spatial)?;
    check_positive(op, "dilation", dilation, spatial)?;
    let sp = 2 - spatial;
    for d in sp..2 {
        if output_padding[d] >= stride[d] && output_padding[d] >= dilation[d] {
            bail!(
                op,
                "output_padding {} must be smaller than either stride {} or dilation {}",
                fmt_dims(&output_padding[sp..]),
                fmt_dims(&stride[sp..]),
                fmt_dims(&dilation[sp..])
            );
        }
    }
    let mut out_size = [0usize; 2];
    let mut shown = Vec::new();
    let mut bad = false;
    for d in 0..2 {
        let o = (in_size[d] as i64 - 1) * stride[d] as i64 - 2 * padding[d] as i64
            + dilation[d] as i64 * (kernel[d] as i64 - 1)
            + output_padding[d] as i64
            + 1;
        if o <= 0 || kernel[d] == 0 || in_size[d] == 0 {
            bad = true;
        }
        out_size[d] = o.max(0) as usize;
        if d >= sp {
            shown.push(o.to_string());
        }
    }
    if bad {
        bail!(
            op,
            "input {} with weight {}, stride {} and padding {}: output size would be [{}]",
            fmt_dims(input),
            fmt_dims(weight),
            fmt_dims(&stride[sp..]),
            fmt_dims(&padding[sp..]),
            shown.join(",")
        );
    }
    Ok(ConvTransposeGeometry {
        spatial,
        batched,
        n,
        c_in,
        c_out,
        groups,
        in_size,
        kernel,
        stride,
        dilation,
        padding,
        output_padding,
        out_size,
    })
}

/// Output shape of `conv_transpose2d`; see [`conv_transpose_geometry`].
pub fn conv_transpose2d_shape(
    input: &[usize],
    weight: &[usize],
    bias: Option<&[usize]>,
    params: &ConvTransposeParams,
) -> Result<Dims> {
    Ok(conv_transpose_geometry("conv_transpose2d", input, weight, bias, params)?.out_shape())
}

#[cfg(test)]
mod tests;
