//! The Cranelift backend: KernelIR -> machine code for the host CPU.
//!
//! - [`CpuJit`] owns a JIT module; [`CpuJit::compile`] turns a [`Kernel`]
//!   into a [`CompiledKernel`] (a [`KernelFn`] pointer, valid for the rest of
//!   the process). Put it behind a `Mutex` to share it between threads; the
//!   compiled functions themselves are `Send + Sync` and reentrant.
//! - Threads split dim 0: every call computes `start..end` of it (see
//!   [`crate::interp`] for the exact meaning of a kernel).
//! - [`CpuJit::clif_text`] is the Cranelift IR of a kernel, for snapshots.
//!
//! Layout: `plan` decides scalar vs vector rows, `loops` emits the loop nest
//! and pointwise rows, `reduce` the reduced rows, `emit` implements
//! [`kiln_ir::scalar::ScalarOps`] in Cranelift terms, `math` the vectorisable
//! f32 transcendentals, `jit` the module and host functions, `tiles` the
//! pointwise rows that call [`wide`]'s AVX2/AVX-512 block helpers.

mod chain;
mod columns;
mod emit;
mod jit;
mod loops;
mod math;
mod online;
mod plan;
mod reduce;
mod rows;
mod softmax_row;
mod tiles;
pub mod wide;

use crate::kernel::{Kernel, KernelFn};
use cranelift_codegen::ir::immediates::Imm64;
use cranelift_codegen::ir::{
    types, AbiParam, ExternalName, Function, GlobalValueData, Signature, UserExternalName,
    UserFuncName,
};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa, TargetFrontendConfig};
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::JITModule;
use cranelift_module::{DataDescription, Module};
use jit::{HostFn, HostImports};
use kiln_ir::Error;

/// A JIT for kernels. Not `Sync`: share it behind a `Mutex`.
pub struct CpuJit {
    module: JITModule,
    isa: OwnedTargetIsa,
    host_ids: [u32; HostFn::ALL.len()],
    fma: bool,
    /// Which kernels call the wide helpers ([`wide::Uses::from_env`] unless
    /// [`CpuJit::set_wide`] said otherwise; none without a wide ISA and FMA).
    wide: wide::Uses,
    fctx: FunctionBuilderContext,
    ctx: Context,
    compiled: usize,
}

/// A compiled kernel. Its code lives as long as the [`CpuJit`] that compiled
/// it (until [`CpuJit::free_memory`]), so it can be copied around and called
/// from any thread while that JIT lives.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    func: KernelFn,
    /// The kernel's name, for profiles.
    pub name: String,
    /// Bytes of machine code.
    pub code_size: usize,
    /// Vector lanes of the innermost loop (1 = scalar code).
    pub lanes: u32,
}

impl CompiledKernel {
    /// The raw function pointer (the [`KernelFn`] ABI). A caller that hands
    /// the output to another thread fences its streaming stores first
    /// ([`wide::fence_streams`]), as [`CompiledKernel::call`] does.
    pub fn func(&self) -> KernelFn {
        self.func
    }

    /// Runs the kernel over `start..end` of dim 0, then fences the
    /// streaming stores it made ([`wide::fence_streams`]).
    ///
    /// # Safety
    /// `ptrs`, `strides` (`operands * rank` entries), `sizes` (`rank`) and `scalars`
    /// must describe valid memory for every element the kernel touches.
    pub unsafe fn call(
        &self,
        ptrs: &[*mut u8],
        strides: &[isize],
        sizes: &[usize],
        scalars: &[u64],
        start: usize,
        end: usize,
    ) {
        (self.func)(
            ptrs.as_ptr(),
            strides.as_ptr(),
            sizes.as_ptr(),
            scalars.as_ptr(),
            start,
            end,
        );
        wide::fence_streams();
    }
}

fn kernel_signature(cc: CallConv) -> Signature {
    let mut sig = Signature::new(cc);
    for _ in 0..6 {
        sig.params.push(AbiParam::new(types::I64));
    }
    sig
}

/// Builds the Cranelift function of `k` into `func`; returns the plan and the
/// constant pool (the data object `pool_index` the function refers to).
fn build_function(
    k: &Kernel,
    func: &mut Function,
    fctx: &mut FunctionBuilderContext,
    hosts: HostImports,
    (fma, wide): (bool, wide::Uses),
    config: TargetFrontendConfig,
    pool_index: u32,
) -> Result<(plan::Plan, Vec<u8>), Error> {
    crate::interp::validate(k)?;
    crate::validate::reject_half(k, "the CPU JIT")?;
    let plan = plan::Plan::of(k);
    let name = func.declare_imported_user_function(UserExternalName {
        namespace: 1,
        index: pool_index,
    });
    let pool_gv = func.create_global_value(GlobalValueData::Symbol {
        name: ExternalName::user(name),
        offset: Imm64::new(0),
        colocated: false,
        tls: false,
    });
    let mut b = FunctionBuilder::new(func, fctx);
    let mut em = emit::Emitter::new(&mut b, hosts, fma, pool_gv);
    em.wide = if fma { wide } else { wide::Uses::default() };
    loops::build(k, &mut em, &plan);
    if let Some(e) = em.err.take() {
        return Err(Error::Codegen(format!("kernel {}: {e}", k.name)));
    }
    let mut pool = std::mem::take(&mut em.pool);
    if pool.is_empty() {
        pool.resize(16, 0);
    }
    b.seal_all_blocks();
    b.finalize(config);
    Ok((plan, pool))
}

impl CpuJit {
    /// A JIT for the host CPU.
    pub fn new() -> Result<CpuJit, Error> {
        let isa = jit::host_isa()?;
        let fma = jit::has_fma(&isa);
        let (module, host_ids) = jit::new_module(jit::host_isa()?)?;
        Ok(CpuJit {
            module,
            isa,
            host_ids,
            fma,
            wide: match wide::detect() {
                Some(isa) if fma => wide::Uses::from_env(isa),
                _ => wide::Uses::default(),
            },
            fctx: FunctionBuilderContext::new(),
            ctx: Context::new(),
            compiled: 0,
        })
    }

    /// The wide ISA kernels compiled from now on call, if any ([`wide::detect`];
    /// `None` without AVX2/AVX-512, with `KILN_WIDE=0` or after `set_wide(false)`).
    pub fn wide_isa(&self) -> Option<wide::WideIsa> {
        if self.wide.any() {
            wide::detect()
        } else {
            None
        }
    }

    /// Turns the wide helpers on (where the CPU has them) or off for kernels
    /// compiled from now on; off, they are plain f32x4 code (same results).
    pub fn set_wide(&mut self, on: bool) {
        self.wide = wide::Uses::all(on && self.fma && wide::detect().is_some());
    }

    /// Uses exactly `uses` of the wide helpers (where the CPU has them) for
    /// kernels compiled from now on: e.g. tiled rows without chains, to
    /// compare the two.
    ///
    /// ```
    /// use kiln_codegen::cpu::{wide::Uses, CpuJit};
    /// let mut jit = CpuJit::new().unwrap();
    /// jit.set_wide_uses(Uses { chains: false, ..Uses::all(true) });
    /// jit.set_wide_uses(Uses::all(false));
    /// assert_eq!(jit.wide_isa(), None);
    /// ```
    pub fn set_wide_uses(&mut self, uses: wide::Uses) {
        let here = self.fma && wide::detect().is_some();
        self.wide = if here { uses } else { wide::Uses::all(false) };
    }

    /// Frees the machine code of every kernel this JIT compiled (dropping a
    /// `CpuJit` keeps it mapped).
    ///
    /// # Safety
    /// No [`CompiledKernel`] from this JIT may be called afterwards.
    pub unsafe fn free_memory(self) {
        self.module.free_memory()
    }

    /// Number of kernels compiled so far.
    pub fn compiled_count(&self) -> usize {
        self.compiled
    }

    /// Compiles `k` to machine code.
    pub fn compile(&mut self, k: &Kernel) -> Result<CompiledKernel, Error> {
        let cc = self.isa.default_call_conv();
        let sig = kernel_signature(cc);
        let id = self
            .module
            .declare_anonymous_function(&sig)
            .map_err(jit::codegen_err)?;
        self.module.clear_context(&mut self.ctx);
        self.ctx.func.signature = sig;
        self.ctx.func.name = UserFuncName::user(0, id.as_u32());
        let hosts = HostImports::new(self.host_ids, cc);
        let data = self
            .module
            .declare_anonymous_data(false, false)
            .map_err(jit::codegen_err)?;
        let config = self.isa.frontend_config();
        let (plan, pool) = build_function(
            k,
            &mut self.ctx.func,
            &mut self.fctx,
            hosts,
            (self.fma, self.wide),
            config,
            data.as_u32(),
        )?;
        let mut desc = DataDescription::new();
        desc.define(pool.into_boxed_slice());
        desc.set_align(16);
        self.module
            .define_data(data, &desc)
            .map_err(jit::codegen_err)?;
        self.module
            .define_function(id, &mut self.ctx)
            .map_err(|e| {
                Error::Codegen(format!(
                    "kernel {}: cranelift rejected the function: {e:?}",
                    k.name
                ))
            })?;
        let code_size = self
            .ctx
            .compiled_code()
            .map(|c| c.code_buffer().len())
            .unwrap_or(0);
        self.module.clear_context(&mut self.ctx);
        self.module
            .finalize_definitions()
            .map_err(jit::codegen_err)?;
        let ptr = self.module.get_finalized_function(id);
        self.compiled += 1;
        // SAFETY: the function was built with the KernelFn signature.
        let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
        Ok(CompiledKernel {
            func,
            name: k.name.clone(),
            code_size,
            lanes: plan.lanes,
        })
    }

    /// The Cranelift IR of `k`, before optimisation (deterministic: fixed calling
    /// convention, FMA assumed, host functions numbered by kind).
    pub fn clif_text(k: &Kernel) -> Result<String, Error> {
        Self::clif_text_with(k, false)
    }

    /// [`CpuJit::clif_text`] with the wide helpers on: what a kernel becomes
    /// on a CPU with AVX2 or AVX-512.
    pub fn clif_text_wide(k: &Kernel) -> Result<String, Error> {
        Self::clif_text_with(k, true)
    }

    fn clif_text_with(k: &Kernel, wide: bool) -> Result<String, Error> {
        let mut func = Function::with_name_signature(
            UserFuncName::user(0, 0),
            kernel_signature(CallConv::SystemV),
        );
        let mut fctx = FunctionBuilderContext::new();
        let config = jit::host_isa()?.frontend_config();
        let hosts = HostImports::ordinal(CallConv::SystemV);
        let (_, pool) = build_function(
            k,
            &mut func,
            &mut fctx,
            hosts,
            (true, wide::Uses::all(wide)),
            config,
            0,
        )?;
        let mut text = func.display().to_string();
        // The constant pool, one 16-byte slot per line (lanes as hex words).
        for (i, slot) in pool.chunks(16).enumerate() {
            let words: Vec<String> = slot
                .chunks(4)
                .map(|w| format!("{:08x}", u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
                .collect();
            text.push_str(&format!("; pool+{}: {}\n", i * 16, words.join(" ")));
        }
        Ok(text)
    }

    /// The machine code of `k` as text (Cranelift's VCode disassembly), for
    /// `KILN_LOG=code` and for looking at what a kernel became.
    pub fn disasm(&mut self, k: &Kernel) -> Result<String, Error> {
        let cc = self.isa.default_call_conv();
        let mut ctx = Context::new();
        ctx.func.signature = kernel_signature(cc);
        ctx.set_disasm(true);
        let hosts = HostImports::new(self.host_ids, cc);
        build_function(
            k,
            &mut ctx.func,
            &mut self.fctx,
            hosts,
            (self.fma, self.wide),
            self.isa.frontend_config(),
            0,
        )?;
        let mut ctrl = Default::default();
        let code = ctx
            .compile(&*self.isa, &mut ctrl)
            .map_err(|e| Error::Codegen(format!("kernel {}: {:?}", k.name, e.inner)))?;
        Ok(code.vcode.clone().unwrap_or_default())
    }
}

/// The Cranelift IR of `k` (same as [`CpuJit::clif_text`]).
pub fn clif_text(k: &Kernel) -> Result<String, Error> {
    CpuJit::clif_text(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpujit_is_send() {
        fn send<T: Send>() {}
        send::<CpuJit>();
        fn send_sync<T: Send + Sync>() {}
        send_sync::<CompiledKernel>();
    }
}
