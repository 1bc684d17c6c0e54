//! Containers whose children register: Sequential, ModuleList, ModuleDict.
//! (A plain `Vec<Box<dyn Module>>` field would hide its parameters; these
//! report every child to `visit`, so `parameters()` and `state_dict()` see them.)

use super::{Entry, EntryMut, Module};
use crate::Tensor;
use kiln_ir::{bail, Result};

/// `nn.Sequential`: children named `0`, `1`, ...; forward chains them.
#[derive(Default)]
pub struct Sequential {
    names: Vec<String>,
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential::default()
    }
    /// Appends a layer (named by its index), builder style.
    pub fn add(mut self, m: impl Module + 'static) -> Sequential {
        self.names.push(self.layers.len().to_string());
        self.layers.push(Box::new(m));
        self
    }
    pub fn len(&self) -> usize {
        self.layers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|b| b.as_ref())
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            let mut y = x.clone();
            for l in &self.layers {
                y = l.forward(&y)?;
            }
            Ok(y)
        })
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, l) in self.names.iter().zip(&self.layers) {
            f(Entry::Child(n, l.as_ref()))
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        for (n, l) in self.names.iter().zip(&mut self.layers) {
            f(EntryMut::Child(n, l.as_mut()))
        }
    }
    fn describe(&self) -> String {
        "Sequential".into()
    }
}

/// `nn.ModuleList`: registered children `0`, `1`, ...; no forward of its own.
#[derive(Default)]
pub struct ModuleList {
    names: Vec<String>,
    items: Vec<Box<dyn Module>>,
}

impl ModuleList {
    pub fn new() -> ModuleList {
        ModuleList::default()
    }
    pub fn push(&mut self, m: impl Module + 'static) {
        self.names.push(self.items.len().to_string());
        self.items.push(Box::new(m));
    }
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> {
        self.items.iter().map(|b| b.as_ref())
    }
    pub fn len(&self) -> usize {
        self.items.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl Module for ModuleList {
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        bail!(
            "ModuleList",
            "a ModuleList has no forward; iterate over its modules"
        )
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, l) in self.names.iter().zip(&self.items) {
            f(Entry::Child(n, l.as_ref()))
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        for (n, l) in self.names.iter().zip(&mut self.items) {
            f(EntryMut::Child(n, l.as_mut()))
        }
    }
    fn describe(&self) -> String {
        "ModuleList".into()
    }
}

/// `nn.ModuleDict`: registered children by name, in insertion order.
#[derive(Default)]
pub struct ModuleDict {
    items: Vec<(String, Box<dyn Module>)>,
}

impl ModuleDict {
    pub fn new() -> ModuleDict {
        ModuleDict::default()
    }
    /// Inserts or replaces `name`.
    pub fn insert(&mut self, name: &str, m: impl Module + 'static) {
        match self.items.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = Box::new(m),
            None => self.items.push((name.to_string(), Box::new(m))),
        }
    }
    pub fn get(&self, name: &str) -> Option<&dyn Module> {
        self.items
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, m)| m.as_ref())
    }
}

impl Module for ModuleDict {
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        bail!(
            "ModuleDict",
            "a ModuleDict has no forward; look modules up by name"
        )
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (n, l) in &self.items {
            f(Entry::Child(n, l.as_ref()))
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        for (n, l) in &mut self.items {
            f(EntryMut::Child(n, l.as_mut()))
        }
    }
    fn describe(&self) -> String {
        "ModuleDict".into()
    }
}
