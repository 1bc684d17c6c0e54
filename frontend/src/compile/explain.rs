//! `Compiled::explain()`: what compile did, in words a user can act on.

use super::guard::RecompileReason;
use super::pipeline::{Entry, StageTimes};
use kiln_ir::graph::{Graph, NodeId};
use kiln_ir::shape::fmt_dims;
use kiln_passes::fusion::{self, KernelKind, NodeKind};
use kiln_passes::memory_plan;
use std::fmt;

/// The report for every compiled entry of a function.
#[derive(Debug, Clone)]
pub struct Report {
    pub name: String,
    pub entries: Vec<EntryReport>,
    pub recompiles: Vec<RecompileReason>,
    /// Why calls now run eagerly, once the recompile limit was hit.
    pub gave_up: Option<String>,
}

/// One compiled specialisation.
#[derive(Debug, Clone, Default)]
pub struct EntryReport {
    /// Input shapes and dtypes it was compiled for.
    pub inputs: String,
    pub graph_break: Option<String>,
    /// Rewrite rules that fired, with counts.
    pub rewrites: Vec<(String, usize)>,
    /// Kernel names (`fused[mul+add+gelu]`), one per launch of every call.
    pub kernels: Vec<String>,
    /// Kernels computing parameter-only values (BatchNorm folded into a conv's
    /// weight): run once, then again only when a parameter changes.
    pub hoisted: Vec<String>,
    /// Ops that kept their own kernel, with the reason.
    pub unfused: Vec<String>,
    /// The CPU algorithm of each conv (`conv2d [..] * [..]: winograd-f2x2-3x3 (timed)`).
    pub conv_algorithms: Vec<String>,
    pub nodes_traced: usize,
    pub planned_peak: usize,
    pub unplanned: usize,
    pub eager_peak: usize,
    /// The launch list warm calls replay (see `program.rs`): its replayed
    /// launches, node steps and planned buffer bytes, or why calls run node
    /// by node; None until the call that records it.
    pub launch_list: Option<std::result::Result<LaunchList, String>>,
    pub times: StageTimes,
    /// For a training entry: its backward half (`kernels` are the forward's).
    pub backward: Option<BackwardReport>,
}

/// The shape of an entry's recorded launch list.
///
/// ```
/// let l = kiln_frontend::compile::LaunchList { launches: 3, node_steps: 1, planned_bytes: 4096 };
/// assert_eq!(l.to_string(), "3 replayed launches, 1 node steps, 4.0 KiB in planned buffers");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchList {
    /// Kernel launches (and tiled conv epilogues) called directly.
    pub launches: usize,
    /// Nodes run through their own code every call (externs: GEMM, conv, pools).
    pub node_steps: usize,
    /// Bytes of the buffers the memory plan placed the launches' outputs in.
    pub planned_bytes: usize,
}

impl fmt::Display for LaunchList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} replayed launches, {} node steps, {} in planned buffers",
            self.launches,
            self.node_steps,
            kib(self.planned_bytes)
        )
    }
}

/// The backward half of a compiled training entry.
#[derive(Debug, Clone, Default)]
pub struct BackwardReport {
    /// Kernels of one backward run.
    pub kernels: Vec<String>,
    /// Values the forward hands to the backward, and their bytes (forward
    /// outputs, alive anyway, count nothing).
    pub saved: usize,
    pub saved_bytes: usize,
    /// Forward values the backward recomputes instead of saving.
    pub recomputed: usize,
    pub recomputed_bytes: usize,
    /// The backward's recorded launch list, as [`EntryReport::launch_list`].
    pub launch_list: Option<std::result::Result<LaunchList, String>>,
}

impl EntryReport {
    pub fn launches(&self) -> usize {
        self.kernels.len()
    }

    /// `trace 1.20 ms, rewrite ..., first run ... (N kernels compiled)`.
    pub fn times_line(&self) -> String {
        let t = &self.times;
        format!(
            "trace {}, rewrite {}, decompose {}{}, plan {}, first run {} ({} kernels compiled)",
            ms(t.trace),
            ms(t.rewrite),
            ms(t.decompose),
            if t.from_disk_cache {
                " (passes skipped: disk cache)"
            } else {
                ""
            },
            ms(t.plan),
            ms(t.first_run),
            t.kernels_compiled
        )
    }
}

/// `exec`'s recorded launch list (see [`EntryReport::launch_list`]).
fn launch_list(exec: &super::exec::Executable) -> Option<std::result::Result<LaunchList, String>> {
    exec.program_summary().map(|p| {
        p.map(|(launches, node_steps, planned_bytes)| LaunchList {
            launches,
            node_steps,
            planned_bytes,
        })
    })
}

fn unfused_reason(g: &Graph, id: NodeId, readers: &[Vec<NodeId>]) -> String {
    let r = &readers[id.index()];
    if g.outputs().contains(&id) {
        return "its result is a graph output".into();
    }
    if r.len() > 1 {
        return format!(
            "its result is read by {} ops, so no single epilogue",
            r.len()
        );
    }
    match r.first() {
        Some(c) if fusion::node_kind(&g.node(*c).op) != NodeKind::Pointwise => {
            format!("its reader `{}` is not pointwise", g.node(*c).op_name())
        }
        Some(_) => "its pointwise reader changes the shape or dtype".into(),
        None => "nothing reads it".into(),
    }
}

impl Entry {
    pub fn report(&self) -> EntryReport {
        let inputs = self
            .guards
            .args
            .iter()
            .zip(&self.guards.devices)
            .map(|((d, s, _), dev)| match dev {
                // CPU inputs print as before; a device input says where it is
                kiln_runtime::Device::Cpu => format!("{d}{}", fmt_dims(s)),
                dev => format!("{d}{} on {dev}", fmt_dims(s)),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let mut r = EntryReport {
            inputs,
            graph_break: self.graph_break.as_ref().map(|b| b.to_string()),
            nodes_traced: self.traced.as_ref().map_or(0, |g| g.len()),
            rewrites: self.rewrites.clone(),
            times: self.times.clone(),
            ..EntryReport::default()
        };
        let Some(exec) = &self.exec else {
            return r;
        };
        r.backward = self.train.as_ref().map(|t| {
            let (b, p) = (t.backward_exec(), &t.partition);
            BackwardReport {
                kernels: b
                    .plan
                    .kernels
                    .iter()
                    .map(|k| fusion::kernel_name(&b.graph, k))
                    .collect(),
                saved: p.n_saved,
                saved_bytes: p.saved_bytes,
                recomputed: p.recomputed,
                recomputed_bytes: p.recomputed_bytes,
                launch_list: launch_list(b),
            }
        });
        let g = &exec.graph;
        let mut readers = vec![vec![]; g.len()];
        for (id, n) in g.iter() {
            for o in &n.operands {
                readers[o.index()].push(id);
            }
        }
        for k in &exec.plan.kernels {
            if exec.is_hoisted(k.root) {
                r.hoisted.push(fusion::kernel_name(g, k));
                continue;
            }
            r.kernels.push(fusion::kernel_name(g, k));
            if k.kind == (KernelKind::Extern { epilogue: None }) {
                r.unfused.push(format!(
                    "{} (extern kernel, no epilogue): {}",
                    g.node(k.root).op_name(),
                    unfused_reason(g, k.root, &readers)
                ));
            }
        }
        r.conv_algorithms = super::conv_report::conv_algorithms(g);
        r.launch_list = launch_list(exec);
        r.planned_peak = exec.memory.planned_peak;
        r.unplanned = exec.memory.unplanned;
        r.eager_peak = self.traced.as_ref().map_or(0, |t| {
            memory_plan::eager_peak(
                &kiln_passes::lower::decompose_composites(t).unwrap_or_else(|_| t.clone()),
            )
        });
        r
    }
}

fn kib(b: usize) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

impl fmt::Display for EntryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "entry ({})", self.inputs)?;
        if let Some(b) = &self.graph_break {
            return writeln!(f, "  {b}; this entry runs eagerly");
        }
        writeln!(
            f,
            "  {} kernels from {} traced nodes:",
            self.kernels.len(),
            self.nodes_traced
        )?;
        for (i, k) in self.kernels.iter().enumerate() {
            writeln!(f, "    {i}: {k}")?;
        }
        if !self.hoisted.is_empty() {
            writeln!(
                f,
                "  hoisted (once per parameter version): {}",
                self.hoisted.join(", ")
            )?;
        }
        if !self.rewrites.is_empty() {
            let r: Vec<String> = self
                .rewrites
                .iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect();
            writeln!(f, "  rewrites: {}", r.join(", "))?;
        }
        for u in &self.unfused {
            writeln!(f, "  unfused: {u}")?;
        }
        for c in &self.conv_algorithms {
            writeln!(f, "  conv algorithm: {c}")?;
        }
        if let Some(b) = &self.backward {
            writeln!(
                f,
                "  saved for backward: {} values, {} (recomputed in backward instead: {} values, {})",
                b.saved,
                kib(b.saved_bytes),
                b.recomputed,
                kib(b.recomputed_bytes)
            )?;
            writeln!(f, "  backward: {} kernels:", b.kernels.len())?;
            for (i, k) in b.kernels.iter().enumerate() {
                writeln!(f, "    {i}: {k}")?;
            }
            match &b.launch_list {
                Some(Ok(l)) => writeln!(f, "  backward warm calls: {l}")?,
                Some(Err(why)) => writeln!(f, "  backward warm calls: node by node ({why})")?,
                None => {}
            }
        }
        writeln!(
            f,
            "  memory: planned peak {} (unplanned {}, eager {})",
            kib(self.planned_peak),
            kib(self.unplanned),
            kib(self.eager_peak)
        )?;
        match &self.launch_list {
            Some(Ok(l)) => writeln!(f, "  warm calls: {l}")?,
            Some(Err(why)) => writeln!(f, "  warm calls: node by node ({why})")?,
            None => {}
        }
        writeln!(f, "  compile time: {}", self.times_line())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "compiled `{}`: {} entries",
            self.name,
            self.entries.len()
        )?;
        for e in &self.entries {
            write!(f, "{e}")?;
        }
        for r in &self.recompiles {
            writeln!(f, "recompile: {r}")?;
        }
        if let Some(g) = &self.gave_up {
            writeln!(f, "{g}")?;
        }
        Ok(())
    }
}
