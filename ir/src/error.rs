//! The one error type of kiln. Every message names the op and the offending
//! shapes, dtypes or keys, so a user can act on it without a debugger.

/// An error from any kiln operation.
///
/// ```
/// let e = kiln_ir::Error::op("add", "shapes [32,1] and [3] cannot broadcast at dim 1 (1 vs 3)");
/// assert_eq!(e.to_string(), "add: shapes [32,1] and [3] cannot broadcast at dim 1 (1 vs 3)");
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op was called with arguments it cannot accept.
    #[error("{op}: {msg}")]
    Op { op: String, msg: String },
    /// Reading or writing a file failed, or its content is corrupt.
    #[error("{path}: {msg}")]
    Io { path: String, msg: String },
    /// Code generation or the JIT failed (a bug in kiln, reported instead of a panic).
    #[error("codegen: {0}")]
    Codegen(String),
}

impl Error {
    pub fn op(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Op {
            op: op.into(),
            msg: msg.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `bail!(op, "fmt", args..)` returns `Err(Error::op(op, format!(..)))`.
#[macro_export]
macro_rules! bail {
    ($op:expr, $($arg:tt)*) => { return Err($crate::Error::op($op, format!($($arg)*))) };
}
