//! Building one KernelIR for an eager op and launching it: the eager path's
//! "one-node graph". Every pointwise op and reduction in `ops` goes through here.

use crate::Tensor;
use kiln_codegen::{
    AccPart, Inner, Instr, Kernel, KernelBuilder, Operand, Reduction, RowPass, ValueId,
};
use kiln_ir::op::view::broadcast_to;
use kiln_ir::op::Layout;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result, UnaryOp};

/// Incrementally builds a kernel over tensors and scalars.
pub(crate) struct KernelCall {
    b: KernelBuilder,
    /// Destinations known up front ([`KernelCall::with_outputs`]); empty for
    /// the usual single output chosen at the end.
    outs: Vec<Tensor>,
    inputs: Vec<Tensor>,
    scalars: Vec<DType>,
    scalar_bits: Vec<u64>,
    /// Operand of the first input: 1, or 2 for a reduction with a row pass.
    first_input: usize,
}

/// The row pass of [`KernelCall::reduce_with_rows`]: `emit(call, parts)`
/// gives the value stored to `out` at each element of the row, from the
/// epilogue's values `parts`.
pub(crate) struct Rows<'a> {
    pub out: &'a Tensor,
    pub emit: &'a mut dyn FnMut(&mut KernelCall, &[ValueId]) -> ValueId,
}

/// dtype a kernel sees for a storage dtype: f16/bf16 are widened by the runtime.
fn kernel_dtype(d: DType) -> DType {
    d.compute()
}

impl KernelCall {
    pub fn new() -> KernelCall {
        KernelCall {
            b: KernelBuilder::default(),
            outs: vec![],
            inputs: vec![],
            scalars: vec![],
            scalar_bits: vec![],
            first_input: 1,
        }
    }

    /// A call for [`KernelCall::reduce_with_rows`] (its inputs start at operand 2).
    pub fn for_rows() -> KernelCall {
        KernelCall {
            first_input: 2,
            ..KernelCall::new()
        }
    }

    /// Loads `t` (broadcast to the output later) and casts it to `compute`.
    pub fn input(&mut self, t: &Tensor, compute: DType) -> ValueId {
        let v = self.load(t);
        self.b.cast(v, compute)
    }

    /// A call storing to several tensors of the same dims in one loop
    /// ([`KernelCall::store_many`]); a load of one of them (same storage and
    /// layout) reads it in place, before this index's stores.
    pub fn with_outputs(outs: &[Tensor]) -> KernelCall {
        KernelCall {
            outs: outs.to_vec(),
            ..KernelCall::new()
        }
    }

    /// Loads `t` in the dtype kernels see for its storage (f16/bf16 as f32).
    pub fn load(&mut self, t: &Tensor) -> ValueId {
        let dt = kernel_dtype(t.dtype());
        let same = |o: &Tensor| o.shares_storage(t) && o.layout() == t.layout();
        if let Some(j) = self.outs.iter().position(same) {
            return self.b.load(j, dt);
        }
        // one operand per distinct input: a row pass re-reading its
        // reduction's input then loads the operand the reduction reads
        let first = self.outs.len().max(self.first_input);
        let j = match self.inputs.iter().position(same) {
            Some(j) => j,
            None => {
                self.inputs.push(t.clone());
                self.inputs.len() - 1
            }
        };
        self.b.load(first + j, dt)
    }

    /// Casts `a` to `to` (no-op when it already has that dtype).
    pub fn cast(&mut self, a: ValueId, to: DType) -> ValueId {
        self.b.cast(a, to)
    }

    /// A runtime scalar argument of dtype `dt` (so a new value reuses the kernel).
    pub fn scalar(&mut self, v: f64, dt: DType) -> ValueId {
        self.scalars.push(dt);
        self.scalar_bits.push(if dt.is_float() {
            v.to_bits()
        } else {
            v as i64 as u64
        });
        self.b.scalar(self.scalars.len() - 1, dt)
    }

    /// Scalar argument `n` again (a second use of one value, e.g. by a row
    /// pass recomputing its reduction's prologue).
    pub fn scalar_again(&mut self, n: usize) -> ValueId {
        self.b.scalar(n, self.scalars[n])
    }

    /// How many scalar arguments the call has so far.
    pub fn scalar_count(&self) -> usize {
        self.scalars.len()
    }

    pub fn unary(&mut self, op: UnaryOp, a: ValueId, dt: DType) -> ValueId {
        self.b.unary(op, a, dt)
    }
    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId, dt: DType) -> ValueId {
        let rdt = if op.is_comparison() { DType::Bool } else { dt };
        self.b.binary(op, a, b, rdt)
    }
    pub fn select(&mut self, c: ValueId, a: ValueId, b: ValueId, dt: DType) -> ValueId {
        self.b.select(c, a, b, dt)
    }
    /// A part of the finished reduction (only in an epilogue), of dtype `dt`.
    pub fn acc_part(&mut self, p: AccPart, dt: DType) -> ValueId {
        self.b.push(Instr::AccPart(p), dt)
    }
    pub fn dtype_of(&self, v: ValueId) -> DType {
        self.b.instrs[v].1
    }

    /// Where the result goes: the inputs' device.
    fn device(&self) -> kiln_runtime::Device {
        crate::device::device_of(self.inputs.iter().chain(&self.outs))
    }

    /// The tracer's safety net: a launch on a traced value outside any
    /// recording op would bake that value into the graph as a constant.
    fn check_launch(&self, name: &str) -> Result<()> {
        if !crate::compile::trace::is_tracing() {
            return Ok(());
        }
        let ins: Vec<&Tensor> = self.inputs.iter().collect();
        crate::compile::trace::check_launch(name, &ins)
    }

    fn operands(&self, out: DType) -> Vec<Operand> {
        let mut ops = vec![Operand {
            dtype: kernel_dtype(out),
            inner: Inner::Contiguous,
        }];
        ops.extend(self.inputs.iter().map(|t| Operand {
            dtype: kernel_dtype(t.dtype()),
            inner: Inner::Contiguous,
        }));
        ops
    }

    /// Writes `value` into `out` at every index of `out`'s shape (inputs broadcast to it).
    pub fn store_into(self, name: &str, value: ValueId, out: &Tensor) -> Result<()> {
        self.store_into_with(name, value, out, |k, views, scalars| {
            kiln_runtime::launch(k, views, scalars)
        })
    }

    /// [`KernelCall::store_into`], handing the kernel, its views (the output
    /// first) and scalar bits to `launch` (a conv that runs it as its epilogue).
    pub fn store_into_with(
        mut self,
        name: &str,
        value: ValueId,
        out: &Tensor,
        launch: impl FnOnce(&Kernel, &[kiln_runtime::View], &[u64]) -> Result<()>,
    ) -> Result<()> {
        self.check_launch(name)?;
        let value = self.b.cast(value, kernel_dtype(out.dtype()));
        let layouts = self
            .inputs
            .iter()
            .map(|t| broadcast_to(t.layout(), out.dims()).map_err(|e| rename(e, name)))
            .collect::<Result<Vec<Layout>>>()?;
        let k = Kernel {
            name: name.to_string(),
            rank: out.rank(),
            operands: self.operands(out.dtype()),
            scalars: self.scalars.clone(),
            body: std::mem::take(&mut self.b.instrs),
            reduce: None,
            epilogue: vec![],
            out: value,
            extra_out: vec![],
            rows: None,
        };
        let mut views = vec![out.runtime_view()];
        views.extend(
            self.inputs
                .iter()
                .zip(&layouts)
                .map(|(t, l)| kiln_runtime::View {
                    storage: &t.storage,
                    layout: l,
                }),
        );
        launch(&k, &views, &self.scalar_bits)
    }

    /// Writes `values[j]` into output `j` of [`KernelCall::with_outputs`]
    /// (all of the same dims; inputs broadcast to them), as one kernel.
    pub fn store_many(mut self, name: &str, values: &[ValueId]) -> Result<()> {
        self.check_launch(name)?;
        let outs = std::mem::take(&mut self.outs);
        if outs.is_empty() || outs.len() != values.len() {
            kiln_ir::bail!(name, "{} values for {} outputs", values.len(), outs.len());
        }
        let dims = outs[0].dims().to_vec();
        if let Some(o) = outs.iter().find(|o| o.dims() != dims.as_slice()) {
            kiln_ir::bail!(name, "outputs of shapes {:?} and {:?}", dims, o.dims());
        }
        let values: Vec<ValueId> = values
            .iter()
            .zip(&outs)
            .map(|(&v, o)| self.b.cast(v, kernel_dtype(o.dtype())))
            .collect();
        let layouts = self
            .inputs
            .iter()
            .map(|t| broadcast_to(t.layout(), &dims).map_err(|e| rename(e, name)))
            .collect::<Result<Vec<Layout>>>()?;
        let mut operands: Vec<Operand> = outs
            .iter()
            .map(|o| Operand {
                dtype: kernel_dtype(o.dtype()),
                inner: Inner::Contiguous,
            })
            .collect();
        operands.extend(self.operands(DType::F32).into_iter().skip(1));
        let k = Kernel {
            name: name.to_string(),
            rank: dims.len(),
            operands,
            scalars: self.scalars.clone(),
            body: std::mem::take(&mut self.b.instrs),
            reduce: None,
            epilogue: vec![],
            out: values[0],
            extra_out: values[1..].to_vec(),
            rows: None,
        };
        let mut views: Vec<kiln_runtime::View> = outs.iter().map(|o| o.runtime_view()).collect();
        views.extend(
            self.inputs
                .iter()
                .zip(&layouts)
                .map(|(t, l)| kiln_runtime::View {
                    storage: &t.storage,
                    layout: l,
                }),
        );
        kiln_runtime::launch(&k, &views, &self.scalar_bits)
    }

    /// A new tensor of `dims` and `dtype` holding `value`.
    pub fn finish(
        self,
        name: &str,
        value: ValueId,
        dims: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        let out = Tensor::empty_for(name, dims, dtype, self.device())?;
        self.store_into(name, value, &out)?;
        Ok(out)
    }

    /// Reduces `value` over the LAST dim of `loop_dims` (inputs are laid out so
    /// that dim is the reduced one), applies `epilogue` to the accumulator, and
    /// returns a tensor of `loop_dims` without the last dim — with a trailing
    /// dim holding them when the epilogue gives several values per row.
    ///
    /// `epilogue(call, acc)` may add loads of tensors whose shape broadcasts to
    /// the kept dims; they are read once per output element.
    pub fn reduce(
        self,
        name: &str,
        kind: ReduceKind,
        value: ValueId,
        loop_dims: &[usize],
        out_dtype: DType,
        epilogue: impl FnOnce(&mut KernelCall, ValueId) -> Vec<ValueId>,
    ) -> Result<Tensor> {
        self.reduce_with_rows(name, kind, value, loop_dims, out_dtype, epilogue, None)
    }

    /// [`KernelCall::reduce`], then (with `rows`) a row pass in the same
    /// kernel writing `rows.out` (of `loop_dims`; the call must come from
    /// [`KernelCall::for_rows`]): loads it adds read each element of the row.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_with_rows(
        mut self,
        name: &str,
        kind: ReduceKind,
        value: ValueId,
        loop_dims: &[usize],
        out_dtype: DType,
        epilogue: impl FnOnce(&mut KernelCall, ValueId) -> Vec<ValueId>,
        rows: Option<Rows>,
    ) -> Result<Tensor> {
        let acc_dtype = match kind {
            ReduceKind::ArgMax | ReduceKind::ArgMin => DType::I64,
            _ => self.dtype_of(value),
        };
        let n_body = self.b.instrs.len();
        let n_body_inputs = self.inputs.len();
        let acc = self.b.push(Instr::Acc, acc_dtype);
        let res: Vec<ValueId> = epilogue(&mut self, acc);
        self.check_launch(name)?;
        let res: Vec<ValueId> = res
            .into_iter()
            .map(|r| self.b.cast(r, kernel_dtype(out_dtype)))
            .collect();
        let (n_epi, n_epi_inputs) = (self.b.instrs.len(), self.inputs.len());
        let row_out = match rows {
            Some(r) => {
                let v = (r.emit)(&mut self, &res);
                let v = self.b.cast(v, kernel_dtype(r.out.dtype()));
                Some((r.out, v))
            }
            None => None,
        };
        let kept = &loop_dims[..loop_dims.len() - 1];
        let mut out_dims = kept.to_vec();
        if res.len() > 1 {
            // tuples are stored in the kernel's dtype: never widened around it
            debug_assert!(!out_dtype.is_half());
            out_dims.push(res.len());
        }
        let out = Tensor::empty_for(name, &out_dims, out_dtype, self.device())?;
        let mut out_layout = out.layout().clone();
        out_layout.dims.truncate(kept.len());
        out_layout.strides.truncate(kept.len());
        out_layout.dims.push(*loop_dims.last().unwrap());
        out_layout.strides.push(0);
        let mut layouts = vec![];
        for (i, t) in self.inputs.iter().enumerate() {
            let l = if i < n_body_inputs || i >= n_epi_inputs {
                broadcast_to(t.layout(), loop_dims)
            } else {
                // epilogue operands: broadcast over the kept dims, stride 0 along the reduced one
                broadcast_to(t.layout(), kept).map(|mut l| {
                    l.dims.push(*loop_dims.last().unwrap());
                    l.strides.push(0);
                    l
                })
            };
            layouts.push(l.map_err(|e| rename(e, name))?);
        }
        let mut body = std::mem::take(&mut self.b.instrs);
        let row_instrs = body.split_off(n_epi);
        let epi = body.split_off(n_body);
        let mut operands = self.operands(out_dtype);
        if let Some((t, _)) = row_out {
            operands.insert(
                1,
                Operand {
                    dtype: kernel_dtype(t.dtype()),
                    inner: Inner::Contiguous,
                },
            );
        }
        let k = Kernel {
            name: name.to_string(),
            rank: loop_dims.len(),
            operands,
            scalars: self.scalars.clone(),
            body,
            reduce: Some(Reduction {
                kind,
                value,
                dtype: acc_dtype,
            }),
            epilogue: epi,
            out: res[0],
            extra_out: res[1..].to_vec(),
            rows: row_out.map(|(_, v)| RowPass {
                instrs: row_instrs,
                out: v,
            }),
        };
        let mut views = vec![kiln_runtime::View {
            storage: &out.storage,
            layout: &out_layout,
        }];
        if let Some((t, _)) = row_out {
            if t.dims() != loop_dims {
                kiln_ir::bail!(
                    name,
                    "row pass output {:?} over rows {:?}",
                    t.dims(),
                    loop_dims
                );
            }
            views.push(t.runtime_view());
        }
        views.extend(
            self.inputs
                .iter()
                .zip(&layouts)
                .map(|(t, l)| kiln_runtime::View {
                    storage: &t.storage,
                    layout: l,
                }),
        );
        kiln_runtime::launch(&k, &views, &self.scalar_bits)?;
        Ok(out)
    }
}

fn rename(e: kiln_ir::Error, op: &str) -> kiln_ir::Error {
    match e {
        kiln_ir::Error::Op { msg, .. } => kiln_ir::Error::op(op, msg),
        other => other,
    }
}
