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
    /// Composites lowered to primitives, and the fusion plan's kernels.
    Fused,
    /// The KernelIR of every kernel one call launches.
    Kernels,
    /// The Cranelift IR of those kernels.
    Clif,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::Graph,
        Stage::Rewritten,
        Stage::Fused,
        Stage::Kernels,
        Stage::Clif,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Graph => "graph",
            Stage::Rewritten => "rewritten",
            Stage::Fused => "fused",
            Stage::Kernels => "kernels",
            Stage::Clif => "clif",
        }
    }

    pub fn parse(s: &str) -> Result<Stage> {
        match Stage::ALL.iter().find(|st| st.name() == s) {
            Some(st) => Ok(*st),
            None => bail!(
                "dump",
                "unknown stage `{s}`: expected one of graph, rewritten, fused, kernels, clif"
            ),
        }
    }
}

impl Compiled<'_> {
    /// The text of `stage` for the entry that `args` select (compiling it if needed).
    pub fn dump(&self, stage: Stage, args: &[Tensor]) -> Result<String> {
        let _ng = crate::autograd::no_grad();
        self.call(args)?;
        let (outs, kernels) = kiln_runtime::record_kernels(|| self.call(args));
        outs?;
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let guards = super::Guards::of(args, (self.training)(), false);
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
            Stage::Kernels => kernels.iter().map(|k| k.to_text() + "\n").collect(),
            Stage::Clif => {
                let mut s = String::new();
                for k in &kernels {
                    s += &kiln_codegen::cpu::CpuJit::clif_text(k)?;
                    s += "\n";
                }
                s
            }
        })
    }
}
