//! Tracing a model for export: once at the example sizes and, with dynamic
//! dims, at the other sizes [`symbolic::sample_sizes`] names, through the
//! tracer `compile()` uses.

use super::symbolic::{self, Affine, Samples};
use super::{Dim, DynamicDim, ExportedModel, Source, TensorSpec};
use crate::compile::trace::{self, Binding};
use crate::nn::{Module, ModuleExt};
use crate::{Result, Tensor};
use kiln_ir::graph::{Constant, NodeOp};
use kiln_ir::op::Op;
use kiln_ir::{bail, Error};

/// Exports a module's `forward` traced on `example` (one input), with the
/// dims in `dynamic` left free. The model should be in eval mode: BatchNorm
/// in training mode or Dropout drawing masks is an error.
///
/// ```no_run
/// # let model = kiln::nn::Linear::new(4, 2, true)?;
/// let x = kiln::Tensor::zeros(&[8, 4], kiln::DType::F32);
/// let m = kiln::export::export(&model, &[x], &[kiln::export::DynamicDim::new(0, 0, "batch")])?;
/// assert_eq!(m.signature(), "(input: f32[batch,4]) -> (output: f32[batch,2])");
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn export<M: Module>(
    model: &M,
    example: &[Tensor],
    dynamic: &[DynamicDim],
) -> Result<ExportedModel> {
    let names = module_names("export", model, example)?;
    export_fn(
        "forward",
        |xs| Ok(vec![model.forward(&xs[0])?]),
        &names,
        example,
        dynamic,
    )
}

/// What exporting a module's one-tensor `forward` needs: the check that
/// `example` is one input, and the names of its parameters and buffers.
pub(crate) fn module_names<M: Module>(
    op: &str,
    model: &M,
    example: &[Tensor],
) -> Result<Vec<(String, Tensor)>> {
    if example.len() != 1 {
        bail!(
            op,
            "a module's forward takes one input, got {} example inputs (use export_fn for several)",
            example.len()
        );
    }
    let mut names = model.named_parameters();
    names.extend(model.named_buffers());
    Ok(names)
}

/// Exports a function of several tensors (`names` names the tensors it
/// captures, e.g. a module's `named_parameters()`; others are `c0`, `c1`, ...).
pub fn export_fn(
    name: &str,
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    names: &[(String, Tensor)],
    example: &[Tensor],
    dynamic: &[DynamicDim],
) -> Result<ExportedModel> {
    export_traced(name, f, names, example, dynamic, false)
}

/// [`export_fn`]; with `scoped`, the export scopes the model records (an
/// LSTM) are collapsed into placeholders for the ONNX writer (see
/// [`super::scopes`]), and the result only serves to write ONNX.
pub(crate) fn export_traced(
    name: &str,
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    names: &[(String, Tensor)],
    example: &[Tensor],
    dynamic: &[DynamicDim],
    scoped: bool,
) -> Result<ExportedModel> {
    let (dim_names, base, which) = dims_of(example, dynamic)?;
    let _ng = crate::autograd::no_grad();
    let sizes = symbolic::sample_sizes(&base);
    let mut texts = vec![];
    let mut out_dims: Vec<Vec<Vec<usize>>> = vec![];
    let mut first = None;
    let mut scopes = vec![];
    for (k, s) in sizes.iter().enumerate() {
        let inputs = if k == 0 {
            example.to_vec()
        } else {
            resized(example, &which, s)?
        };
        let traced = || trace::trace(name, &inputs, names, |xs| f(xs));
        let traced = if scoped {
            trace::recording_scopes(traced)?
        } else {
            traced()?
        };
        let (mut tr, outs) = match traced {
            Ok(r) => r,
            Err(b) => bail!("export", "cannot trace `{name}`: {b}"),
        };
        check_inference(name, &tr)?;
        let sc = if scoped {
            super::scopes::collapse(&mut tr)?
        } else {
            vec![]
        };
        fold_uniform_captures(&mut tr, names)?;
        texts.push(tr.graph.to_text());
        out_dims.push(outs.iter().map(|o| o.dims().to_vec()).collect());
        if k == 0 {
            scopes = sc;
            super::scopes::renumber(&mut scopes, &tr.graph.numbering());
            first = Some(tr);
        }
    }
    let tr = first.expect("at least one trace");
    let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
    let template = symbolic::fit(&Samples {
        base: &base,
        texts: &refs,
    })?;
    let mut sources = vec![];
    let mut weights = vec![];
    for (id, b) in tr.graph.inputs().iter().zip(&tr.bindings) {
        let NodeOp::Input { name: key } = &tr.graph.node(*id).op else {
            unreachable!("graph inputs are input nodes")
        };
        match b {
            Binding::Arg(i) => sources.push(Source::Arg(*i)),
            Binding::Captured(t) => {
                sources.push(Source::Weight(key.clone()));
                // a copy: training the model further leaves the export as it was
                weights.push((key.clone(), t.contiguous()?.copy()?));
            }
            Binding::Tangent(_) | Binding::Random(_) => unreachable!("checked above"),
        }
    }
    let spec_name = |what: &str, i: usize, n: usize| {
        if n == 1 {
            what.to_string()
        } else {
            format!("{what}_{i}")
        }
    };
    let inputs = example
        .iter()
        .enumerate()
        .map(|(i, x)| TensorSpec {
            name: spec_name("input", i, example.len()),
            dtype: x.dtype(),
            dims: (0..x.rank())
                .map(|d| match which.iter().find(|w| w.0 == i && w.1 == d) {
                    Some(w) => Dim::Dynamic(dim_names[w.2].clone()),
                    None => Dim::Fixed(x.dims()[d]),
                })
                .collect(),
        })
        .collect();
    let outs_meta: Vec<_> = tr
        .graph
        .outputs()
        .iter()
        .map(|o| tr.graph.meta(*o).cloned())
        .collect::<Result<_>>()?;
    let n_out = outs_meta.len();
    let outputs = outs_meta
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let dims = (0..m.dims.len())
                .map(|d| output_dim(&out_dims, &base, &dim_names, i, d))
                .collect::<Result<_>>()?;
            Ok(TensorSpec {
                name: spec_name("output", i, n_out),
                dtype: m.dtype,
                dims,
            })
        })
        .collect::<Result<_>>()?;
    Ok(ExportedModel {
        name: name.to_string(),
        inputs,
        outputs,
        dim_names,
        example_dims: base,
        template,
        sources,
        weights,
        graphs: Default::default(),
        scopes,
    })
}

/// A dynamic dim's place: (input, dim, index into the dims' names).
type Place = (usize, usize, usize);

/// The dims' names in order of first appearance, their example sizes, and
/// each dynamic (input, dim)'s name index; checks the requests.
fn dims_of(
    example: &[Tensor],
    dynamic: &[DynamicDim],
) -> Result<(Vec<String>, Vec<usize>, Vec<Place>)> {
    let (mut names, mut base, mut which): (Vec<String>, Vec<usize>, Vec<Place>) =
        (vec![], vec![], vec![]);
    for d in dynamic {
        let Some(x) = example.get(d.input) else {
            bail!(
                "export",
                "dynamic dim `{}` names input {}, but there are {} example inputs",
                d.name,
                d.input,
                example.len()
            );
        };
        if d.dim >= x.rank() {
            bail!(
                "export",
                "dynamic dim `{}` names dim {} of input {}, which has shape {:?}",
                d.name,
                d.dim,
                d.input,
                x.dims()
            );
        }
        let ok = d
            .name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && d.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            bail!(
                "export",
                "dynamic dim name `{}` is not an identifier",
                d.name
            );
        }
        if which.iter().any(|w| w.0 == d.input && w.1 == d.dim) {
            bail!(
                "export",
                "dim {} of input {} is named twice",
                d.dim,
                d.input
            );
        }
        let size = x.dims()[d.dim];
        let k = match names.iter().position(|n| *n == d.name) {
            Some(k) if base[k] != size => bail!(
                "export",
                "dynamic dim `{}` is {} in one example input and {size} in input {}",
                d.name,
                base[k],
                d.input
            ),
            Some(k) => k,
            None => {
                names.push(d.name.clone());
                base.push(size);
                names.len() - 1
            }
        };
        which.push((d.input, d.dim, k));
    }
    Ok((names, base, which))
}

/// The example inputs with each dynamic dim resized to `sizes` (rows repeated cyclically).
fn resized(example: &[Tensor], which: &[Place], sizes: &[usize]) -> Result<Vec<Tensor>> {
    let mut out = example.to_vec();
    for &(i, d, k) in which {
        let n = out[i].dims()[d];
        let idx: Vec<i64> = (0..sizes[k]).map(|j| (j % n.max(1)) as i64).collect();
        let idx = Tensor::from_vec(idx, &[sizes[k]])?;
        out[i] = out[i].index_select(d as i64, &idx)?;
    }
    Ok(out)
}

/// Refuses a trace that is not pure inference.
/// A tensor the traced code made itself (not one of `names`, the
/// parameters and buffers) whose elements are all one value, such as an
/// LSTM's zero initial state, becomes a constant node: its shape then
/// follows the dynamic dims (it is fitted with the rest of the graph text)
/// instead of being stored as a weight at the example size.
fn fold_uniform_captures(tr: &mut trace::Trace, names: &[(String, Tensor)]) -> Result<()> {
    let g = &tr.graph;
    let mut fold: Vec<Option<f64>> = vec![None; g.len()];
    let mut keep = vec![];
    for (id, b) in g.inputs().iter().zip(&tr.bindings) {
        let value = match b {
            Binding::Captured(t) if !names.iter().any(|(_, n)| n.is_same(t)) && t.numel() > 0 => {
                let v = t.to_f64_vec();
                let same = v.iter().all(|x| x.to_bits() == v[0].to_bits()) && v[0].is_finite();
                same.then_some(v[0])
            }
            _ => None,
        };
        match value {
            Some(v) => fold[id.index()] = Some(v),
            None => keep.push(b.clone()),
        }
    }
    if fold.iter().all(|f| f.is_none()) {
        return Ok(());
    }
    let mut k = 0;
    let graph = g.rewrite(|out, node, _| {
        let i = k;
        k += 1;
        match (fold[i], &node.op) {
            (Some(v), NodeOp::Input { .. }) => {
                let meta = node.metas[0].clone();
                Ok(Some(out.constant(Constant::full(v, meta))?))
            }
            _ => Ok(None),
        }
    })?;
    tr.graph = graph;
    tr.bindings = keep;
    Ok(())
}

fn check_inference(name: &str, tr: &trace::Trace) -> Result<()> {
    let train_mode = "call model.eval() before exporting (export records inference)";
    if !tr.mutations.is_empty() {
        bail!(
            "export",
            "`{name}` updates state in place while running (BatchNorm's running stats in training mode?); {train_mode}"
        );
    }
    for b in &tr.bindings {
        match b {
            Binding::Random(_) => bail!(
                "export",
                "`{name}` draws random numbers (Dropout in training mode?); {train_mode}"
            ),
            Binding::Tangent(_) => {
                bail!("export", "`{name}`: a gradient input in an inference trace")
            }
            _ => {}
        }
    }
    for (_, n) in tr.graph.iter() {
        if let NodeOp::Op(Op::BatchNorm { training: true, .. }) = &n.op {
            bail!(
                "export",
                "`{name}` runs batch_norm in training mode (batch statistics); {train_mode}"
            );
        }
    }
    Ok(())
}

/// Output `i`'s dim `d` over the traces: fixed, or a fitted expression of the dims.
fn output_dim(
    out_dims: &[Vec<Vec<usize>>],
    base: &[usize],
    names: &[String],
    i: usize,
    d: usize,
) -> Result<Dim> {
    let v: Vec<i64> = out_dims.iter().map(|t| t[i][d] as i64).collect();
    if v.iter().all(|x| *x == v[0]) {
        return Ok(Dim::Fixed(v[0] as usize));
    }
    let mut e = Affine {
        constant: 0,
        coefs: (0..base.len()).map(|k| v[1 + k] - v[0]).collect(),
    };
    e.constant = v[0] - e.eval(base);
    let last = symbolic::sample_sizes(base).pop().unwrap();
    if e.eval(&last) != *v.last().unwrap() {
        return Err(Error::op(
            "export",
            format!("output {i} dim {d} depends on the dynamic dims other than linearly"),
        ));
    }
    Ok(Dim::Dynamic(e.display(names)))
}
