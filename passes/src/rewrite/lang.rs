//! [`KilnLang`]: the e-graph language, one e-node kind per [`ir::Op`] plus graph
//! inputs, constants and tuple projections, so any [`Graph`] lowers to a
//! [`RecExpr`] (or into an e-graph) and back.
//!
//! An e-node prints as the op's text-form name, with its attributes (sorted,
//! as in the graph text form) between angle brackets, so patterns read like
//! the IR:
//!
//! ```text
//! (relu (relu ?x))                       relu of relu
//! (permute<dims=[1,0]> ?x)               one permute
//! (add_scalar<reversed=false,value=1.0> ?x)
//! (permute<*> (permute<*> ?x))           `<*>`: any attributes (patterns only)
//! input<0>                               graph input number 0 (by position)
//! constant<f32[2,3]=0.5>                 a splat constant; `=[1.0,2.0]` lists every element
//! (getitem<index=1> ?t)                  element 1 of a multi-output op
//! ```
//!
//! A wildcard `name<*>` matches every e-node of that op name and arity; the
//! rule's applier looks the matched node's attributes up (see
//! `rules::nodes_named`). It may only appear in a left-hand side.
//!
//! E-nodes compare and hash by their printed name and attributes (never by an
//! interned symbol's number), so the e-graph and its extraction are the same
//! from run to run.
//!
//! [`ir::Op`]: kiln_ir::op::Op

use egg::{FromOp, Id, Language, RecExpr};
use kiln_ir::graph::{arity, attrs, op_name, parse_op, Constant, Graph, NodeId, NodeOp};
use kiln_ir::op::{Meta, Op};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Float, Result};
use smallvec::SmallVec;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// An op with its attributes, as an e-node operator: the printed name and
/// attributes are the identity; the [`Op`] itself rides along (`None` for a
/// pattern wildcard).
#[derive(Clone)]
pub struct OpKey(Arc<KeyInner>);

struct KeyInner {
    name: String,
    /// `k=v,k=v` (empty when the op has none; `*` for a wildcard).
    attrs: String,
    op: Option<Op>,
}

impl OpKey {
    pub fn new(op: Op) -> OpKey {
        let attrs: Vec<String> = attrs(&op).iter().map(|(k, v)| format!("{k}={v}")).collect();
        OpKey(Arc::new(KeyInner {
            name: op_name(&op),
            attrs: attrs.join(","),
            op: Some(op),
        }))
    }

    /// `name<*>`: any op of that name (patterns only).
    pub fn wildcard(name: &str) -> OpKey {
        OpKey(Arc::new(KeyInner {
            name: name.into(),
            attrs: "*".into(),
            op: None,
        }))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The op; `None` for a wildcard.
    pub fn op(&self) -> Option<&Op> {
        self.0.op.as_ref()
    }

    pub fn is_wildcard(&self) -> bool {
        self.0.op.is_none()
    }

    fn parts(&self) -> (&str, &str) {
        (&self.0.name, &self.0.attrs)
    }
}

impl PartialEq for OpKey {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.0, &o.0) || self.parts() == o.parts()
    }
}
impl Eq for OpKey {}
impl PartialOrd for OpKey {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
/// By name first, so e-nodes of one op name are adjacent in a sorted e-class
/// (egg's matcher relies on it for large classes).
impl Ord for OpKey {
    fn cmp(&self, o: &Self) -> Ordering {
        self.parts().cmp(&o.parts())
    }
}
impl Hash for OpKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.parts().hash(h)
    }
}
impl fmt::Debug for OpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
impl fmt::Display for OpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parts() {
            (n, "") => f.write_str(n),
            (n, a) => write!(f, "{n}<{a}>"),
        }
    }
}

/// A constant tensor as an e-node leaf: equal (and hashed) by dtype, shape and
/// the bits of every value.
#[derive(Clone, PartialEq)]
pub struct Lit(pub Arc<Constant>);

/// [`Constant`] compares values by their bits, so equality is total.
impl Eq for Lit {}

impl Lit {
    pub fn new(c: Constant) -> Lit {
        Lit(Arc::new(c))
    }
    fn key(&self) -> (DType, &[usize], impl Iterator<Item = u64> + '_) {
        let c = &self.0;
        (
            c.meta.dtype,
            &c.meta.dims[..],
            c.values.iter().map(|v| v.0.to_bits()),
        )
    }
    /// The one value of a splat constant.
    pub fn splat(&self) -> Option<f64> {
        self.0.is_splat().then(|| self.0.values[0].0)
    }
}

impl PartialOrd for Lit {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Lit {
    fn cmp(&self, o: &Self) -> Ordering {
        let (d1, s1, v1) = self.key();
        let (d2, s2, v2) = o.key();
        (d1, s1).cmp(&(d2, s2)).then_with(|| v1.cmp(v2))
    }
}
impl Hash for Lit {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.meta.hash(h);
        self.0.values.hash(h);
    }
}
impl fmt::Debug for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
/// `f32[2,3]=0.5` or `i32[2]=[3.0,-7.0]`.
impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.0;
        write!(f, "{}{}=", c.meta.dtype, fmt_dims(&c.meta.dims))?;
        match c.values.as_slice() {
            [v] => write!(f, "{v}"),
            vs => {
                let v: Vec<String> = vs.iter().map(|v| v.to_string()).collect();
                write!(f, "[{}]", v.join(","))
            }
        }
    }
}

/// One e-node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KilnLang {
    /// Graph input number `i` (its position in [`Graph::inputs`]).
    Input(u32),
    Const(Lit),
    Op(OpKey, SmallVec<[Id; 3]>),
    /// Element `i` of a multi-output op.
    Project(u32, [Id; 1]),
}

/// What egg's matcher compares first: the variant, and for ops the name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    Input,
    Const,
    Op(String),
    Project,
}

impl KilnLang {
    pub fn op(op: Op, children: &[Id]) -> KilnLang {
        KilnLang::Op(OpKey::new(op), children.into())
    }
    /// The op of an `Op` node (`None` for other nodes and wildcards).
    pub fn as_op(&self) -> Option<&Op> {
        match self {
            KilnLang::Op(k, _) => k.op(),
            _ => None,
        }
    }
}

impl Language for KilnLang {
    type Discriminant = Kind;

    fn discriminant(&self) -> Kind {
        match self {
            KilnLang::Input(_) => Kind::Input,
            KilnLang::Const(_) => Kind::Const,
            KilnLang::Op(k, _) => Kind::Op(k.name().into()),
            KilnLang::Project(..) => Kind::Project,
        }
    }

    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (KilnLang::Input(a), KilnLang::Input(b)) => a == b,
            (KilnLang::Const(a), KilnLang::Const(b)) => a == b,
            (KilnLang::Op(a, ca), KilnLang::Op(b, cb)) => {
                ca.len() == cb.len() && (a == b || (a.is_wildcard() && a.name() == b.name()))
            }
            (KilnLang::Project(a, _), KilnLang::Project(b, _)) => a == b,
            _ => false,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            KilnLang::Input(_) | KilnLang::Const(_) => &[],
            KilnLang::Op(_, c) => c,
            KilnLang::Project(_, c) => c,
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            KilnLang::Input(_) | KilnLang::Const(_) => &mut [],
            KilnLang::Op(_, c) => c,
            KilnLang::Project(_, c) => c,
        }
    }
}

impl fmt::Display for KilnLang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KilnLang::Input(i) => write!(f, "input<{i}>"),
            KilnLang::Const(c) => write!(f, "constant<{c}>"),
            KilnLang::Op(k, _) => write!(f, "{k}"),
            KilnLang::Project(i, _) => write!(f, "getitem<index={i}>"),
        }
    }
}

fn parse_lit(s: &str) -> std::result::Result<Lit, String> {
    let bad = || format!("bad constant '{s}' (expected e.g. f32[2,3]=0.5)");
    let (meta, vals) = s.split_once('=').ok_or_else(bad)?;
    let (dt, dims) = meta.split_once('[').ok_or_else(bad)?;
    let dims = dims.strip_suffix(']').ok_or_else(bad)?;
    let dims: Vec<usize> = match dims {
        "" => vec![],
        d => d
            .split(',')
            .map(|x| x.parse().map_err(|_| bad()))
            .collect::<std::result::Result<_, _>>()?,
    };
    let dtype = DType::parse(dt).map_err(|e| e.to_string())?;
    let list = vals
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(vals);
    let values: Vec<f64> = list
        .split(',')
        .map(|x| x.parse().map_err(|_| bad()))
        .collect::<std::result::Result<_, _>>()?;
    let c = Constant {
        meta: Meta::new(dtype, &dims),
        values: values.into_iter().map(Float).collect(),
    };
    c.check().map_err(|e| e.to_string())?;
    Ok(Lit::new(c))
}

impl FromOp for KilnLang {
    type Error = String;

    fn from_op(op: &str, children: Vec<Id>) -> std::result::Result<Self, String> {
        let (name, body) = match op.split_once('<') {
            Some((n, rest)) => match rest.strip_suffix('>') {
                Some(b) => (n, Some(b)),
                None => return Err(format!("'{op}': missing '>'")),
            },
            None => (op, None),
        };
        let leaf = |n: KilnLang| match children.len() {
            0 => Ok(n),
            k => Err(format!("'{op}' takes no operands, got {k}")),
        };
        match (name, body) {
            ("input", Some(i)) => leaf(KilnLang::Input(
                i.parse().map_err(|_| format!("bad input '{op}'"))?,
            )),
            ("constant", Some(c)) => leaf(KilnLang::Const(parse_lit(c)?)),
            ("getitem", Some(b)) => {
                let i = b
                    .strip_prefix("index=")
                    .and_then(|i| i.parse().ok())
                    .ok_or_else(|| format!("bad getitem '{op}'"))?;
                match children.as_slice() {
                    [t] => Ok(KilnLang::Project(i, [*t])),
                    _ => Err(format!("'{op}' takes 1 operand, got {}", children.len())),
                }
            }
            (n, Some("*")) => Ok(KilnLang::Op(OpKey::wildcard(n), children.into())),
            (n, b) => {
                let attrs = b.map(|b| format!("{{{b}}}")).unwrap_or_default();
                let o = parse_op(n, &attrs).map_err(|e| e.to_string())?;
                let (lo, hi) = arity(&o);
                if children.len() < lo || children.len() > hi {
                    return Err(format!(
                        "'{op}' takes {lo}..={hi} operands, got {}",
                        children.len()
                    ));
                }
                Ok(KilnLang::op(o, &children))
            }
        }
    }
}

/// A graph's name and inputs (name and type, in order): what a graph rebuilt
/// from e-nodes needs besides the nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    pub name: String,
    pub inputs: Vec<(String, Meta)>,
}

impl Signature {
    pub fn of(g: &Graph) -> Signature {
        let inputs = g
            .inputs()
            .iter()
            .map(|&id| {
                let n = g.node(id);
                let name = match &n.op {
                    NodeOp::Input { name } => name.clone(),
                    _ => String::new(),
                };
                (name, n.metas[0].clone())
            })
            .collect();
        Signature {
            name: g.name().into(),
            inputs,
        }
    }
}

/// Lowers every node of `g` through `add` (a [`RecExpr`] or an e-graph),
/// returning the id each node became, indexed by [`NodeId`].
pub fn lower(g: &Graph, mut add: impl FnMut(KilnLang) -> Id) -> Result<Vec<Id>> {
    let mut input_pos = vec![u32::MAX; g.len()];
    for (i, id) in g.inputs().iter().enumerate() {
        input_pos[id.index()] = i as u32;
    }
    let mut ids: Vec<Id> = Vec::with_capacity(g.len());
    for (id, n) in g.iter() {
        let ch: SmallVec<[Id; 3]> = n.operands.iter().map(|o| ids[o.index()]).collect();
        let node = match &n.op {
            NodeOp::Input { .. } => match input_pos[id.index()] {
                u32::MAX => bail!("rewrite", "{id:?} is an input node but not a graph input"),
                p => KilnLang::Input(p),
            },
            NodeOp::Const(c) => KilnLang::Const(Lit::new(c.clone())),
            NodeOp::Op(op) => KilnLang::Op(OpKey::new(op.clone()), ch),
            NodeOp::Project(i) => KilnLang::Project(*i as u32, [ch[0]]),
        };
        ids.push(add(node));
    }
    Ok(ids)
}

/// The graph as one [`RecExpr`] (every node, in graph order) and the ids of its outputs.
pub fn to_rec_expr(g: &Graph) -> Result<(RecExpr<KilnLang>, Vec<Id>)> {
    let mut expr = RecExpr::default();
    let ids = lower(g, |n| expr.add(n))?;
    let outs = g.outputs().iter().map(|o| ids[o.index()]).collect();
    Ok((expr, outs))
}

/// Adds one e-node to `g` with `operands` already mapped (inputs are added
/// by the caller, from the signature).
pub(crate) fn emit(g: &mut Graph, node: &KilnLang, operands: &[NodeId]) -> Result<NodeId> {
    match node {
        KilnLang::Input(i) => bail!("rewrite", "input<{i}> must come from the signature"),
        KilnLang::Const(c) => g.constant((*c.0).clone()),
        KilnLang::Op(k, _) => match k.op() {
            Some(op) => g.op(op.clone(), operands),
            None => bail!("rewrite", "wildcard {k} in a graph"),
        },
        KilnLang::Project(i, _) => g.project(operands[0], *i as usize),
    }
}

/// Rebuilds a graph from a [`RecExpr`] (the inverse of [`to_rec_expr`]): every
/// node in order, inputs named and typed by `sig`.
pub fn from_rec_expr(expr: &RecExpr<KilnLang>, outputs: &[Id], sig: &Signature) -> Result<Graph> {
    let mut g = Graph::new(sig.name.clone());
    let mut ids: Vec<NodeId> = Vec::with_capacity(expr.len());
    for node in expr.iter() {
        let ops: Vec<NodeId> = node
            .children()
            .iter()
            .map(|&c| ids[usize::from(c)])
            .collect();
        let id = match node {
            KilnLang::Input(i) => match sig.inputs.get(*i as usize) {
                Some((name, meta)) => g.input(name.clone(), meta.clone()),
                None => bail!("rewrite", "input<{i}> beyond the signature"),
            },
            n => emit(&mut g, n, &ops)?,
        };
        ids.push(id);
    }
    for o in outputs {
        g.output(ids[usize::from(*o)])?;
    }
    Ok(g)
}

#[cfg(test)]
#[path = "lang_tests.rs"]
mod tests;
