//! One node being run: its attributes (each read is recorded, so an
//! attribute no implementation looked at is reported as unsupported) and
//! errors that name the node, the op and the opset.

use crate::onnx::proto::{attribute_type as at, AttributeProto, NodeProto};
use crate::Result;
use kiln_ir::Error;
use std::cell::RefCell;

pub(crate) struct Node<'a> {
    pub proto: &'a NodeProto,
    /// Position in the graph (named when the node has no name).
    index: usize,
    pub opset: i64,
    read: RefCell<Vec<&'a str>>,
}

impl<'a> Node<'a> {
    pub fn new(proto: &'a NodeProto, index: usize, opset: i64) -> Node<'a> {
        Node {
            proto,
            index,
            opset,
            read: RefCell::new(vec![]),
        }
    }

    pub fn op(&self) -> &str {
        &self.proto.op_type
    }

    fn label(&self) -> String {
        let name = if self.proto.name.is_empty() {
            format!("#{}", self.index)
        } else {
            format!("`{}`", self.proto.name)
        };
        format!("node {name} ({}, opset {})", self.proto.op_type, self.opset)
    }

    /// An error naming this node.
    pub fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::op("onnx", format!("{}: {msg}", self.label()))
    }

    /// A kiln error raised while running this node, with the node named.
    pub fn wrap(&self, e: Error) -> Error {
        let s = e.to_string();
        if s.contains(&self.label()) {
            e
        } else {
            self.err(s)
        }
    }

    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        let a = self.proto.attribute.iter().find(|a| a.name == name)?;
        self.read.borrow_mut().push(&a.name);
        Some(a)
    }

    /// Marks attributes whose only effect kiln does not need (e.g. a
    /// BatchNorm `momentum` at inference) as handled.
    pub fn ignore(&self, names: &[&str]) {
        for n in names {
            let _ = self.get(n);
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.proto.attribute.iter().any(|a| a.name == name)
    }

    fn typed(&self, name: &str, want: i32, what: &str) -> Result<Option<&'a AttributeProto>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if a.r#type == want || a.r#type == at::UNDEFINED => Ok(Some(a)),
            Some(a) => Err(self.err(format!(
                "attribute `{name}` should be {what}, has type {}",
                a.r#type
            ))),
        }
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>> {
        Ok(self.typed(name, at::INT, "an int")?.map(|a| a.i))
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    pub fn float_or(&self, name: &str, default: f64) -> Result<f64> {
        Ok(self
            .typed(name, at::FLOAT, "a float")?
            .map_or(default, |a| a.f as f64))
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .typed(name, at::INTS, "a list of ints")?
            .map(|a| a.ints.clone()))
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        Ok(self
            .typed(name, at::FLOATS, "a list of floats")?
            .map(|a| a.floats.clone()))
    }

    pub fn string(&self, name: &str) -> Result<Option<String>> {
        Ok(self
            .typed(name, at::STRING, "a string")?
            .map(|a| String::from_utf8_lossy(&a.s).into_owned()))
    }

    pub fn string_list(&self, name: &str) -> Result<Option<Vec<String>>> {
        Ok(self
            .typed(name, at::STRINGS, "a list of strings")?
            .map(|a| {
                a.strings
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect()
            }))
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&'a crate::onnx::proto::TensorProto>> {
        Ok(self
            .typed(name, at::TENSOR, "a tensor")?
            .and_then(|a| a.t.as_ref()))
    }

    /// Every attribute must have been read by the op's implementation.
    pub fn check_attrs_used(&self) -> Result<()> {
        let read = self.read.borrow();
        for a in &self.proto.attribute {
            if !read.contains(&a.name.as_str()) {
                return Err(self.err(format!("attribute `{}` is not supported", a.name)));
            }
        }
        Ok(())
    }

    /// An error for an attribute value kiln cannot run.
    pub fn unsupported(&self, what: impl std::fmt::Display) -> Error {
        self.err(format!("{what} is not supported"))
    }
}
