//! A conv's pointwise epilogue applied per output tile, while the tile the
//! GEMM just wrote is in cache: the epilogue's expression is rebuilt on tile
//! views of its inputs and stored over the tile in place. On a CUDA device
//! the expression becomes part of the conv kernel itself (one launch).

use super::exec::pointwise;
use crate::functional as F;
use crate::ops::fuse::Lazy;
use crate::Tensor;
use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::op::Op;
use kiln_ir::{bail, DType, Result};
use kiln_passes::fusion::Kernel;
use kiln_runtime::externs::conv::Tile;
use std::collections::HashMap;

/// Elements of one sample's conv output below which the epilogue runs as one
/// pass after the conv rather than per tile: such an output is split into
/// tiles of a few thousand elements, each a kernel call, while a batch of it
/// (8 x 64K f32: 2 MiB) is still in cache for a second pass. At 32K,
/// MobileNetV3 compiled ran 18.2 ms (median of 5 alternating runs, Zen 5
/// AVX-512, 2 threads), at 64K 16.5 ms, with W4 and ResNet-18 unchanged.
pub const MIN_TILED_SAMPLE: usize = 64 * 1024;

/// What an epilogue reads besides the conv's output.
pub(crate) enum Leaf {
    Tensor(Tensor),
    Constant(f64, DType),
}

/// `t` (broadcast to the conv output's `dims`) restricted to `tile`, as a
/// 2-d view `[channels, cols]`; an error when the spatial dims of `t` do not
/// flatten into one stride.
pub(crate) fn tile_of(t: &Tensor, dims: &[usize], tile: Tile) -> Result<Tensor> {
    let v =
        t.expand_to(dims)?
            .select(0, tile.n as i64)?
            .narrow(0, tile.c0 as i64, tile.channels)?;
    v.view(&[tile.channels as i64, -1])?
        .narrow(1, tile.p0 as i64, tile.cols)
}

/// The epilogue of `kernel` (an extern with one) as one pending expression
/// over `value`, the extern's value; its other operands are read through `view`.
pub(crate) fn expression(
    g: &Graph,
    kernel: &Kernel,
    root: NodeId,
    leaves: &[(NodeId, Leaf)],
    value: Lazy,
    view: &dyn Fn(&Tensor) -> Result<Tensor>,
) -> Result<Lazy> {
    let mut lz: HashMap<NodeId, Lazy> = HashMap::new();
    lz.insert(kernel.root, value);
    for (id, leaf) in leaves {
        let l = match leaf {
            Leaf::Tensor(t) => Lazy::tensor(&view(t)?),
            Leaf::Constant(v, dt) => Lazy::constant(*v, *dt),
        };
        lz.insert(*id, l);
    }
    for &n in &kernel.fused {
        let node = g.node(n);
        let NodeOp::Op(op) = &node.op else {
            bail!("compile", "epilogue node {n:?} is not an op");
        };
        let args = node
            .operands
            .iter()
            .map(|o| {
                lz.get(o)
                    .ok_or_else(|| kiln_ir::Error::op("compile", "epilogue operand missing"))
            })
            .collect::<Result<Vec<_>>>()?;
        let v = pointwise(op, &args)?;
        lz.insert(n, v);
    }
    Ok(lz[&root].clone())
}

/// The epilogue of `kernel` evaluated on `out` restricted by `view`, and
/// stored over that view.
fn apply(
    g: &Graph,
    kernel: &Kernel,
    root: NodeId,
    leaves: &[(NodeId, Leaf)],
    out: &Tensor,
    view: &dyn Fn(&Tensor) -> Result<Tensor>,
) -> Result<()> {
    let target = view(out)?;
    expression(g, kernel, root, leaves, Lazy::tensor(&target), view)?.materialize_into(&target)
}

/// Runs the extern of `kernel` (a conv or a matrix product) with its
/// epilogue. On a CUDA device both are one launch where the extern has a
/// template kernel; on the CPU a conv applies the epilogue to each output
/// tile, falling back to one pass over the whole output when an input's
/// layout has no per-tile view. `value(id)` gives the stored tensors the
/// kernel reads.
pub fn run_extern_with_epilogue(
    g: &Graph,
    kernel: &Kernel,
    root: NodeId,
    value: &dyn Fn(NodeId) -> Result<Tensor>,
    min_tiled_sample: usize,
) -> Result<Tensor> {
    let ext = g.node(kernel.root);
    let NodeOp::Op(op) = &ext.op else {
        bail!(
            "compile",
            "an epilogue needs an extern op, got {}",
            ext.op_name()
        );
    };
    let ins = ext
        .operands
        .iter()
        .map(|&o| value(o))
        .collect::<Result<Vec<_>>>()?;
    let leaves = leaves_of(g, kernel, value)?;
    let one_pass = |out: Tensor| -> Result<Tensor> {
        apply(g, kernel, root, &leaves, &out, &|x: &Tensor| Ok(x.clone()))?;
        Ok(out)
    };
    match op {
        Op::Conv { params, spatial } => run_conv(
            g,
            kernel,
            root,
            &ins,
            &leaves,
            (params, *spatial),
            min_tiled_sample,
        ),
        Op::QuantizedLinear { relu } => run_qlinear(g, kernel, root, &ins, &leaves, *relu),
        Op::Matmul | Op::Linear if ins[0].device().is_cuda() => {
            // Linear is x @ w^T + bias: the bias joins the epilogue
            let (w, bias) = match op {
                Op::Linear => (ins[1].t()?, ins.get(2)),
                _ => (ins[1].clone(), None),
            };
            let epilogue = |v: &Tensor, view: &dyn Fn(&Tensor) -> Result<Tensor>| {
                let mut v = Lazy::tensor(v);
                if let Some(b) = bias {
                    let add = Op::Binary(kiln_ir::BinaryOp::Add);
                    v = pointwise(&add, &[&v, &Lazy::tensor(&view(b)?)])?;
                }
                expression(g, kernel, root, &leaves, v, view)
            };
            match F::matmul_with_epilogue_on_device(&ins[0], &w, &epilogue)? {
                Some(t) => Ok(t),
                None => one_pass(crate::compile::dispatch::run_op(op, &ins)?.remove(0)),
            }
        }
        _ => one_pass(crate::compile::dispatch::run_op(op, &ins)?.remove(0)),
    }
}

/// What an epilogue reads besides its own nodes and the extern.
pub(crate) fn leaves_of(
    g: &Graph,
    kernel: &Kernel,
    value: &dyn Fn(NodeId) -> Result<Tensor>,
) -> Result<Vec<(NodeId, Leaf)>> {
    let mut reads: Vec<NodeId> = kernel
        .fused
        .iter()
        .flat_map(|&n| g.node(n).operands.iter().copied())
        .filter(|o| *o != kernel.root && !kernel.fused.contains(o))
        .collect();
    reads.sort();
    reads.dedup();
    let mut leaves = vec![];
    for r in reads {
        let leaf = match &g.node(r).op {
            NodeOp::Const(c) if c.is_splat() && c.meta.dims.is_empty() => {
                Leaf::Constant(c.value(0), c.meta.dtype)
            }
            _ => Leaf::Tensor(value(r)?),
        };
        leaves.push((r, leaf));
    }
    Ok(leaves)
}

/// How an extern with an epilogue runs on the CPU (None: on a device, or
/// an extern that is neither a conv nor a matrix product).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuEpilogue {
    /// A conv applying the epilogue to each output tile.
    Tiled,
    /// The extern, then one pass of the epilogue over its output.
    OnePass,
    /// The extern applies the epilogue to each output tile itself (a
    /// quantized Linear): one step, whatever the tiles.
    InKernel,
}

/// Which [`CpuEpilogue`] [`run_extern_with_epilogue`] takes for `kernel`.
pub(crate) fn cpu_epilogue(
    g: &Graph,
    kernel: &Kernel,
    value: &dyn Fn(NodeId) -> Result<Tensor>,
    min_tiled_sample: usize,
) -> Result<Option<CpuEpilogue>> {
    let ext = g.node(kernel.root);
    let NodeOp::Op(op) = &ext.op else {
        return Ok(None);
    };
    let x = value(ext.operands[0])?;
    if x.device().is_cuda() {
        return Ok(None);
    }
    Ok(match op {
        Op::Conv { spatial, .. } => {
            let leaves = leaves_of(g, kernel, value)?;
            let dims = g.meta(kernel.root)?.dims.clone();
            Some(
                if conv_is_tiled(&dims, *spatial, &leaves, min_tiled_sample) {
                    CpuEpilogue::Tiled
                } else {
                    CpuEpilogue::OnePass
                },
            )
        }
        Op::QuantizedLinear { .. } => Some(CpuEpilogue::InKernel),
        _ => Some(CpuEpilogue::OnePass),
    })
}

/// The extern of `kernel` alone (its epilogue to follow with [`run_epilogue_over`]).
pub(crate) fn run_extern_only(
    g: &Graph,
    kernel: &Kernel,
    value: &dyn Fn(NodeId) -> Result<Tensor>,
) -> Result<Tensor> {
    let ext = g.node(kernel.root);
    let NodeOp::Op(op) = &ext.op else {
        bail!(
            "compile",
            "an epilogue needs an extern op, got {}",
            ext.op_name()
        );
    };
    let ins = ext
        .operands
        .iter()
        .map(|&o| value(o))
        .collect::<Result<Vec<_>>>()?;
    Ok(crate::compile::dispatch::run_op(op, &ins)?.remove(0))
}

/// The epilogue of `kernel` (rooted at `root`) in one pass over the
/// extern's output `out`, in place.
pub(crate) fn run_epilogue_over(
    g: &Graph,
    kernel: &Kernel,
    root: NodeId,
    value: &dyn Fn(NodeId) -> Result<Tensor>,
    out: &Tensor,
) -> Result<()> {
    let leaves = leaves_of(g, kernel, value)?;
    apply(g, kernel, root, &leaves, out, &|x: &Tensor| Ok(x.clone()))
}

/// Whether a CPU conv of output `dims` applies its epilogue per tile.
fn conv_is_tiled(dims: &[usize], spatial: usize, leaves: &[(NodeId, Leaf)], min: usize) -> bool {
    // tiles are (sample, channels, positions): an unbatched conv has no sample dim
    let batched = dims.len() == spatial + 2;
    if !batched || dims[0] == 0 {
        return false;
    }
    let probe = Tile {
        n: 0,
        c0: 0,
        channels: dims[1],
        p0: 0,
        cols: dims[2..].iter().product(),
    };
    // a launch per tile costs a few microseconds: worth it only when a
    // sample's output is big enough to fall out of cache before a second pass
    let big = dims[1..].iter().product::<usize>() >= min;
    big && leaves.iter().all(|(_, l)| match l {
        Leaf::Tensor(t) => tile_of(t, dims, probe).is_ok(),
        Leaf::Constant(..) => true,
    })
}

/// [`run_extern_with_epilogue`] for a conv.
fn run_conv(
    g: &Graph,
    kernel: &Kernel,
    root: NodeId,
    ins: &[Tensor],
    leaves: &[(NodeId, Leaf)],
    (params, spatial): (&kiln_ir::op::conv::ConvParams, usize),
    min_tiled_sample: usize,
) -> Result<Tensor> {
    let dims = g.meta(kernel.root)?.dims.clone();
    let b = ins.get(2);
    // a compiled graph's convs time their algorithms (cudnn.benchmark)
    let _scope = kiln_runtime::externs::conv::select::compiled_scope();
    if ins[0].device().is_cuda() {
        // one launch: the conv kernel applies the epilogue before its tile is stored
        let epilogue = |cg: &ConvGeometry, value: &Tensor| {
            let view = |t: &Tensor| F::as_nkhw(cg, &t.expand_to(&dims)?);
            expression(g, kernel, root, leaves, Lazy::tensor(value), &view)
        };
        return F::conv_with_epilogue_on_device(&ins[0], &ins[1], b, params, spatial, &epilogue);
    }
    let tiled = conv_is_tiled(&dims, spatial, leaves, min_tiled_sample);
    if tiled {
        let per_tile = |out: &Tensor, t: Tile| {
            apply(g, kernel, root, leaves, out, &|x: &Tensor| {
                tile_of(x, &dims, t)
            })
        };
        return F::conv_with_epilogue(&ins[0], &ins[1], b, params, spatial, &per_tile);
    }
    let out = crate::compile::dispatch::run_op(&conv_op(params, spatial), ins)?.remove(0);
    apply(g, kernel, root, leaves, &out, &|x: &Tensor| Ok(x.clone()))?;
    Ok(out)
}

fn conv_op(params: &kiln_ir::op::conv::ConvParams, spatial: usize) -> Op {
    Op::Conv {
        params: params.clone(),
        spatial,
    }
}

/// [`run_extern_with_epilogue`] for a quantized Linear: the int8 kernel
/// applies the epilogue to each tile of output rows right after writing it
/// (one pass after the kernel when a leaf has no per-row-tile view).
fn run_qlinear(
    g: &Graph,
    kernel: &Kernel,
    root: NodeId,
    ins: &[Tensor],
    leaves: &[(NodeId, Leaf)],
    relu: bool,
) -> Result<Tensor> {
    let dims = g.meta(kernel.root)?.dims.clone();
    let n = dims.last().copied().unwrap_or(1);
    let m: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    // rows r0..r0+rows of a value broadcast to the output, as [rows, n]
    let rows_of = |t: &Tensor, r0: usize, rows: usize| -> Result<Tensor> {
        t.expand_to(&dims)?
            .view(&[m as i64, n as i64])?
            .narrow(0, r0 as i64, rows)
    };
    let tiled = m > 0
        && leaves.iter().all(|(_, l)| match l {
            Leaf::Tensor(t) => rows_of(t, 0, m).is_ok(),
            Leaf::Constant(..) => true,
        });
    if !tiled {
        let op = Op::QuantizedLinear { relu };
        let out = crate::compile::dispatch::run_op(&op, ins)?.remove(0);
        apply(g, kernel, root, leaves, &out, &|x: &Tensor| Ok(x.clone()))?;
        return Ok(out);
    }
    let per_tile = |out: &Tensor, r0: usize, rows: usize| {
        apply(g, kernel, root, leaves, out, &|x: &Tensor| {
            rows_of(x, r0, rows)
        })
    };
    let isa = kiln_runtime::externs::qgemm::Isa::detect();
    F::quantized_linear_with(
        &ins[0],
        &ins[1],
        &ins[2],
        ins.get(3),
        relu,
        isa,
        Some(&per_tile),
    )
}
