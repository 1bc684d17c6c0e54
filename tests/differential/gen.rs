//! The seeded random graph generator of the differential test.
//!
//! A graph grows from a few random inputs (f32 mostly, some f64, i64 and
//! bool; ranks 0..=4, dims 1..=6) by appending ops — pointwise, views,
//! reductions, matmul, conv, cat and composites (`gen_composite.rs`) — whose operands come from
//! the values built so far: recent ones mostly (chains that fuse), any one
//! sometimes (values used several times: shared subexpressions, values read
//! both by views and by reductions). Each candidate op goes through the
//! builder's inference ([`Graph::op`]); an op it refuses is skipped. Inputs
//! of ops with restricted domains are guarded by extra nodes (`log(abs(x) +
//! 0.5)`, `exp(minimum(x, 3))`, divisors `abs(y) + 0.5`), which also lengthen
//! the pointwise chains. Every value nobody reads becomes a graph output, and
//! sometimes an intermediate too (it must then be stored mid-chain).

use kiln_ir::graph::eval::HostTensor;
use kiln_ir::graph::{Constant, Graph, NodeId, ScalarValue};
use kiln_ir::op::{Domain, UnaryDtype};
use kiln_ir::op::{Meta, Op};
use kiln_ir::{BinaryOp, DType, Float, UnaryOp};

#[path = "gen_composite.rs"]
mod composite;
#[path = "gen_shapes.rs"]
mod shapes;

/// splitmix64: small, seedable, good enough to pick shapes and ops.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as usize) as i64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform() < p
    }
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

/// A generated test case: the graph, its inputs, which inputs are captured
/// parameters (hoisting applies to values computed only from them).
pub struct Case {
    pub graph: Graph,
    pub inputs: Vec<HostTensor>,
    pub captured: Vec<bool>,
    /// Per input: its values were drawn freely (any value of its dtype is
    /// valid); `false` for inputs with a domain (variances, class weights,
    /// class indices), which the backward mode keeps or only rescales.
    pub free: Vec<bool>,
}

pub(crate) struct Gen {
    pub(crate) rng: Rng,
    pub(crate) g: Graph,
    pub(crate) inputs: Vec<HostTensor>,
    pub(crate) captured: Vec<bool>,
    pub(crate) free: Vec<bool>,
    /// Values ops may read (every single-valued node so far).
    pub(crate) pool: Vec<NodeId>,
}

fn un(u: UnaryOp) -> Op {
    Op::Unary(u)
}
fn bin(b: BinaryOp) -> Op {
    Op::Binary(b)
}
fn scal(op: BinaryOp, v: f64) -> Op {
    Op::BinaryScalar {
        op,
        value: ScalarValue::Float(Float(v)),
        reversed: false,
    }
}

/// One random element of a free input of type `dtype`: floats mostly
/// normal (clamped to +-3), a tenth small integers (exact zeros and ties);
/// integers in -4..=4; bools 0 or 1.
pub fn draw(rng: &mut Rng, dtype: DType) -> f64 {
    match dtype {
        DType::Bool => rng.below(2) as f64,
        d if d.is_float() => {
            let v = if rng.chance(0.1) {
                rng.range(-2, 2) as f64
            } else {
                rng.normal().clamp(-3.0, 3.0)
            };
            if d == DType::F32 {
                v as f32 as f64
            } else {
                v
            }
        }
        _ => rng.range(-4, 4) as f64,
    }
}

/// The float unary ops of the op table the generator draws (`unary`
/// guards each op's inputs by its table domain; ops with jumps other than
/// floor are left to the corpus tests, whose inputs the error analysis
/// need not bound).
fn float_unary() -> Vec<UnaryOp> {
    UnaryOp::EXAMPLES
        .into_iter()
        .filter(|u| !matches!(u.domain(), Domain::Bool | Domain::Integer | Domain::Jump))
        .map(|u| match u {
            // a slope that matters next to the other terms
            UnaryOp::LeakyRelu { .. } => UnaryOp::LeakyRelu { slope: Float(0.2) },
            u => u,
        })
        .collect()
}

/// The integer-preserving unary ops of the table.
fn int_unary() -> Vec<UnaryOp> {
    UnaryOp::EXAMPLES
        .into_iter()
        .filter(|u| matches!(u.dtype_rule(), UnaryDtype::Keep | UnaryDtype::KeepNoBool))
        .filter(|u| u.domain() == Domain::Any)
        .collect()
}

impl Gen {
    pub(crate) fn meta(&self, id: NodeId) -> Meta {
        self.g.meta(id).expect("single value").clone()
    }

    pub(crate) fn shape(&mut self, max_rank: usize) -> Vec<usize> {
        let rank = self.rng.range(0, max_rank as i64) as usize;
        (0..rank).map(|_| self.rng.range(1, 6) as usize).collect()
    }

    /// A new graph input with random contents of `meta`'s type.
    pub(crate) fn input(&mut self, meta: Meta, captured: bool) -> NodeId {
        let n: usize = meta.dims.iter().product();
        let data: Vec<f64> = (0..n).map(|_| draw(&mut self.rng, meta.dtype)).collect();
        let id = self.input_data(meta, data, captured);
        *self.free.last_mut().expect("just pushed") = true;
        id
    }

    /// A new graph input holding `data` (values of `meta`'s dtype).
    pub(crate) fn input_data(&mut self, meta: Meta, data: Vec<f64>, captured: bool) -> NodeId {
        let data = if meta.dtype == DType::F32 {
            data.iter().map(|&v| v as f32 as f64).collect()
        } else {
            data
        };
        let name = format!("in{}", self.inputs.len());
        let id = self.g.input(name, meta.clone());
        self.inputs.push(HostTensor { meta, data });
        self.captured.push(captured);
        self.free.push(false);
        self.pool.push(id);
        id
    }

    fn random_input(&mut self) -> NodeId {
        let dtype = match self.rng.below(10) {
            0 => DType::F64,
            1 => DType::I64,
            2 => DType::Bool,
            _ => DType::F32,
        };
        let dims = self.shape(4);
        let cap = self.rng.chance(0.2);
        self.input(Meta::new(dtype, &dims), cap)
    }

    /// A pool value: a recent one mostly, any one sometimes.
    pub(crate) fn operand(&mut self) -> NodeId {
        let n = self.pool.len();
        if self.rng.chance(0.6) {
            self.pool[n - 1 - self.rng.below(n.min(3))]
        } else {
            self.pool[self.rng.below(n)]
        }
    }

    /// A pool value satisfying `ok`, if some random tries find one.
    pub(crate) fn operand_where(&mut self, ok: impl Fn(&Meta) -> bool) -> Option<NodeId> {
        for _ in 0..12 {
            let id = self.operand();
            if ok(&self.meta(id)) {
                return Some(id);
            }
        }
        None
    }

    /// Appends `op` if inference accepts it (the new value joins the pool).
    pub(crate) fn op(&mut self, op: Op, args: &[NodeId]) -> Option<NodeId> {
        let id = self.g.op(op, args).ok()?;
        self.pool.push(id);
        Some(id)
    }

    /// A shape `b` broadcasts against `a`: a suffix of it with some dims 1.
    pub(crate) fn bcast_shape(&mut self, a: &[usize]) -> Vec<usize> {
        let keep = self.rng.range(0, a.len() as i64) as usize;
        let mut d: Vec<usize> = a[a.len() - keep..].to_vec();
        for x in d.iter_mut() {
            if self.rng.chance(0.3) {
                *x = 1;
            }
        }
        if self.rng.chance(0.15) {
            d.insert(0, self.rng.range(1, 3) as usize);
        }
        d
    }

    /// A second operand for a binary op with `a`: a pool value of a
    /// broadcast-compatible shape, a new input, or a constant.
    fn partner(&mut self, a: NodeId) -> NodeId {
        let ma = self.meta(a);
        let compatible = |m: &Meta| {
            kiln_ir::shape::broadcast_shapes("gen", &m.dims, &ma.dims).is_ok()
                && m.dtype != DType::Bool
        };
        match self.rng.below(10) {
            0..=4 => {
                if let Some(b) = self.operand_where(compatible) {
                    return b;
                }
                let d = self.bcast_shape(&ma.dims);
                self.input(Meta::new(ma.dtype, &d), false)
            }
            5 => {
                let v = self.rng.range(-3, 3) as f64 * 0.5;
                let dt = if ma.dtype.is_float() {
                    ma.dtype
                } else {
                    DType::F32
                };
                let c = self.g.constant(Constant::scalar(v, dt)).expect("scalar");
                self.pool.push(c);
                c
            }
            _ => {
                let d = self.bcast_shape(&ma.dims);
                let dt = if ma.dtype == DType::Bool {
                    DType::F32
                } else {
                    ma.dtype
                };
                let cap = self.rng.chance(0.3);
                self.input(Meta::new(dt, &d), cap)
            }
        }
    }

    /// `abs(x) + 0.5`: a float value safe for log, sqrt, division, pow.
    fn positive(&mut self, x: NodeId) -> Option<NodeId> {
        let x = if self.meta(x).dtype.is_float() {
            x
        } else {
            self.op(Op::Cast(DType::F32), &[x])?
        };
        let a = self.op(un(UnaryOp::Abs), &[x])?;
        let off = self.rng.pick(&[0.5, 1.0]);
        self.op(scal(BinaryOp::Add, off), &[a])
    }

    fn unary(&mut self) -> Option<NodeId> {
        let x = self.operand();
        let m = self.meta(x);
        if m.dtype == DType::Bool {
            return self.op(un(UnaryOp::Not), &[x]);
        }
        if !m.dtype.is_float() && self.rng.chance(0.5) {
            let u = self.rng.pick(&int_unary());
            return self.op(un(u), &[x]);
        }
        let u = self.rng.pick(&float_unary());
        let x = match u.domain() {
            Domain::Positive => self.positive(x)?,
            Domain::NonNegative => self.op(un(UnaryOp::Abs), &[x])?,
            Domain::Capped => self.op(scal(BinaryOp::Minimum, 3.0), &[x])?,
            // tanh(x) * 0.9 lies inside (-1, 1)
            Domain::Unit => {
                let t = self.op(un(UnaryOp::Tanh), &[x])?;
                self.op(scal(BinaryOp::Mul, 0.9), &[t])?
            }
            // sigmoid(x) * 0.9 + 0.05 lies inside (0, 1)
            Domain::Probability => {
                let t = self.op(un(UnaryOp::Sigmoid), &[x])?;
                let t = self.op(scal(BinaryOp::Mul, 0.9), &[t])?;
                self.op(scal(BinaryOp::Add, 0.05), &[t])?
            }
            _ => x,
        };
        self.op(un(u), &[x])
    }

    fn binary(&mut self) -> Option<NodeId> {
        use BinaryOp::*;
        let a = self.operand();
        let ma = self.meta(a);
        if ma.dtype == DType::Bool {
            let b = self.operand_where(|m| m.dtype == DType::Bool)?;
            let op = self.rng.pick(&[And, Or, Eq, Ne]);
            return self.op(bin(op), &[a, b]);
        }
        let ops: Vec<BinaryOp> = BinaryOp::ALL
            .into_iter()
            .filter(|b| {
                matches!(
                    b.domain(),
                    Domain::Any | Domain::PositiveRhs | Domain::PowLike
                )
            })
            .collect();
        let op = self.rng.pick(&ops);
        let mut b = self.partner(a);
        let mut a = a;
        match op.domain() {
            Domain::PositiveRhs => {
                b = if self.meta(b).dtype.is_float() || op == Div {
                    self.positive(b)?
                } else {
                    let ab = self.op(un(UnaryOp::Abs), &[b])?;
                    self.op(
                        Op::BinaryScalar {
                            op: Add,
                            value: ScalarValue::Int(1),
                            reversed: false,
                        },
                        &[ab],
                    )?
                };
            }
            Domain::PowLike => {
                a = self.positive(a)?;
                // a small exponent keeps the result in range
                let t = self.op(un(UnaryOp::Tanh), &[b]).or(Some(b))?;
                b = self.op(scal(Mul, 2.0), &[t])?;
            }
            _ => {}
        }
        if self.rng.chance(0.2) {
            std::mem::swap(&mut a, &mut b);
            if matches!(op.domain(), Domain::PositiveRhs | Domain::PowLike) {
                std::mem::swap(&mut a, &mut b);
            }
        }
        self.op(bin(op), &[a, b])
    }

    fn binary_scalar(&mut self) -> Option<NodeId> {
        use BinaryOp::*;
        let x = self.operand();
        let m = self.meta(x);
        if m.dtype == DType::Bool {
            let op = self.rng.pick(&[And, Or, Eq, Mul, Add]);
            let v = ScalarValue::Bool(self.rng.chance(0.5));
            let reversed = self.rng.chance(0.5);
            let op = Op::BinaryScalar {
                op,
                value: v,
                reversed,
            };
            return self.op(op, &[x]);
        }
        let op = self.rng.pick(&[
            Add, Sub, Mul, Div, Maximum, Minimum, Pow, Remainder, Gt, Le, Eq,
        ]);
        let value = if self.rng.chance(0.3) {
            ScalarValue::Int(self.rng.range(1, 3))
        } else {
            ScalarValue::Float(Float(self.rng.pick(&[0.5, 1.5, 2.0, -0.75, 3.0, 0.1])))
        };
        let reversed = self.rng.chance(0.3);
        let x = match (op, reversed) {
            (Div | Remainder, true) => self.positive(x)?,
            (Pow, false) => self.positive(x)?,
            (Pow, true) => self.op(scal(Minimum, 2.0), &[x])?,
            _ => x,
        };
        let value = match (op, value) {
            (Div | Remainder, ScalarValue::Float(f)) if !reversed => {
                ScalarValue::Float(Float(f.0.abs() + 0.5))
            }
            (Pow, ScalarValue::Float(f)) if reversed => ScalarValue::Float(Float(f.0.abs() + 0.5)),
            (_, v) => v,
        };
        self.op(
            Op::BinaryScalar {
                op,
                value,
                reversed,
            },
            &[x],
        )
    }

    fn where_(&mut self) -> Option<NodeId> {
        let c = match self.operand_where(|m| m.dtype == DType::Bool) {
            Some(c) if self.rng.chance(0.5) => c,
            _ => {
                let x = self.operand_where(|m| m.dtype != DType::Bool)?;
                let y = self.partner(x);
                {
                    let op = self.rng.pick(&[BinaryOp::Lt, BinaryOp::Ge]);
                    self.op(bin(op), &[x, y])?
                }
            }
        };
        let a = self.operand_where(|m| m.dtype != DType::Bool)?;
        let b = self.partner(a);
        self.op(Op::Where, &[c, a, b])
    }

    fn cast(&mut self) -> Option<NodeId> {
        let x = self.operand();
        let to = self
            .rng
            .pick(&[DType::F32, DType::F32, DType::F64, DType::I64, DType::Bool]);
        self.op(Op::Cast(to), &[x])
    }

    fn step(&mut self) -> Option<NodeId> {
        match self.rng.below(24) {
            0..=3 => self.unary(),
            4..=7 => self.binary(),
            8..=9 => self.binary_scalar(),
            10 => self.where_(),
            11 => self.cast(),
            12..=14 => self.view(),
            15..=16 => self.reduce(),
            17 => self.matmul(),
            18 => self.conv(),
            19 => self.cat(),
            _ => self.composite(),
        }
    }
}

/// Generates the graph of attempt `attempt` for `seed` (deterministic).
pub fn generate(seed: u64, attempt: u64) -> Case {
    let mut s = Gen {
        rng: Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(attempt)),
        g: Graph::new(format!("seed{seed}")),
        inputs: Vec::new(),
        captured: Vec::new(),
        free: Vec::new(),
        pool: Vec::new(),
    };
    for _ in 0..s.rng.range(1, 3) {
        s.random_input();
    }
    // at least one float input: most ops want one
    let d = s.shape(4);
    s.input(Meta::new(DType::F32, &d), false);
    let target = s.rng.range(4, 14);
    let mut made = 0;
    for _ in 0..target * 4 {
        if made >= target {
            break;
        }
        if s.step().is_some() {
            made += 1;
        }
    }
    // outputs: every value nobody reads, and sometimes an intermediate
    let uses = s.g.use_counts();
    let mut outs: Vec<NodeId> = s
        .pool
        .iter()
        .copied()
        .filter(|id| uses[id.index()] == 0 && !s.g.inputs().contains(id))
        .collect();
    if s.rng.chance(0.3) && s.pool.len() > s.inputs.len() {
        let id = s.pool[s.rng.below(s.pool.len())];
        if !outs.contains(&id) && !s.g.inputs().contains(&id) {
            outs.push(id);
        }
    }
    if outs.is_empty() {
        outs.push(*s.pool.last().expect("inputs exist"));
    }
    for o in outs {
        s.g.output(o).expect("single value");
    }
    Case {
        graph: s.g,
        inputs: s.inputs,
        captured: s.captured,
        free: s.free,
    }
}
