//! The host side of the JIT: the target ISA, the JIT module, and the Rust
//! functions compiled kernels may call (accurate f64 transcendentals, pow,
//! fmod, integer pow) — registered with `JITBuilder::symbol` and imported into
//! each function by index.

use cranelift_codegen::ir::{
    self, AbiParam, ExtFuncData, ExternalName, FuncRef, Signature, UserExternalName,
};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use kiln_ir::Error;

/// A host function a kernel may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum HostFn {
    Sin,
    Cos,
    Exp,
    Log,
    Log1p,
    Expm1,
    Tanh,
    Erf,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Atan2,
    Hypot,
    Pow,
    Fmod,
    IPow,
    /// `(op code, tile pointer, n) -> ()`: a wide-vector block helper on a tile
    /// (`wide::WideIsa::entry`, the ISA chosen when the module is made).
    WideUnary,
    /// `(kind, tile pointer, n, state pointer, count, next row) -> ()`: folds
    /// a tile into a log-sum-exp or Welford state (`wide::WideIsa::reduce_entry`).
    WideReduce,
    /// `(row pointer) -> ()`: a normalisation's row pass
    /// (`wide::AffineRow`, `wide::WideIsa::affine_entry`).
    WideAffine,
    /// `(row pointer) -> ()`: a pointwise row that is one chain around a
    /// wide op (`wide::ChainRow`, `wide::WideIsa::chain_entry`).
    WideChain,
}

impl HostFn {
    pub(crate) const ALL: [HostFn; 23] = [
        HostFn::Sin,
        HostFn::Cos,
        HostFn::Exp,
        HostFn::Log,
        HostFn::Log1p,
        HostFn::Expm1,
        HostFn::Tanh,
        HostFn::Erf,
        HostFn::Pow,
        HostFn::Fmod,
        HostFn::IPow,
        HostFn::WideUnary,
        HostFn::WideReduce,
        HostFn::Tan,
        HostFn::Asin,
        HostFn::Acos,
        HostFn::Atan,
        HostFn::Sinh,
        HostFn::Cosh,
        HostFn::Atan2,
        HostFn::Hypot,
        HostFn::WideAffine,
        HostFn::WideChain,
    ];

    fn index(self) -> usize {
        HostFn::ALL.iter().position(|&h| h == self).unwrap()
    }

    fn symbol(self) -> &'static str {
        match self {
            HostFn::Sin => "kiln_host_sin",
            HostFn::Cos => "kiln_host_cos",
            HostFn::Exp => "kiln_host_exp",
            HostFn::Log => "kiln_host_log",
            HostFn::Log1p => "kiln_host_log1p",
            HostFn::Expm1 => "kiln_host_expm1",
            HostFn::Tanh => "kiln_host_tanh",
            HostFn::Erf => "kiln_host_erf",
            HostFn::Tan => "kiln_host_tan",
            HostFn::Asin => "kiln_host_asin",
            HostFn::Acos => "kiln_host_acos",
            HostFn::Atan => "kiln_host_atan",
            HostFn::Sinh => "kiln_host_sinh",
            HostFn::Cosh => "kiln_host_cosh",
            HostFn::Atan2 => "kiln_host_atan2",
            HostFn::Hypot => "kiln_host_hypot",
            HostFn::Pow => "kiln_host_pow",
            HostFn::Fmod => "kiln_host_fmod",
            HostFn::IPow => "kiln_host_ipow",
            HostFn::WideUnary => "kiln_wide_unary",
            HostFn::WideReduce => "kiln_wide_reduce",
            HostFn::WideAffine => "kiln_wide_affine",
            HostFn::WideChain => "kiln_wide_chain",
        }
    }

    fn address(self) -> *const u8 {
        match self {
            HostFn::Sin => host_sin as *const u8,
            HostFn::Cos => host_cos as *const u8,
            HostFn::Exp => host_exp as *const u8,
            HostFn::Log => host_log as *const u8,
            HostFn::Log1p => host_log1p as *const u8,
            HostFn::Expm1 => host_expm1 as *const u8,
            HostFn::Tanh => host_tanh as *const u8,
            HostFn::Erf => host_erf as *const u8,
            HostFn::Tan => host_tan as *const u8,
            HostFn::Asin => host_asin as *const u8,
            HostFn::Acos => host_acos as *const u8,
            HostFn::Atan => host_atan as *const u8,
            HostFn::Sinh => host_sinh as *const u8,
            HostFn::Cosh => host_cosh as *const u8,
            HostFn::Atan2 => host_atan2 as *const u8,
            HostFn::Hypot => host_hypot as *const u8,
            HostFn::Pow => host_pow as *const u8,
            HostFn::Fmod => host_fmod as *const u8,
            HostFn::IPow => host_ipow as *const u8,
            HostFn::WideUnary => super::wide::detect()
                .unwrap_or(super::wide::WideIsa::Portable)
                .entry(),
            HostFn::WideReduce => super::wide::detect()
                .unwrap_or(super::wide::WideIsa::Portable)
                .reduce_entry(),
            HostFn::WideAffine => super::wide::detect()
                .unwrap_or(super::wide::WideIsa::Portable)
                .affine_entry(),
            HostFn::WideChain => super::wide::detect()
                .unwrap_or(super::wide::WideIsa::Portable)
                .chain_entry(),
        }
    }

    /// Number of arguments; all take and return f64, except `IPow` (i64)
    /// and the wide helpers (i64 arguments, no result).
    pub(crate) fn arity(self) -> usize {
        match self {
            HostFn::Pow | HostFn::Fmod | HostFn::IPow | HostFn::Atan2 | HostFn::Hypot => 2,
            HostFn::WideUnary => 3,
            HostFn::WideReduce => 6,
            HostFn::WideAffine | HostFn::WideChain => 1,
            _ => 1,
        }
    }

    pub(crate) fn signature(self, cc: CallConv) -> Signature {
        if matches!(
            self,
            HostFn::WideUnary | HostFn::WideReduce | HostFn::WideAffine | HostFn::WideChain
        ) {
            let mut sig = Signature::new(cc);
            for _ in 0..self.arity() {
                sig.params.push(AbiParam::new(ir::types::I64));
            }
            return sig;
        }
        let t = if self == HostFn::IPow {
            ir::types::I64
        } else {
            ir::types::F64
        };
        let mut sig = Signature::new(cc);
        for _ in 0..self.arity() {
            sig.params.push(AbiParam::new(t));
        }
        sig.returns.push(AbiParam::new(t));
        sig
    }
}

extern "C" fn host_sin(x: f64) -> f64 {
    x.sin()
}
extern "C" fn host_cos(x: f64) -> f64 {
    x.cos()
}
extern "C" fn host_exp(x: f64) -> f64 {
    x.exp()
}
extern "C" fn host_log(x: f64) -> f64 {
    x.ln()
}
extern "C" fn host_log1p(x: f64) -> f64 {
    x.ln_1p()
}
extern "C" fn host_expm1(x: f64) -> f64 {
    x.exp_m1()
}
extern "C" fn host_tanh(x: f64) -> f64 {
    x.tanh()
}
extern "C" fn host_erf(x: f64) -> f64 {
    kiln_ir::interp::erf(x)
}
extern "C" fn host_tan(x: f64) -> f64 {
    x.tan()
}
extern "C" fn host_asin(x: f64) -> f64 {
    x.asin()
}
extern "C" fn host_acos(x: f64) -> f64 {
    x.acos()
}
extern "C" fn host_atan(x: f64) -> f64 {
    x.atan()
}
extern "C" fn host_sinh(x: f64) -> f64 {
    x.sinh()
}
extern "C" fn host_cosh(x: f64) -> f64 {
    x.cosh()
}
extern "C" fn host_atan2(y: f64, x: f64) -> f64 {
    y.atan2(x)
}
extern "C" fn host_hypot(x: f64, y: f64) -> f64 {
    x.hypot(y)
}
extern "C" fn host_pow(x: f64, y: f64) -> f64 {
    x.powf(y)
}
extern "C" fn host_fmod(x: f64, y: f64) -> f64 {
    x % y
}
extern "C" fn host_ipow(x: i64, y: i64) -> i64 {
    kiln_ir::interp::ipow(x, y)
}

/// Imports host functions into the function being built, once each.
pub(crate) struct HostImports {
    /// External-name index of each host function (module FuncId, or ordinal for dumps).
    ids: [u32; HostFn::ALL.len()],
    refs: [Option<FuncRef>; HostFn::ALL.len()],
    cc: CallConv,
}

impl HostImports {
    pub(crate) fn new(ids: [u32; HostFn::ALL.len()], cc: CallConv) -> Self {
        HostImports {
            ids,
            refs: [None; HostFn::ALL.len()],
            cc,
        }
    }

    /// Ordinal numbering, for deterministic text dumps.
    pub(crate) fn ordinal(cc: CallConv) -> Self {
        let mut ids = [0u32; HostFn::ALL.len()];
        for (i, id) in ids.iter_mut().enumerate() {
            *id = i as u32;
        }
        Self::new(ids, cc)
    }

    pub(crate) fn get(&mut self, func: &mut ir::Function, h: HostFn) -> FuncRef {
        let i = h.index();
        if let Some(r) = self.refs[i] {
            return r;
        }
        let signature = func.import_signature(h.signature(self.cc));
        let name = func.declare_imported_user_function(UserExternalName {
            namespace: 0,
            index: self.ids[i],
        });
        let r = func.import_function(ExtFuncData {
            name: ExternalName::user(name),
            signature,
            colocated: false,
            patchable: false,
        });
        self.refs[i] = Some(r);
        r
    }
}

fn jit_err(e: impl std::fmt::Display) -> Error {
    Error::Codegen(format!("cpu jit: {e}"))
}

/// The host ISA with kiln's JIT settings.
pub(crate) fn host_isa() -> Result<OwnedTargetIsa, Error> {
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").map_err(jit_err)?;
    flags.set("is_pic", "false").map_err(jit_err)?;
    flags
        .set("use_colocated_libcalls", "false")
        .map_err(jit_err)?;
    flags
        .set(
            "enable_verifier",
            if cfg!(debug_assertions) {
                "true"
            } else {
                "false"
            },
        )
        .map_err(jit_err)?;
    let isa = cranelift_native::builder().map_err(jit_err)?;
    isa.finish(settings::Flags::new(flags)).map_err(jit_err)
}

/// Whether the ISA has a fused multiply-add instruction (else `fma` is a libcall).
pub(crate) fn has_fma(isa: &OwnedTargetIsa) -> bool {
    if !cfg!(target_arch = "x86_64") {
        return true;
    }
    isa.isa_flags()
        .iter()
        .any(|v| v.name == "has_fma" && v.as_bool() == Some(true))
}

/// A JIT module with every host function declared; returns their FuncIds.
pub(crate) fn new_module(
    isa: OwnedTargetIsa,
) -> Result<(JITModule, [u32; HostFn::ALL.len()]), Error> {
    let cc = isa.default_call_conv();
    let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
    for h in HostFn::ALL {
        builder.symbol(h.symbol(), h.address());
    }
    let mut module = JITModule::new(builder);
    let mut ids = [0u32; HostFn::ALL.len()];
    for (i, h) in HostFn::ALL.iter().enumerate() {
        let id = module
            .declare_function(h.symbol(), Linkage::Import, &h.signature(cc))
            .map_err(jit_err)?;
        ids[i] = id.as_u32();
    }
    Ok((module, ids))
}

pub(crate) fn codegen_err(e: impl std::fmt::Debug) -> Error {
    Error::Codegen(format!("cpu jit: {e:?}"))
}
