//! The text of each compile stage (`kiln dump --stage ...`, `KILN_LOG`).

use super::Compiled;
use crate::Tensor;
use kiln_ir::{bail, Result};

/// A stage of the compile pipeline, as `kiln dump --stage` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The traced graph.
    Graph,
    /// After the e-graph rewrites (algebra, constant and BatchNorm folding).
    Rewritten,
    /// Composites lowered to primitives, and the fusion plan's kernels (of
    /// the forward half, for a training entry).
    Fused,
    /// A training entry's backward half and its fusion plan.
    Backward,
    /// The KernelIR of every kernel one call launches.
    Kernels,
    /// The Cranelift IR of those kernels.
    Clif,
    /// The CUDA C of those kernels (one source per fused group; with inputs
    /// on a CUDA device, as specialised there: f16/bf16 loaded natively).
    Cuda,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Graph,
        Stage::Rewritten,
        Stage::Fused,
        Stage::Backward,
        Stage::Kernels,
        Stage::Clif,
        Stage::Cuda,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Graph => "graph",
            Stage::Rewritten => "rewritten",
            Stage::Fused => "fused",
            Stage::Backward => "backward",
            Stage::Kernels => "kernels",
            Stage::Clif => "clif",
            Stage::Cuda => "cuda",
        }
    }

    pub fn parse(s: &str) -> Result<Stage> {
        match Stage::ALL.iter().find(|st| st.name() == s) {
            Some(st) => Ok(*st),
            None => bail!(
                "dump",
                "unknown stage `{s}`: expected one of graph, rewritten, fused, backward, kernels, clif, cuda"
            ),
        }
    }
}

impl Compiled<'_> {
    /// The text of `stage` for the entry that `args` select (compiling it if
    /// needed), run without gradients.
    pub fn dump(&self, stage: Stage, args: &[Tensor]) -> Result<String> {
        let _ng = crate::autograd::no_grad();
        self.dump_entry(stage, args, false)
    }

    /// [`Compiled::dump`] for the training entry: `args` as given, grad mode
    /// on; the joint graph is `Stage::Graph`, and `Stage::Kernels`/`Clif`
    /// list one forward and one backward run (from the sum of the result).
    pub fn dump_training(&self, stage: Stage, args: &[Tensor]) -> Result<String> {
        let _g = crate::autograd::set_grad_enabled(true);
        self.dump_entry(stage, args, true)
    }

    fn dump_entry(&self, stage: Stage, args: &[Tensor], train: bool) -> Result<String> {
        let step = || -> Result<()> {
            let outs = self.call(args)?;
            if train {
                match outs.iter().find(|o| o.requires_grad()) {
                    Some(o) => o.sum(None, false)?.backward()?,
                    None => bail!("dump", "`{}`: no result requires grad", self.name),
                }
            }
            Ok(())
        };
        step()?;
        let (r, kernels) = kiln_runtime::record_kernels(step);
        r?;
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let guards = super::Guards::of(
            args,
            (self.training)(),
            train && self.needs_grad(args, &st.grad_captures),
        );
        let Some(e) = st.entries.iter().find(|e| e.guards == guards) else {
            bail!("dump", "no compiled entry for these inputs");
        };
        if let Some(b) = &e.graph_break {
            bail!("dump", "`{}` did not compile: {b}", self.name);
        }
        let exec = e.exec.as_ref().expect("compiled");
        Ok(match stage {
            Stage::Graph => e.traced.as_ref().map(|g| g.to_text()).unwrap_or_default(),
            Stage::Rewritten => e
                .rewritten
                .as_ref()
                .map(|g| g.to_text())
                .unwrap_or_default(),
            Stage::Fused => format!(
                "{}{}",
                exec.graph.to_text(),
                kiln_passes::fusion::dump(&exec.graph, &exec.plan)
            ),
            Stage::Backward => match &e.train {
                Some(t) => {
                    let b = t.backward_exec();
                    format!(
                        "{}{}",
                        b.graph.to_text(),
                        kiln_passes::fusion::dump(&b.graph, &b.plan)
                    )
                }
                None => bail!(
                    "dump",
                    "`{}`: not a training entry (no backward)",
                    self.name
                ),
            },
            Stage::Kernels => kernels.iter().map(|k| k.to_text() + "\n").collect(),
            Stage::Clif => {
                let mut s = String::new();
                for k in &kernels {
                    s += &kiln_codegen::cpu::CpuJit::clif_text(k)?;
                    s += "\n";
                }
                s
            }
            Stage::Cuda => {
                let mut s = String::new();
                for k in &kernels {
                    s += &kiln_codegen::cuda::cuda_source(k)?;
                    s += "\n";
                }
                s
            }
        })
    }
}
