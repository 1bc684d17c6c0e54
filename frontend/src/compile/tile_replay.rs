//! A CPU conv's tiled epilogue, prepared once for replay: its KernelIR is
//! built on a probe tile, specialised for every `[channels, positions]`
//! tile and compiled once; each operand is then described by an offset and
//! strides per sample, channel and position, so a warm call computes each
//! tile's pointers and calls the machine code (no KernelIR per tile).

use super::epilogue::{expression, leaves_of, tile_of, Leaf};
use crate::functional as F;
use crate::ops::fuse::Lazy;
use crate::Tensor;
use kiln_codegen::{Inner, Kernel};
use kiln_ir::graph::{Graph, NodeId};
use kiln_ir::op::conv::ConvParams;
use kiln_ir::{bail, Result};
use kiln_passes::fusion::Kernel as Group;
use kiln_runtime::externs::conv::Tile;
use kiln_runtime::launch::Executable as Code;
use kiln_runtime::Storage;
use std::sync::Arc;

/// One operand of a tile kernel: where tile (0, 0, 0) starts and its
/// strides along samples, channels and positions (in elements).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TileOperand {
    pub offset: isize,
    pub strides: [isize; 3],
}

/// A tiled epilogue's machine code and operands (see the module docs).
pub(crate) struct TileCode {
    pub code: Arc<Code>,
    /// The same kernel at rank 1, for a tile of whole planes when every
    /// operand's planes follow each other: one row of `channels x plane`
    /// elements instead of `channels` rows of `plane`. A 14x14 or 7x7 row
    /// is shorter than a wide tile (`kiln_codegen::cpu::wide::TILE`), so a
    /// SiLU epilogue ran its exp at f32x4 there.
    pub flat: Option<Arc<Code>>,
    /// Output positions per channel.
    pub plane: usize,
    pub scalars: Vec<u64>,
    /// Per operand, the conv's output first.
    pub operands: Vec<TileOperand>,
}

/// A tiled epilogue ready to replay, with the tensor whose storage each
/// operand but the output reads.
pub(crate) struct TileKernel {
    pub code: TileCode,
    pub tensors: Vec<Option<Tensor>>,
}

type Template = (Kernel, Vec<u64>, Vec<(*const Storage, kiln_ir::op::Layout)>);

/// The epilogue of `group` (rooted at `root`, a conv whose epilogue runs
/// per tile) as a [`TileKernel`]; None when an operand's tile view is not a
/// fixed offset and strides of its tensor.
pub(crate) fn prepare(
    g: &Graph,
    group: &Group,
    root: NodeId,
    value: &dyn Fn(NodeId) -> Result<Tensor>,
) -> Result<Option<TileKernel>> {
    let meta = g.meta(group.root)?;
    let dims = meta.dims.clone();
    let leaves = leaves_of(g, group, value)?;
    // a stand-in output: only its layout is used
    let out = Tensor::empty(&dims, meta.dtype);
    let cols: usize = dims[2..].iter().product();
    let probe = |n: usize| Tile {
        n,
        c0: 0,
        channels: dims[1],
        p0: 0,
        cols,
    };
    let template = |t: Tile| -> Result<Template> {
        let target = tile_of(&out, &dims, t)?;
        let view = |x: &Tensor| tile_of(x, &dims, t);
        let e = expression(g, group, root, &leaves, Lazy::tensor(&target), &view)?;
        let mut got = None;
        e.materialize_into_with(&target, |k, views, scalars| {
            let vs = views
                .iter()
                .map(|v| (v.storage as *const Storage, v.layout.clone()))
                .collect();
            got = Some((k.clone(), scalars.to_vec(), vs));
            Ok(())
        })?;
        match got {
            Some(t) => Ok(t),
            None => bail!("compile", "the tile epilogue built no kernel"),
        }
    };
    let (mut kernel, scalars, first) = template(probe(0))?;
    let second = if dims[0] > 1 {
        Some(template(probe(1))?.2)
    } else {
        None
    };
    kernel.rank = 2;
    let (mut operands, mut tensors) = (vec![], vec![]);
    for (j, (p, l)) in first.iter().enumerate() {
        if l.dims.len() != 2 {
            return Ok(None);
        }
        let per_sample = match &second {
            Some(s) if s[j].0 == *p => s[j].1.offset as isize - l.offset as isize,
            Some(_) => return Ok(None),
            None => 0,
        };
        let op = TileOperand {
            offset: l.offset as isize,
            strides: [per_sample, l.strides[0], l.strides[1]],
        };
        let tensor = if *p == Arc::as_ptr(&out.storage) {
            None
        } else {
            let leaf = leaves.iter().find_map(|(_, l)| match l {
                Leaf::Tensor(t) if Arc::as_ptr(&t.storage) == *p => Some(t.clone()),
                _ => None,
            });
            match leaf {
                Some(t) => Some(t),
                None => return Ok(None),
            }
        };
        kernel.operands[j].inner = Inner::of_stride(l.strides[1]);
        operands.push(op);
        tensors.push(tensor);
    }
    if tensors.first().is_none_or(|t| t.is_some()) {
        return Ok(None);
    }
    let code = kiln_runtime::launch::compiled(&kernel)?;
    let flat = if operands
        .iter()
        .all(|o| o.strides[1] == cols as isize * o.strides[2])
    {
        kernel.rank = 1;
        Some(kiln_runtime::launch::compiled(&kernel)?)
    } else {
        None
    };
    Ok(Some(TileKernel {
        code: TileCode {
            code,
            flat,
            plane: cols,
            scalars,
            operands,
        },
        tensors,
    }))
}

/// Runs conv(`x`, `w`, `b`) applying the prepared epilogue `tc` to each
/// tile; `bases[j]` is the storage operand `j > 0` reads (index 0 is
/// unused: the output is the conv's own).
pub(crate) fn run(
    (x, w, b): (&Tensor, &Tensor, Option<&Tensor>),
    params: &ConvParams,
    spatial: usize,
    tc: &TileCode,
    bases: &[Option<Tensor>],
) -> Result<Tensor> {
    let operands = &tc.operands;
    let sizes: Vec<usize> = bases
        .iter()
        .map(|t| t.as_ref().map_or(0, |t| t.dtype().size()))
        .collect();
    let per_tile = |out: &Tensor, t: Tile| -> Result<()> {
        let flat = tc.flat.as_ref().filter(|_| t.cols == tc.plane);
        let mut ptrs = Vec::with_capacity(operands.len());
        let mut strides = Vec::with_capacity(2 * operands.len());
        for (j, o) in operands.iter().enumerate() {
            let (base, size) = match &bases[j] {
                Some(s) => (s.storage.ptr(), sizes[j]),
                None => (out.storage.ptr(), out.dtype().size()),
            };
            let at = o.offset
                + t.n as isize * o.strides[0]
                + t.c0 as isize * o.strides[1]
                + t.p0 as isize * o.strides[2];
            // SAFETY: `at` is inside the tensor the operand was recorded from
            ptrs.push(unsafe { base.offset(at * size as isize) });
            match flat {
                Some(_) => strides.push(o.strides[2]),
                None => strides.extend([o.strides[1], o.strides[2]]),
            }
        }
        // SAFETY: the kernels were specialised for these tile views: rank 2,
        // or rank 1 where every operand's planes follow each other
        unsafe {
            match flat {
                Some(f) => {
                    let n = t.channels * t.cols;
                    f.run(&ptrs, &strides, &[n], &tc.scalars, 0, n)
                }
                None => {
                    let dims = [t.channels, t.cols];
                    tc.code
                        .run(&ptrs, &strides, &dims, &tc.scalars, 0, t.channels)
                }
            }
        };
        Ok(())
    };
    // a compiled graph's convs time their algorithms (cudnn.benchmark); the
    // replay is a compiled call too, so it keeps the first call's choice
    let _scope = kiln_runtime::externs::conv::select::compiled_scope();
    F::conv_with_epilogue(x, w, b, params, spatial, &per_tile)
}
