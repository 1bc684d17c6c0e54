//! `kiln bench --only DDP`: the W6 training step (MLP 784-1024-1024-10,
//! AdamW, global batch 256) data-parallel on 2 MPI ranks of 1 thread each
//! against 1 rank of 1 thread on the same global batch, and the share of
//! all-reduce time the trace shows under backward.
//!
//! The command starts `mpirun -n 1` and `mpirun -n 2` of itself (alternating,
//! three rounds, medians reported) with `RAYON_NUM_THREADS=1` and
//! `KILN_BENCH_DDP_RANK=1`; each rank then times its steps
//! ([`rank_main`]) and rank 0 prints one `ddp-result` line.

use super::train::{step, w6};
use super::{row, sample_median_ms, Row};
use crate::distributed::{self as dist, Backend, DdpOptions, DistributedDataParallel};
use crate::nn::{Module, ModuleExt};
use crate::optim::{AdamConfig, AdamW};
use crate::profiler::{self, Category, Profile};
use crate::{Error, Result, Tensor};
use std::path::Path;

const WORKER: &str = "KILN_BENCH_DDP_RANK";

/// Whether this process is a rank started by the DDP bench.
pub fn is_rank() -> bool {
    std::env::var_os(WORKER).is_some()
}

/// The share of all-reduce time that overlaps a `backward` on the
/// training thread, from the trace (0 when nothing was reduced).
pub fn hidden_share(p: &Profile) -> f64 {
    let ev = p.events();
    let back: Vec<(u64, u64)> = ev
        .iter()
        .filter(|e| e.name == "backward" && e.category == Category::Op)
        .map(|e| (e.start_ns, e.end_ns()))
        .collect();
    let (mut total, mut hidden) = (0u64, 0u64);
    for c in ev
        .iter()
        .filter(|e| e.category == Category::Comm && e.name.starts_with("all_reduce"))
    {
        total += c.dur_ns;
        for &(s, t) in &back {
            let (a, b) = (s.max(c.start_ns), t.min(c.end_ns()));
            if b > a {
                hidden += b - a;
            }
        }
    }
    if total == 0 {
        0.0
    } else {
        hidden as f64 / total as f64
    }
}

/// One rank's part: times the DDP step on this rank's share of the batch.
pub fn rank_main(iters: usize, profile_dir: Option<&Path>) -> Result<()> {
    dist::init_process_group(Backend::Mpi)?;
    let (rank, world) = (dist::rank(), dist::world_size());
    let w = w6();
    crate::manual_seed(1);
    let ddp = DistributedDataParallel::new(super::train::mlp()?, DdpOptions::default())?;
    ddp.module().train();
    let cfg = AdamConfig {
        lr: 1e-3,
        weight_decay: 0.01,
        ..AdamConfig::default()
    };
    let mut opt = AdamW::with_params(ddp.module().parameters(), cfg)?;
    let per = w.x.dims()[0] / world;
    let x = w.x.narrow(0, (rank * per) as i64, per)?.contiguous()?;
    let y = w.y.narrow(0, (rank * per) as i64, per)?.contiguous()?;
    let fwd = |x: &Tensor| ddp.forward(x);
    for _ in 0..2 {
        step(&fwd, &mut opt, &x, &y)?;
    }
    // one call per sample: every rank must run the same number of steps
    let ms = sample_median_ms(iters, 1, || {
        std::hint::black_box(step(&fwd, &mut opt, &x, &y)?);
        Ok(())
    })?;
    let (r, prof) = profiler::profile(|| -> Result<()> {
        for _ in 0..3 {
            step(&fwd, &mut opt, &x, &y)?;
        }
        Ok(())
    });
    r?;
    let hidden = hidden_share(&prof);
    if rank == 0 {
        if let Some(d) = profile_dir {
            prof.export_chrome_trace(d.join(format!("DDP-{world}.json")))?;
        }
        println!(
            "ddp-result world={world} threads={} ms={ms:.4} hidden={hidden:.4}",
            std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into())
        );
    }
    dist::barrier()?;
    dist::destroy_process_group();
    Ok(())
}

fn launch(world: usize, iters: usize, profile_dir: Option<&Path>) -> Result<(f64, f64)> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::op("bench DDP", format!("cannot find the kiln executable: {e}")))?;
    let mut c = crate::train::ddp::mpirun(world);
    c.arg(&exe)
        .args(["bench", "--only", "DDP", "--iters", &iters.to_string()])
        .env(WORKER, "1")
        .env("RAYON_NUM_THREADS", "1");
    if let Some(d) = profile_dir {
        c.arg("--profile").arg(d);
    }
    let out = c
        .output()
        .map_err(|e| Error::op("bench DDP", format!("cannot start mpirun: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.starts_with("ddp-result"))
        .ok_or_else(|| {
            Error::op(
                "bench DDP",
                format!(
                    "{world} ranks gave no result ({}):\n{text}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        })?;
    let field = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((field("ms="), field("hidden=")))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The DDP rows: 1 rank x 1 thread and 2 ranks x 1 thread (medians of three
/// alternating launches), with the speedup and the hidden share in `what`.
pub fn bench(iters: usize, profile_dir: Option<&Path>) -> Result<Vec<Row>> {
    let (mut one, mut two, mut hidden) = (vec![], vec![], vec![]);
    for _ in 0..3 {
        one.push(launch(1, iters, None)?.0);
        let (ms, h) = launch(2, iters, profile_dir)?;
        two.push(ms);
        hidden.push(h);
    }
    let (m1, m2, h) = (median(&mut one), median(&mut two), median(&mut hidden));
    let w = w6();
    let mut r1 = row(
        "DDP",
        "W6 train step, 1 rank x 1 thread, batch 256",
        m1,
        w.unit,
        w.amount,
    );
    r1.mode = "1x1".into();
    let what = format!(
        "W6 train step, 2 ranks x 1 thread, global batch 256: {:.2}x the 1-rank throughput, {:.0}% of all-reduce time under backward",
        m1 / m2,
        h * 100.0
    );
    let mut r2 = row("DDP", "", m2, w.unit, w.amount);
    r2.what = what;
    r2.mode = "2x1".into();
    Ok(vec![r1, r2])
}
