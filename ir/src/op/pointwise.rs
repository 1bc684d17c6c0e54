//! Attribute floats and reduction kinds: the vocabulary shared by graphs and
//! kernels (the pointwise ops themselves are declared in `table.rs`).

use std::fmt;

/// An `f64` attribute that can be compared and hashed (by bits), printed so it round-trips.
#[derive(Debug, Clone, Copy)]
pub struct Float(pub f64);

impl PartialEq for Float {
    fn eq(&self, o: &Self) -> bool {
        self.0.to_bits() == o.0.to_bits()
    }
}
impl Eq for Float {}
impl std::hash::Hash for Float {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.to_bits().hash(h)
    }
}
impl fmt::Display for Float {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}` prints the shortest string that parses back to the same f64.
        write!(f, "{:?}", self.0)
    }
}

/// Reductions over one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Prod,
    /// NaN-propagating, as `torch.amax`.
    Max,
    Min,
    /// Index (i64) of the first maximum; NaN counts as the maximum, as in PyTorch.
    ArgMax,
    ArgMin,
    /// `torch.logsumexp` in one pass (online: a running max with a rescaled
    /// sum). A row of only -inf (or an empty row) gives -inf, a +inf gives
    /// +inf, NaN propagates.
    LogSumExp,
    /// Welford's one-pass mean and variance; the value is the biased
    /// variance (`torch.var(correction=0)`); kernels also read the mean.
    /// An empty row gives NaN.
    Welford,
}

impl ReduceKind {
    pub fn name(&self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Prod => "prod",
            ReduceKind::Max => "amax",
            ReduceKind::Min => "amin",
            ReduceKind::ArgMax => "argmax",
            ReduceKind::ArgMin => "argmin",
            ReduceKind::LogSumExp => "lse",
            ReduceKind::Welford => "welford",
        }
    }

    /// Every kind, in declaration order (for parsers and exhaustive tests).
    pub const ALL: [ReduceKind; 8] = [
        ReduceKind::Sum,
        ReduceKind::Prod,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::ArgMax,
        ReduceKind::ArgMin,
        ReduceKind::LogSumExp,
        ReduceKind::Welford,
    ];

    /// Kinds that only reduce floating values (`lse`, `welford`).
    pub fn float_only(&self) -> bool {
        matches!(self, ReduceKind::LogSumExp | ReduceKind::Welford)
    }
}

impl fmt::Display for ReduceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
