//! CUDA kernels written as templates rather than KernelIR loop nests: the
//! tiled convolution of [`super::conv`], whose pointwise epilogue is still
//! emitted from KernelIR. A template lists its parameters so that the
//! driver and the CPU shim can both pass them without knowing the kernel.

use super::stable_hash;

/// One parameter of a template: every one is 8 bytes (a pointer, a
/// `long long` or a `double`), so launchers pass a flat array of words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// A device pointer, given with its C type (`float*`, `const double*`).
    Ptr(&'static str),
    /// `long long`.
    Int,
    /// `double`, passed as its bits.
    F64,
}

impl Param {
    /// How the CPU shim turns word `a[i]` into this parameter.
    pub(crate) fn from_word(self, i: usize) -> String {
        match self {
            Param::Ptr(t) => format!("({t})a[{i}]"),
            Param::Int => format!("(long long)a[{i}]"),
            Param::F64 => format!("kiln_shim::f64_of_bits(a[{i}])"),
        }
    }
}

/// A complete CUDA C kernel with its parameter list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TemplateKernel {
    /// What profiles, logs and errors call it (`conv2d`, `conv2d+relu`).
    pub name: String,
    /// The `extern "C"` symbol: `kiln_<name>_<hash of the source>`.
    pub symbol: String,
    /// The whole translation unit: helpers, then the kernel.
    pub source: String,
    pub params: Vec<Param>,
    /// Threads per block the kernel is written for (it loops over any grid).
    pub block: u32,
}

impl TemplateKernel {
    /// Builds the kernel `name` from a source whose kernel is called `SYMBOL`
    /// (replaced by the hashed symbol, so equal sources share a symbol).
    pub(crate) fn new(name: &str, source: &str, params: Vec<Param>, block: u32) -> TemplateKernel {
        let clean: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let symbol = format!("kiln_{clean}_{:016x}", stable_hash(source));
        TemplateKernel {
            name: name.to_string(),
            source: source.replace("SYMBOL", &symbol),
            symbol,
            params,
            block,
        }
    }
}
