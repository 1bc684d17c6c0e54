//! Recursive-descent parser for the text form that `print.rs` writes. Every
//! node goes through the builder, so types are re-inferred; a declared type
//! that disagrees with inference is an error naming the node.
//!
//! ```text
//! graph  := 'graph' name '(' [param {',' param}] ')' '{' {node} 'return' [val {',' val}] '}'
//! param  := val [name] ':' type
//! node   := val '=' IDENT '(' [val {',' val}] ')' ['{' attr {',' attr} '}'] ':' types
//! types  := type | '(' type {',' type} ')'          type := DTYPE '[' [INT {',' INT}] ']'
//! attr   := IDENT '=' value                         value := NUM | IDENT | '[' [NUM {',' NUM}] ']'
//! ```
//!
//! Value names (`%3`, `%x`) need not be numbers or in order: the printer renumbers.
//! `//` starts a comment that runs to the end of the line.

use super::from_text::{build_op, Attrs};
use super::lex::{lex, Pos, Tok, Token};
use super::print::fmt_metas;
use super::{AttrValue, Constant, Graph, NodeId};
use crate::op::{Meta, Op};
use crate::{DType, Float, Result};
use std::collections::HashMap;

struct Parser {
    toks: Vec<Token>,
    i: usize,
    vals: HashMap<String, NodeId>,
    g: Graph,
}

pub(crate) fn parse(text: &str) -> Result<Graph> {
    let mut p = Parser {
        toks: lex(text)?,
        i: 0,
        vals: HashMap::new(),
        g: Graph::default(),
    };
    p.graph()?;
    Ok(p.g)
}

/// Parses one op from its text-form name and attribute block, the inverse of
/// [`super::op_name`] and [`super::attrs`]: `parse_op("permute", "{dims=[1,0]}")`.
/// `attrs` may be empty for an op without attributes. (The e-graph language of
/// `kiln-passes` spells ops this way.)
pub fn parse_op(name: &str, attrs: &str) -> Result<Op> {
    let mut p = Parser {
        toks: lex(attrs)?,
        i: 0,
        vals: HashMap::new(),
        g: Graph::default(),
    };
    let pos = p.peek().pos;
    let mut a = p.attrs(name, pos)?;
    if p.peek().tok != Tok::Eof {
        return p.unexpected("end of the attributes");
    }
    let Some(op) = build_op(name, &mut a)? else {
        return Err(pos.error(format!("unknown op '{name}'")));
    };
    a.finish()?;
    Ok(op)
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.toks[self.i]
    }
    fn next(&mut self) -> Token {
        let t = self.toks[self.i].clone();
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }
    fn unexpected<T>(&self, want: &str) -> Result<T> {
        let t = self.peek();
        Err(t
            .pos
            .error(format!("expected {want}, found {}", t.tok.describe())))
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek().tok == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            self.unexpected(&format!("'{c}'"))
        }
    }
    fn ident(&mut self, what: &str) -> Result<(String, Pos)> {
        match self.peek().tok.clone() {
            Tok::Ident(s) => Ok((s, self.next().pos)),
            _ => self.unexpected(what),
        }
    }
    /// A name: an identifier or a quoted string.
    fn name(&mut self) -> Option<String> {
        match self.peek().tok.clone() {
            Tok::Ident(s) | Tok::Str(s) => {
                self.next();
                Some(s)
            }
            _ => None,
        }
    }
    /// `%name`, not yet defined.
    fn new_val(&mut self) -> Result<(String, Pos)> {
        match self.peek().tok.clone() {
            Tok::Val(v) if self.vals.contains_key(&v) => {
                let pos = self.peek().pos;
                Err(pos.error(format!("%{v} is defined twice")))
            }
            Tok::Val(v) => Ok((v, self.next().pos)),
            _ => self.unexpected("a value like %3"),
        }
    }
    /// `%name`, already defined.
    fn use_val(&mut self) -> Result<NodeId> {
        match self.peek().tok.clone() {
            Tok::Val(v) => match self.vals.get(&v) {
                Some(&id) => {
                    self.next();
                    Ok(id)
                }
                None => Err(self.peek().pos.error(format!("%{v} is not defined"))),
            },
            _ => self.unexpected("a value like %3"),
        }
    }
    /// `c`-separated items up to the closing `close` (consumed).
    fn list<T>(
        &mut self,
        close: char,
        mut item: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        if self.eat(close) {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            if self.eat(close) {
                return Ok(out);
            }
            self.expect(',')?;
        }
    }

    fn int(&mut self) -> Result<i64> {
        let t = self.peek().clone();
        match &t.tok {
            Tok::Num(s) => match s.parse::<i64>() {
                Ok(i) => {
                    self.next();
                    Ok(i)
                }
                Err(_) => Err(t.pos.error(format!("expected an integer, found '{s}'"))),
            },
            _ => self.unexpected("an integer"),
        }
    }

    fn meta(&mut self) -> Result<Meta> {
        let (d, pos) = self.ident("a dtype like f32")?;
        let dtype = DType::parse(&d).map_err(|e| pos.error(e))?;
        self.expect('[')?;
        let dims = self.list(']', |p| {
            let pos = p.peek().pos;
            usize::try_from(p.int()?).map_err(|_| pos.error("a dim size must be non-negative"))
        })?;
        Ok(Meta::new(dtype, &dims))
    }

    fn metas(&mut self) -> Result<Vec<Meta>> {
        if self.eat('(') {
            self.list(')', Self::meta)
        } else {
            Ok(vec![self.meta()?])
        }
    }

    /// A number or a word that names one (`inf`, `NaN`).
    fn scalar(&mut self) -> Result<AttrValue> {
        let t = self.peek().clone();
        let v = match &t.tok {
            Tok::Num(s) => match s.parse::<i64>() {
                Ok(i) => AttrValue::Int(i),
                Err(_) => match s.parse::<f64>() {
                    Ok(x) => AttrValue::Float(Float(x)),
                    Err(_) => return Err(t.pos.error(format!("bad number '{s}'"))),
                },
            },
            Tok::Ident(s) => match s.as_str() {
                "true" => AttrValue::Bool(true),
                "false" => AttrValue::Bool(false),
                "none" => AttrValue::None,
                "inf" | "NaN" | "nan" => AttrValue::Float(Float(s.parse().expect("inf/NaN"))),
                _ => AttrValue::Word(s.clone()),
            },
            _ => return self.unexpected("an attribute value"),
        };
        self.next();
        Ok(v)
    }

    fn attr_value(&mut self) -> Result<AttrValue> {
        if !self.eat('[') {
            return self.scalar();
        }
        let pos = self.peek().pos;
        let items = self.list(']', Self::scalar)?;
        if let Some(ints) = items
            .iter()
            .map(|v| match v {
                AttrValue::Int(i) => Some(*i),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            return Ok(AttrValue::Ints(ints));
        }
        items
            .iter()
            .map(|v| match v {
                AttrValue::Int(i) => Some(Float(*i as f64)),
                AttrValue::Float(x) => Some(*x),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(AttrValue::Floats)
            .ok_or_else(|| pos.error("a list holds only numbers"))
    }

    fn attrs(&mut self, op: &str, pos: Pos) -> Result<Attrs> {
        let mut a = Attrs {
            op: op.into(),
            pos,
            items: Vec::new(),
        };
        if !self.eat('{') {
            return Ok(a);
        }
        let items = self.list('}', |p| {
            let (k, kp) = p.ident("an attribute name")?;
            p.expect('=')?;
            Ok((k, p.attr_value()?, kp))
        })?;
        for (k, v, kp) in items {
            if a.items.iter().any(|(k2, ..)| *k2 == k) {
                return Err(kp.error(format!("{op}: attribute '{k}' given twice")));
            }
            a.items.push((k, v, kp));
        }
        Ok(a)
    }

    fn graph(&mut self) -> Result<()> {
        match self.ident("'graph'")? {
            (kw, _) if kw == "graph" => {}
            (_, pos) => return Err(pos.error("expected 'graph'")),
        }
        match self.name() {
            Some(n) => self.g.set_name(n),
            None => return self.unexpected("a graph name"),
        }
        self.expect('(')?;
        self.list(')', |p| {
            let (v, _) = p.new_val()?;
            let name = p.name().unwrap_or_default();
            p.expect(':')?;
            let meta = p.meta()?;
            let id = p.g.input(name, meta);
            p.vals.insert(v, id);
            Ok(())
        })?;
        self.expect('{')?;
        while !matches!(&self.peek().tok, Tok::Ident(s) if s == "return") {
            self.node()?;
        }
        self.next();
        let mut outs = Vec::new();
        if !matches!(self.peek().tok, Tok::Punct('}')) {
            loop {
                let pos = self.peek().pos;
                outs.push((self.use_val()?, pos));
                if !self.eat(',') {
                    break;
                }
            }
        }
        self.expect('}')?;
        for (id, pos) in outs {
            self.g.output(id).map_err(|e| pos.error(e))?;
        }
        match self.peek().tok {
            Tok::Eof => Ok(()),
            _ => self.unexpected("end of input after the graph"),
        }
    }

    fn node(&mut self) -> Result<()> {
        let (v, vpos) = self.new_val()?;
        self.expect('=')?;
        let (op, opos) = self.ident("an op name")?;
        self.expect('(')?;
        let operands = self.list(')', Self::use_val)?;
        let mut attrs = self.attrs(&op, opos)?;
        self.expect(':')?;
        let tpos = self.peek().pos;
        let declared = self.metas()?;
        let fail = |e: crate::Error| vpos.error(format!("%{v}: {e}"));
        let id = match op.as_str() {
            "constant" => {
                let [meta] = <[Meta; 1]>::try_from(declared.clone())
                    .map_err(|_| tpos.error("a constant has one type"))?;
                if !operands.is_empty() {
                    return Err(opos.error("constant takes no operands"));
                }
                let values = match attrs.value("value")? {
                    AttrValue::Int(i) => vec![Float(i as f64)],
                    AttrValue::Float(x) => vec![x],
                    AttrValue::Bool(b) => vec![Float(b as u8 as f64)],
                    AttrValue::Ints(xs) => xs.iter().map(|&i| Float(i as f64)).collect(),
                    AttrValue::Floats(xs) => xs,
                    other => return Err(opos.error(format!("constant: bad value {other}"))),
                };
                attrs.finish()?;
                self.g.constant(Constant { meta, values }).map_err(fail)?
            }
            "getitem" => {
                let index = attrs.usize("index")?;
                attrs.finish()?;
                match operands.as_slice() {
                    [t] => self.g.project(*t, index).map_err(fail)?,
                    _ => return Err(opos.error("getitem takes 1 operand")),
                }
            }
            _ => {
                let Some(o) = build_op(&op, &mut attrs)? else {
                    return Err(opos.error(format!("unknown op '{op}'")));
                };
                attrs.finish()?;
                self.g.op(o, &operands).map_err(fail)?
            }
        };
        let inferred = &self.g.node(id).metas;
        if inferred.as_slice() != declared.as_slice() {
            return Err(tpos.error(format!(
                "%{v} ({op}) is declared {} but inference gives {}",
                fmt_metas(&declared),
                fmt_metas(inferred)
            )));
        }
        self.vals.insert(v, id);
        Ok(())
    }
}
