//! The line `explain()` prints for each conv of a compiled graph: which CPU
//! algorithm computes it and how that was chosen (timed on this machine,
//! or the heuristic while it has not been timed).

use kiln_ir::graph::{Graph, NodeOp};
use kiln_ir::op::conv::conv_geometry;
use kiln_ir::op::Op;
use kiln_ir::shape::fmt_dims;
use kiln_ir::DType;
use kiln_runtime::externs::conv::select::{describe, Chosen};

/// `conv2d [8,64,56,56] * [64,64,3,3]: winograd-f2x2-3x3 (timed)`
/// for every conv node of `g`.
pub fn conv_algorithms(g: &Graph) -> Vec<String> {
    g.iter()
        .filter_map(|(_, n)| {
            let NodeOp::Op(Op::Conv { params, spatial }) = &n.op else {
                return None;
            };
            let (x, w) = (g.meta(n.operands[0]).ok()?, g.meta(n.operands[1]).ok()?);
            let op = if *spatial == 1 { "conv1d" } else { "conv2d" };
            let geo = conv_geometry(op, &x.dims, &w.dims, None, params).ok()?;
            let dtype = match x.dtype.compute() {
                DType::F64 => "f64",
                _ => "f32",
            };
            let how = match describe(&geo, dtype) {
                Chosen::Timed(a) => format!("{} (timed)", a.name()),
                Chosen::Heuristic(a) => format!("{} (heuristic, not timed yet)", a.name()),
                Chosen::Forced(a) => format!("{} (forced)", a.name()),
            };
            Some(format!(
                "{op} {} * {}: {how}",
                fmt_dims(&x.dims),
                fmt_dims(&w.dims)
            ))
        })
        .collect()
}
