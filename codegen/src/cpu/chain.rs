//! Which pointwise rows are one chain (`wide/chain.rs`), and the call that
//! runs one.
//!
//! A row qualifies when it stores one f32 value that is, from the store
//! down, binary steps (`+ - * /`, each with one operand that is a leaf)
//! to one op of [`wide::CHAIN_OPS`], whose argument is again
//! steps down to a leaf. Leaves are contiguous or broadcast f32 operands,
//! f32 scalar arguments and constants. Anything else (two wide ops,
//! a select, a cast, a step between two computed values, too many steps)
//! keeps the tiled row (the f32x4 loop where tiles are off).

use super::emit::{flags, Emitter};
use super::jit::HostFn;
use super::loops::Row;
use super::plan::live_body;
use super::wide::{self, ChainRow, ADD, DIV, FLIP, MAX_SRCS, MAX_STEPS, MUL, SRC_SHIFT, SUB};
use crate::kernel::{Inner, Instr, Kernel};
use cranelift_codegen::ir::{types, InstBuilder, StackSlotData, StackSlotKind, Value};
use kiln_ir::{BinaryOp, DType};

/// What a source of the chain is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaf {
    /// A contiguous operand's row.
    Row(usize),
    /// A broadcast operand's one value.
    Broadcast(usize),
    Scalar(usize),
    /// f32 bits.
    Const(u32),
}

/// A row's chain: sources, the program words of a [`ChainRow`] and the
/// operand it stores.
#[derive(Debug, PartialEq)]
pub(crate) struct Chain {
    srcs: Vec<Leaf>,
    first: u32,
    op: u32,
    npre: u32,
    npost: u32,
    steps: Vec<u32>,
    out: usize,
}

/// The chain of a row storing `stores` whose wide values are `heavy`
/// (there must be one), or `None`.
pub(crate) fn chain_of(
    k: &Kernel,
    stores: &[(usize, usize, usize)],
    heavy: &[usize],
) -> Option<Chain> {
    let (&[(out, 0, root)], &[h]) = (stores, heavy) else {
        return None;
    };
    let (Instr::Unary(op, arg), DType::F32) = k.body[h] else {
        return None;
    };
    let op = wide::CHAIN_OPS.iter().position(|&o| o == op)? as u32;
    let mut c = Chain {
        srcs: vec![],
        first: 0,
        op,
        npre: 0,
        npost: 0,
        steps: vec![],
        out,
    };
    // down from the store to the wide op, then from its argument to a leaf
    let mut post = vec![];
    let mut v = root;
    while v != h {
        v = c.step(k, v, Some(h), &mut post)?;
    }
    let pre = c.down_to_leaf(k, arg)?;
    c.npre = pre.len() as u32;
    c.npost = post.len() as u32;
    c.steps = pre
        .into_iter()
        .rev()
        .chain(post.into_iter().rev())
        .collect();
    (c.steps.len() <= MAX_STEPS).then_some(c)
}

/// The chain of steps alone ([`wide::NO_OP`]) computing `value`, stored to
/// operand `out`: a softmax row's `x * scale + mask`, written to the output
/// row before the row helper reads it. `None` unless `value` is one or more
/// steps down to a leaf.
pub(crate) fn steps_of(k: &Kernel, value: usize, out: usize) -> Option<Chain> {
    let mut c = Chain {
        srcs: vec![],
        first: 0,
        op: wide::NO_OP,
        npre: 0,
        npost: 0,
        steps: vec![],
        out,
    };
    let pre = c.down_to_leaf(k, value)?;
    c.npre = pre.len() as u32;
    c.steps = pre.into_iter().rev().collect();
    (c.npre > 0 && c.steps.len() <= MAX_STEPS).then_some(c)
}

impl Chain {
    /// The steps from `v` down to a leaf, which becomes the first source
    /// (the steps in walking order, from `v` down).
    fn down_to_leaf(&mut self, k: &Kernel, mut v: usize) -> Option<Vec<u32>> {
        let mut steps = vec![];
        let first = loop {
            if let Some(l) = leaf(k, v) {
                break l;
            }
            v = self.step(k, v, None, &mut steps)?;
        };
        self.first = self.src(first)?;
        Some(steps)
    }

    /// Records the step that value `v` applies (pushed in walking order,
    /// from the store down) and returns the value it applies it to: the
    /// side that depends on `towards` (or, walking to a leaf, the left
    /// side unless only the right one is a computed value).
    fn step(
        &mut self,
        k: &Kernel,
        v: usize,
        towards: Option<usize>,
        steps: &mut Vec<u32>,
    ) -> Option<usize> {
        let (Instr::Binary(op, a, b), DType::F32) = *k.body.get(v)? else {
            return None;
        };
        let code = match op {
            BinaryOp::Add => ADD,
            BinaryOp::Sub => SUB,
            BinaryOp::Mul => MUL,
            BinaryOp::Div => DIV,
            _ => return None,
        };
        if k.dtype_of(a) != DType::F32 || k.dtype_of(b) != DType::F32 {
            return None;
        }
        let left_is_chain = match towards {
            Some(h) => {
                let reaches = |x: usize| x == h || live_body(k, &[x])[h];
                match (reaches(a), reaches(b)) {
                    (true, false) => true,
                    (false, true) => false,
                    _ => return None,
                }
            }
            None => leaf(k, a).is_none() || leaf(k, b).is_some(),
        };
        let (chain, other, flip) = if left_is_chain {
            (a, b, 0)
        } else {
            (b, a, FLIP)
        };
        let src = self.src(leaf(k, other)?)?;
        steps.push(code | flip | src << SRC_SHIFT);
        Some(chain)
    }

    /// The index of source `l` (added when new).
    fn src(&mut self, l: Leaf) -> Option<u32> {
        let at = match self.srcs.iter().position(|&s| s == l) {
            Some(at) => at,
            None => {
                self.srcs.push(l);
                self.srcs.len() - 1
            }
        };
        (at < MAX_SRCS).then_some(at as u32)
    }
}

/// `v` as a chain source, when it is one.
fn leaf(k: &Kernel, v: usize) -> Option<Leaf> {
    match *k.body.get(v)? {
        (Instr::Load(op), DType::F32) => match k.operands[op] {
            o if o.dtype != DType::F32 => None,
            o if o.inner == Inner::Contiguous => Some(Leaf::Row(op)),
            o if o.inner == Inner::Broadcast => Some(Leaf::Broadcast(op)),
            _ => None,
        },
        (Instr::Scalar(n), DType::F32) if k.scalars[n] == DType::F32 => Some(Leaf::Scalar(n)),
        (Instr::Const(bits), DType::F32) => {
            Some(Leaf::Const((f64::from_bits(bits) as f32).to_bits()))
        }
        _ => None,
    }
}

/// Calls the chain helper on elements `lo..hi` of the row (a [`ChainRow`]
/// on the stack; `hi - lo` a multiple of 64). `may_stream`: the output may
/// go past the caches when the launch is large (false when the kernel
/// reads it back).
pub(crate) fn chain_call(
    em: &mut Emitter,
    row: &Row,
    c: &Chain,
    [lo, hi]: [Value; 2],
    may_stream: bool,
) {
    let slot = em.b.create_sized_stack_slot(StackSlotData::new(
        StackSlotKind::ExplicitSlot,
        std::mem::size_of::<ChainRow>() as u32,
        3,
    ));
    let base = em.b.ins().stack_addr(types::I64, slot, 0);
    use std::mem::offset_of;
    use ChainRow as R;
    let put = |em: &mut Emitter, v: Value, at: usize| {
        em.b.ins().store(flags(), v, base, at as i32);
    };
    put(em, row.ptrs[c.out], offset_of!(R, out));
    put(em, lo, offset_of!(R, lo));
    put(em, hi, offset_of!(R, hi));
    // a launch of no elements never streams
    let launch = if may_stream {
        row.fr.launch_elements(em)
    } else {
        em.b.ins().iconst(types::I64, 0)
    };
    put(em, launch, offset_of!(R, launch));
    let mut splats = 0u32;
    for (s, &l) in c.srcs.iter().enumerate() {
        let at = offset_of!(R, srcs) + 8 * s;
        let v = match l {
            Leaf::Row(op) => row.ptrs[op],
            Leaf::Broadcast(op) => em.b.ins().load(types::F32, flags(), row.ptrs[op], 0),
            Leaf::Scalar(n) => row.fr.scal[n],
            Leaf::Const(bits) => em.b.ins().f32const(f32::from_bits(bits)),
        };
        if !matches!(l, Leaf::Row(_)) {
            splats |= 1 << s;
        }
        put(em, v, at);
    }
    let words = [
        (c.first, offset_of!(R, first)),
        (c.op, offset_of!(R, op)),
        (c.npre, offset_of!(R, npre)),
        (c.npost, offset_of!(R, npost)),
        (splats, offset_of!(R, splats)),
        (c.srcs.len() as u32, offset_of!(R, nsrcs)),
    ];
    let steps = c
        .steps
        .iter()
        .enumerate()
        .map(|(j, &w)| (w, offset_of!(R, steps) + 4 * j));
    for (w, at) in words.into_iter().chain(steps) {
        let v = em.b.ins().iconst(types::I32, w as i64);
        put(em, v, at);
    }
    let f = em.hosts.get(em.b.func, HostFn::WideChain);
    em.b.ins().call(f, &[base]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{KernelBuilder, Operand};
    use kiln_ir::UnaryOp;

    /// A pointwise kernel storing `body`'s value; operand 1 contiguous,
    /// 2 broadcast, 3 strided.
    fn kernel(body: impl Fn(&mut KernelBuilder) -> usize) -> Kernel {
        let mut b = KernelBuilder::default();
        let out = body(&mut b);
        let op = |inner| Operand {
            dtype: DType::F32,
            inner,
        };
        let operands = vec![
            op(Inner::Contiguous),
            op(Inner::Contiguous),
            op(Inner::Broadcast),
            op(Inner::Strided),
        ];
        Kernel::pointwise("chain", 1, operands, vec![DType::F32], b.instrs, out)
    }

    fn chain(k: &Kernel) -> Option<Chain> {
        let heavy: Vec<usize> = (0..k.body.len())
            .filter(|&v| matches!(k.body[v].0, Instr::Unary(..)))
            .collect();
        chain_of(k, &k.stores(), &heavy)
    }

    #[test]
    fn which_rows_are_chains() {
        let f = DType::F32;
        // W1: gelu(x*c + s) * 0.5 + x
        let w1 = chain(&kernel(|b| {
            let (x, c, s) = (b.load(1, f), b.load(2, f), b.scalar(0, f));
            let m = b.binary(BinaryOp::Mul, x, c, f);
            let a = b.binary(BinaryOp::Add, m, s, f);
            let g = b.unary(UnaryOp::Gelu, a, f);
            let h = b.constant(0.5, f);
            let gh = b.binary(BinaryOp::Mul, g, h, f);
            b.binary(BinaryOp::Add, gh, x, f)
        }))
        .expect("W1 is a chain");
        let half = Leaf::Const(0.5f32.to_bits());
        // sources in the order the walk from the store meets them
        assert_eq!(
            w1.srcs,
            [Leaf::Row(1), half, Leaf::Scalar(0), Leaf::Broadcast(2)]
        );
        let gelu = wide::CHAIN_OPS.iter().position(|&o| o == UnaryOp::Gelu);
        assert_eq!(Some(w1.op as usize), gelu);
        assert_eq!((w1.first, w1.npre, w1.npost), (0, 2, 2));
        let s = |op: u32, src: u32| op | src << SRC_SHIFT;
        assert_eq!(w1.steps, [s(MUL, 3), s(ADD, 2), s(MUL, 1), s(ADD, 0)]);
        // 1 - sigmoid(x): a flipped step after the op, nothing before it
        let flipped = chain(&kernel(|b| {
            let x = b.load(1, f);
            let g = b.unary(UnaryOp::Sigmoid, x, f);
            let one = b.constant(1.0, f);
            b.binary(BinaryOp::Sub, one, g, f)
        }))
        .expect("a chain");
        assert_eq!((flipped.npre, flipped.npost), (0, 1));
        assert_eq!(flipped.steps, [s(SUB, 0) | FLIP]); // source 0 is the 1.0

        let not_chains: [(&str, Kernel); 5] = [
            (
                "two wide ops",
                kernel(|b| {
                    let x = b.load(1, f);
                    let g = b.unary(UnaryOp::Silu, x, f);
                    b.unary(UnaryOp::Sigmoid, g, f)
                }),
            ),
            (
                "x * sigmoid(x + 1): the op's argument is needed after it",
                kernel(|b| {
                    let x = b.load(1, f);
                    let one = b.constant(1.0, f);
                    let a = b.binary(BinaryOp::Add, x, one, f);
                    let g = b.unary(UnaryOp::Sigmoid, a, f);
                    b.binary(BinaryOp::Mul, a, g, f)
                }),
            ),
            (
                "a strided operand",
                kernel(|b| {
                    let x = b.load(3, f);
                    b.unary(UnaryOp::Gelu, x, f)
                }),
            ),
            (
                "maximum is not a step",
                kernel(|b| {
                    let x = b.load(1, f);
                    let g = b.unary(UnaryOp::Gelu, x, f);
                    b.binary(BinaryOp::Maximum, g, x, f)
                }),
            ),
            (
                "sin has no wide helper",
                kernel(|b| {
                    let x = b.load(1, f);
                    b.unary(UnaryOp::Sin, x, f)
                }),
            ),
        ];
        for (what, k) in not_chains {
            assert_eq!(chain(&k), None, "{what}");
        }
        // nine steps are one too many
        let long = kernel(|b| {
            let mut v = b.load(1, f);
            v = b.unary(UnaryOp::Gelu, v, f);
            for _ in 0..MAX_STEPS + 1 {
                let x = b.load(1, f);
                v = b.binary(BinaryOp::Add, v, x, f);
            }
            v
        });
        assert_eq!(chain(&long), None);
    }

    #[test]
    fn which_values_are_steps_alone() {
        let f = DType::F32;
        let s = |op: u32, src: u32| op | src << SRC_SHIFT;
        let stored = |k: &Kernel| k.stores()[0].2;
        // W2F's prologue: x * 0.125 + mask, stored to operand 0
        let w2f = kernel(|b| {
            let (x, eighth, mask) = (b.load(1, f), b.constant(0.125, f), b.load(2, f));
            let m = b.binary(BinaryOp::Mul, x, eighth, f);
            b.binary(BinaryOp::Add, m, mask, f)
        });
        let c = steps_of(&w2f, stored(&w2f), 0).expect("steps alone");
        let eighth = Leaf::Const(0.125f32.to_bits());
        assert_eq!(c.srcs, [Leaf::Broadcast(2), eighth, Leaf::Row(1)]);
        assert_eq!((c.op, c.first, c.npre, c.npost), (wide::NO_OP, 2, 2, 0));
        assert_eq!(c.steps, [s(MUL, 1), s(ADD, 0)]);
        // a load alone is no chain (the row helper reads such a row in
        // place), nor is a wide op a step
        let load = kernel(|b| b.load(1, f));
        assert_eq!(steps_of(&load, stored(&load), 0), None);
        let gelu = kernel(|b| {
            let x = b.load(1, f);
            let g = b.unary(UnaryOp::Gelu, x, f);
            let one = b.constant(1.0, f);
            b.binary(BinaryOp::Add, g, one, f)
        });
        assert_eq!(steps_of(&gelu, stored(&gelu), 0), None);
    }
}
