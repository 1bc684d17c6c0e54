//! KernelIR: one loop nest over an index space, with strided loads, a
//! pointwise body and optionally one reduction along the innermost loop axis.
//!
//! A kernel knows dtypes, the loop rank and, per operand, whether its
//! innermost stride is 1, 0 or anything else — never sizes or strides, which
//! arrive as arguments at launch (see [`KernelFn`]). So one compiled kernel
//! serves every batch size, and views or broadcasts cost nothing: they are
//! just other strides.
//!
//! ```text
//! kernel add(rank=2) {
//!   out0: f32 contiguous
//!   in1: f32 contiguous
//!   in2: f32 broadcast
//!   %0 = load in1 : f32
//!   %1 = load in2 : f32
//!   %2 = add %0, %1 : f32
//!   store %2
//! }
//! ```

use kiln_ir::{BinaryOp, DType, ReduceKind, UnaryOp};
use std::fmt::{self, Write};

/// Index of a value: position of its instruction in `Kernel::body` (or `Kernel::epilogue`,
/// whose values are numbered after the body's).
pub type ValueId = usize;

/// How an operand moves along the innermost loop axis; part of the kernel's
/// signature, so the emitter can use vector loads for `Contiguous` and a splat
/// for `Broadcast`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Inner {
    /// innermost stride 1
    Contiguous,
    /// innermost stride 0
    Broadcast,
    /// any other stride
    Strided,
}

impl Inner {
    pub fn of_stride(s: isize) -> Inner {
        match s {
            1 => Inner::Contiguous,
            0 => Inner::Broadcast,
            _ => Inner::Strided,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Inner::Contiguous => "contiguous",
            Inner::Broadcast => "broadcast",
            Inner::Strided => "strided",
        }
    }
}

/// A tensor operand. Operand 0 is always an output (see [`Kernel::outputs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Operand {
    /// Storage dtype. f16/bf16 only for backends that have them (the interpreter,
    /// CUDA); for the CPU JIT the runtime widens those to f32 around kernels.
    pub dtype: DType,
    pub inner: Inner,
}

/// One SSA instruction; its result has the dtype stored beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Instr {
    /// Load operand `n` at the current index, in its storage dtype. Only a
    /// pointwise kernel may load an output (n < [`Kernel::outputs`]): it reads
    /// the value from before this index's stores (an in-place update).
    Load(usize),
    /// Runtime scalar argument `n` (its dtype is `Kernel::scalars[n]`).
    Scalar(usize),
    /// A constant (stored as f64 bits so the instruction can be hashed).
    Const(u64),
    Unary(UnaryOp, ValueId),
    /// Operands share the dtype of the left operand; comparisons yield Bool.
    Binary(BinaryOp, ValueId, ValueId),
    /// `cond ? a : b`
    Where(ValueId, ValueId, ValueId),
    Cast(ValueId),
    /// The finished reduction's value (only in an epilogue).
    Acc,
    /// Another result of a two-part reduction (only in an epilogue).
    AccPart(AccPart),
}

/// The results a reduction gives besides `acc` (see [`crate::online`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccPart {
    /// `lse`: the shift c, the row max (the lowest finite value when the
    /// row has nothing above it), with `acc = c + logsum`.
    Shift,
    /// `lse`: `log Σ exp(x - c)`, NaN when c is +inf. `x - lse` is
    /// `(x - shift) - logsum`, exact where rounding `lse` to the dtype is not.
    LogSum,
    /// `welford`: the mean (`acc` is the biased variance).
    Mean,
}

impl AccPart {
    pub fn name(self) -> &'static str {
        match self {
            AccPart::Shift => "shift",
            AccPart::LogSum => "logsum",
            AccPart::Mean => "mean",
        }
    }
    /// The reduction kind that gives this part.
    pub fn kind(self) -> ReduceKind {
        match self {
            AccPart::Shift | AccPart::LogSum => ReduceKind::LogSumExp,
            AccPart::Mean => ReduceKind::Welford,
        }
    }
}

/// The reduction along the innermost loop axis.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reduction {
    pub kind: ReduceKind,
    /// The body value being reduced.
    pub value: ValueId,
    /// Accumulator dtype (i64 for arg-reductions, the value's dtype otherwise).
    pub dtype: DType,
}

/// A kernel: `out[idx] = body(loads at idx)` over all indices, or with a
/// reduction, `out[kept idx] = epilogue(reduce over the innermost axis of body)`.
///
/// A pointwise kernel may have several outputs (a fused optimizer step
/// writes the parameter and its moments in one loop): `extra_out[j]` goes
/// to operand `1 + j`. At each index every stored value is computed before
/// any is stored, so an output may also be loaded (`p = p - lr * g`); such
/// a kernel must then run once per index (disjoint `start..end` splits, and
/// one call at rank 0, whose single point every call with `start == 0` computes).
///
/// Loads in the epilogue read at reduce index 0 (their operands have stride 0
/// along the reduced axis, e.g. a per-row scale).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// What the kernel computes, for dumps and profiles (`gelu`, `softmax.sum`).
    pub name: String,
    /// Number of loop dims; with a reduction the last one is reduced.
    pub rank: usize,
    /// The outputs first (operand 0, and 1..=`extra_out.len()` when
    /// pointwise), then the inputs.
    pub operands: Vec<Operand>,
    /// Dtypes of the runtime scalar arguments.
    pub scalars: Vec<DType>,
    pub body: Vec<(Instr, DType)>,
    pub reduce: Option<Reduction>,
    /// Instructions after the reduction; ids continue after the body's.
    pub epilogue: Vec<(Instr, DType)>,
    /// The value stored to operand 0 (a body value, or an epilogue value when reducing).
    pub out: ValueId,
    /// With a reduction, values stored after `out` at the next elements of
    /// operand 0: each output element is then a tuple of `1 + extra_out.len()`
    /// values (a trailing dim of that size with stride 1), e.g. (mean, rstd).
    /// Without one, the values stored to operands 1, 2, ... (one each).
    pub extra_out: Vec<ValueId>,
    /// With a reduction: a second pass over the reduced row once the
    /// epilogue has run (see [`RowPass`]).
    pub rows: Option<RowPass>,
}

/// A pass over a reduction's row after its epilogue, storing one value per
/// element of the row: a softmax's `exp((x - shift) - logsum)` or a
/// layer_norm's `(x - mean) * rstd * w + b` in the same kernel as the
/// reduction, while the row just read is still in cache — one read of the
/// input from memory instead of two, and one launch instead of two.
///
/// Its instructions' ids continue after the epilogue's. They may use
/// epilogue values (one per row) and their own; a load reads its operand at
/// the element (epilogue operands, of stride 0 along the row, give the same
/// value at every element). The result goes to operand 1, the kernel's
/// second output, whose stride along the row is that of a full tensor.
///
/// ```text
/// kernel softmax(rank=2) {
///   out0: f32 broadcast        (shift, logsum) per row
///   out1: f32 contiguous       the row pass's output
///   in2: f32 contiguous
///   %0 = load in2 : f32
///   reduce lse %0 over dim 1 : f32
///   %1 = acc : f32
///   %2 = acc.shift : f32
///   %3 = acc.logsum : f32
///   store %2, %3
///   row:
///   %4 = load in2 : f32
///   %5 = sub %4, %2 : f32
///   %6 = sub %5, %3 : f32
///   %7 = exp %6 : f32
///   store out1 %7
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowPass {
    pub instrs: Vec<(Instr, DType)>,
    /// The value stored to operand 1 at each element.
    pub out: ValueId,
}

/// The machine-code ABI of a compiled kernel.
///
/// - `ptrs[k]`: base pointer of operand k (already offset by its storage offset);
/// - `strides[k * rank + d]`: stride of operand k along loop dim d, in elements
///   (the output has stride 0 along a reduced axis);
/// - `sizes[d]`: loop extent of dim d;
/// - `scalars[n]`: scalar argument n as 8 bytes: an f64 for float dtypes, an i64 otherwise;
/// - dim 0 runs over `start..end` only, so threads can split it.
pub type KernelFn = unsafe extern "C" fn(
    ptrs: *const *mut u8,
    strides: *const isize,
    sizes: *const usize,
    scalars: *const u64,
    start: usize,
    end: usize,
);

impl Kernel {
    /// A pointwise kernel (output operand 0, no reduction, epilogue or row
    /// pass) storing body value `out`.
    ///
    /// ```
    /// use kiln_codegen::{Inner, Kernel, KernelBuilder, Operand};
    /// use kiln_ir::DType;
    /// let mut b = KernelBuilder::default();
    /// let x = b.load(1, DType::F32);
    /// let op = |inner| Operand { dtype: DType::F32, inner };
    /// let k = Kernel::pointwise("copy", 1, vec![op(Inner::Contiguous); 2], vec![], b.instrs, x);
    /// assert!(k.reduce.is_none());
    /// ```
    pub fn pointwise(
        name: &str,
        rank: usize,
        operands: Vec<Operand>,
        scalars: Vec<DType>,
        body: Vec<(Instr, DType)>,
        out: ValueId,
    ) -> Kernel {
        Kernel {
            name: name.into(),
            rank,
            operands,
            scalars,
            body,
            reduce: None,
            epilogue: vec![],
            out,
            extra_out: vec![],
            rows: None,
        }
    }

    /// dtype of value `v` (body or epilogue).
    pub fn dtype_of(&self, v: ValueId) -> DType {
        self.instr(v).1
    }

    /// Value `v`'s instruction: body, then epilogue, then row-pass ids.
    pub fn instr(&self, v: ValueId) -> (Instr, DType) {
        let (nb, ne) = (self.body.len(), self.epilogue.len());
        if v < nb {
            self.body[v]
        } else if v < nb + ne {
            self.epilogue[v - nb]
        } else {
            self.rows.as_ref().expect("a row-pass value").instrs[v - nb - ne]
        }
    }

    /// The epilogue values the row pass reads (none without one), in order.
    pub fn row_pass_reads(&self) -> Vec<ValueId> {
        let Some(rows) = &self.rows else {
            return vec![];
        };
        let first = self.body.len() + self.epilogue.len();
        let mut ids: Vec<ValueId> = rows
            .instrs
            .iter()
            .flat_map(|(ins, _)| {
                let (args, n) = crate::interp::instr_args(ins);
                args[..n].to_vec()
            })
            .filter(|&a| a < first)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// How many values the kernel defines (body, epilogue and row pass).
    pub fn values(&self) -> usize {
        let rows = self.rows.as_ref().map_or(0, |r| r.instrs.len());
        self.body.len() + self.epilogue.len() + rows
    }

    /// Number of output operands (the leading ones): 1 with a reduction
    /// (a tuple store stays in operand 0; 2 with a row pass),
    /// `1 + extra_out.len()` without.
    pub fn outputs(&self) -> usize {
        if self.reduce.is_some() {
            1 + usize::from(self.rows.is_some())
        } else {
            1 + self.extra_out.len()
        }
    }

    /// Every store as (operand, element offset from the index, value), in
    /// the order backends must evaluate them.
    pub fn stores(&self) -> Vec<(usize, usize, ValueId)> {
        let all = std::iter::once(self.out).chain(self.extra_out.iter().copied());
        if self.reduce.is_some() {
            all.enumerate().map(|(t, v)| (0, t, v)).collect()
        } else {
            all.enumerate().map(|(o, v)| (o, 0, v)).collect()
        }
    }

    /// The stable text form used by snapshots and `KILN_LOG=kernels`.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = self.write_text(&mut s);
        s
    }

    fn write_text(&self, s: &mut String) -> fmt::Result {
        writeln!(s, "kernel {}(rank={}) {{", self.name, self.rank)?;
        for (k, o) in self.operands.iter().enumerate() {
            let role = if k < self.outputs() { "out" } else { "in" };
            writeln!(s, "  {role}{k}: {} {}", o.dtype, o.inner.name())?;
        }
        for (n, d) in self.scalars.iter().enumerate() {
            writeln!(s, "  scalar{n}: {d}")?;
        }
        let nout = self.outputs();
        let write_instrs =
            |s: &mut String, instrs: &[(Instr, DType)], base: usize| -> fmt::Result {
                for (i, (ins, dt)) in instrs.iter().enumerate() {
                    write!(s, "  %{} = ", base + i)?;
                    match ins {
                        Instr::Load(k) if *k < nout => write!(s, "load out{k}")?,
                        Instr::Load(k) => write!(s, "load in{k}")?,
                        Instr::Scalar(n) => write!(s, "scalar{n}")?,
                        Instr::Const(bits) => write!(s, "const {:?}", f64::from_bits(*bits))?,
                        Instr::Unary(op, a) => write!(s, "{op} %{a}")?,
                        Instr::Binary(op, a, b) => write!(s, "{op} %{a}, %{b}")?,
                        Instr::Where(c, a, b) => write!(s, "where %{c}, %{a}, %{b}")?,
                        Instr::Cast(a) => write!(s, "cast %{a}")?,
                        Instr::Acc => write!(s, "acc")?,
                        Instr::AccPart(p) => write!(s, "acc.{}", p.name())?,
                    }
                    writeln!(s, " : {dt}")?;
                }
                Ok(())
            };
        write_instrs(s, &self.body, 0)?;
        if let Some(r) = &self.reduce {
            writeln!(
                s,
                "  reduce {} %{} over dim {} : {}",
                r.kind,
                r.value,
                self.rank - 1,
                r.dtype
            )?;
            write_instrs(s, &self.epilogue, self.body.len())?;
        }
        write!(s, "  store %{}", self.out)?;
        for v in &self.extra_out {
            write!(s, ", %{v}")?;
        }
        writeln!(s)?;
        if let Some(r) = &self.rows {
            writeln!(s, "  row:")?;
            write_instrs(s, &r.instrs, self.body.len() + self.epilogue.len())?;
            writeln!(s, "  store out1 %{}", r.out)?;
        }
        write!(s, "}}")?;
        writeln!(s)
    }
}

/// Builds a kernel body instruction by instruction.
#[derive(Debug, Default)]
pub struct KernelBuilder {
    pub instrs: Vec<(Instr, DType)>,
}

impl KernelBuilder {
    pub fn push(&mut self, i: Instr, dt: DType) -> ValueId {
        self.instrs.push((i, dt));
        self.instrs.len() - 1
    }
    pub fn load(&mut self, operand: usize, dt: DType) -> ValueId {
        self.push(Instr::Load(operand), dt)
    }
    pub fn scalar(&mut self, n: usize, dt: DType) -> ValueId {
        self.push(Instr::Scalar(n), dt)
    }
    pub fn constant(&mut self, v: f64, dt: DType) -> ValueId {
        self.push(Instr::Const(v.to_bits()), dt)
    }
    pub fn unary(&mut self, op: UnaryOp, a: ValueId, dt: DType) -> ValueId {
        self.push(Instr::Unary(op, a), dt)
    }
    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId, dt: DType) -> ValueId {
        self.push(Instr::Binary(op, a, b), dt)
    }
    pub fn select(&mut self, c: ValueId, a: ValueId, b: ValueId, dt: DType) -> ValueId {
        self.push(Instr::Where(c, a, b), dt)
    }
    /// Casts `a` to `to` unless it already has that dtype.
    pub fn cast(&mut self, a: ValueId, to: DType) -> ValueId {
        if self.instrs[a].1 == to {
            a
        } else {
            self.push(Instr::Cast(a), to)
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
