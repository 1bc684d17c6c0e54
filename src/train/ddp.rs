//! `kiln train --ddp` (under `mpirun -n N`) and `kiln train --nproc N`:
//! data-parallel training of the digits models on MPI ranks.
//!
//! The run is the one-process run of `train.rs` with its global batch
//! (`--batch-size`) cut into `world` equal per-rank batches:
//! * the data split and the model initialisation use `--seed` on every rank
//!   (and [`DistributedDataParallel::new`] broadcasts rank 0's weights
//!   anyway); BatchNorm layers become [`SyncBatchNorm`] so the statistics
//!   are those of the global batch; dropout then draws from
//!   `manual_seed_for_rank(seed)`;
//! * each epoch's order is a [`DistributedSampler`] permutation seeded by
//!   `seed + epoch`, so global batch `k` is the same set of samples whatever
//!   the world size (one process run with `--ddp` sees them too);
//! * gradients are averaged by DDP's bucketed all-reduce during backward;
//!   loss and accuracy are summed over the ranks before they are printed;
//! * rank 0 alone prints, shows the bar, profiles and writes checkpoints
//!   ([`Checkpoint::save_distributed`]); every rank's generator goes into the
//!   checkpoint, so a resumed run with the same world size continues bit for bit.

use super::{
    bar, correct, evaluate_with, load_splits, resumed_split_seed, sgd_config, write_profile,
    EpochStats, Outcome, TrainConfig, LR_GAMMA,
};
use crate::checkpoint::Checkpoint;
use crate::data::{Dataset, TensorDataset};
use crate::distributed::{
    self as dist, convert_sync_batchnorm, Backend, DdpOptions, DistributedDataParallel,
    DistributedSampler, ReduceOp,
};
use crate::nn::{Module, ModuleExt};
use crate::optim::lr_scheduler::{ExponentialLR, LRScheduler};
use crate::optim::{Optimizer, SGD};
use crate::profiler::{self, Profiler};
use crate::{functional as F, ClassLossOpts, Error, Result, Tensor};
use std::io::IsTerminal;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `mpirun` with the flags a single machine needs: `--oversubscribe` (more
/// ranks than cores is fine), run-as-root allowed (containers), and
/// `KILN_MPIRUN_ARGS` appended (e.g. `--mca btl self,tcp`).
pub fn mpirun(nproc: usize) -> Command {
    let mut c = Command::new(std::env::var("KILN_MPIRUN").unwrap_or_else(|_| "mpirun".into()));
    c.arg("--oversubscribe").arg("-n").arg(nproc.to_string());
    // OpenMPI refuses root unless told (both variables are needed).
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    // Containers often forbid the cross-memory-attach single copy.
    if std::env::var_os("OMPI_MCA_btl_vader_single_copy_mechanism").is_none() {
        c.env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    }
    if let Ok(extra) = std::env::var("KILN_MPIRUN_ARGS") {
        c.args(extra.split_whitespace());
    }
    c
}

/// `kiln train --nproc N ...`: runs `mpirun -n N <this kiln> train --ddp ...`
/// with the same flags and returns its exit status.
pub fn launch(nproc: usize) -> Result<()> {
    if nproc == 0 {
        return Err(Error::op("train", "--nproc must be at least 1"));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::op("train", format!("cannot find the kiln executable: {e}")))?;
    let mut args: Vec<String> = vec![];
    let mut it = std::env::args().skip(1).peekable();
    while let Some(a) = it.next() {
        if a == "--nproc" {
            it.next();
        } else if !a.starts_with("--nproc=") && a != "--ddp" {
            args.push(a);
        }
    }
    let pos = args.iter().position(|a| a == "train").map_or(0, |p| p + 1);
    args.insert(pos, "--ddp".into());
    let status = mpirun(nproc).arg(&exe).args(&args).status().map_err(|e| {
        Error::op(
            "train",
            format!("--nproc {nproc}: cannot start mpirun ({e}); install OpenMPI (openmpi-bin)"),
        )
    })?;
    if !status.success() {
        return Err(Error::op(
            "train",
            format!("--nproc {nproc}: the ranks failed ({status})"),
        ));
    }
    Ok(())
}

fn sum_over_ranks(v: &[f64]) -> Result<Vec<f64>> {
    let t = Tensor::from_vec(v.to_vec(), &[v.len()])?;
    dist::all_reduce(&t, ReduceOp::Sum)?;
    t.to_vec::<f64>()
}

/// Trains as `cfg` says on the ranks of the default group (made here with
/// MPI when none exists). Every rank returns the same [`Outcome`].
pub fn run(cfg: &TrainConfig) -> Result<Outcome> {
    let start = Instant::now();
    if !dist::is_initialized() {
        dist::init_process_group(Backend::Mpi)?;
    }
    let (rank, world) = (dist::rank(), dist::world_size());
    if cfg.batch_size == 0 || cfg.epochs == 0 || cfg.batch_size % world != 0 {
        return Err(Error::op(
            "train",
            format!(
                "--ddp: --epochs must be positive and --batch-size (the global batch, {}) a positive multiple of the {world} ranks",
                cfg.batch_size
            ),
        ));
    }
    let per_rank = cfg.batch_size / world;
    let resume = match &cfg.resume {
        Some(p) => Some((p.clone(), Checkpoint::load(p)?)),
        None => None,
    };
    let mut split_seed = cfg.seed;
    if let Some((p, ck)) = &resume {
        split_seed = resumed_split_seed(cfg, p, ck)?;
    }
    let data = cfg.data.clone().unwrap_or_else(super::default_data_path);
    let splits = load_splits(&data, split_seed, cfg.limit)?;
    let (xtr, ytr) = splits.train.clone();
    let (xte, yte) = splits.test.clone();
    let n_train = ytr.numel();

    crate::manual_seed(cfg.seed);
    let model = cfg.model.build()?;
    convert_sync_batchnorm(&model);
    let ddp = DistributedDataParallel::new(model, DdpOptions::default())?;
    let mut opt = SGD::with_params(ddp.module().parameters(), sgd_config(cfg.lr, cfg.compile))?;
    let mut sched = ExponentialLR::new(&mut opt, LR_GAMMA)?;
    let train_ds: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![xtr, ytr])?);
    let mut sampler = DistributedSampler::new(n_train).seed(cfg.seed);
    dist::manual_seed_for_rank(cfg.seed);
    let mut first_epoch = 0;
    if let Some((p, ck)) = &resume {
        ck.restore_model(p, ddp.module())?;
        ck.restore_optimizer(p, &mut opt)?;
        ck.restore_scheduler(p, &mut sched)?;
        ck.restore_rank_rng(p)?;
        first_epoch = ck.epoch;
    }
    let compiled = cfg.compile.then(|| crate::compile::compile(ddp.module()));
    let fwd = |x: &Tensor| match &compiled {
        Some(c) => ddp.forward_with(x, |x| c.forward(x)),
        None => ddp.forward(x),
    };
    let eval_fwd = |x: &Tensor| match &compiled {
        Some(c) => c.forward(x),
        None => ddp.module().forward(x),
    };
    let main = rank == 0;
    let show = main && cfg.progress && std::io::stdout().is_terminal();
    let mut step_times: Vec<Duration> = vec![];
    let mut stats = vec![];
    ddp.module().train();
    for epoch in first_epoch..cfg.epochs {
        let t0 = Instant::now();
        let lr = opt.param_groups()[0].lr();
        sampler.set_epoch(epoch);
        let mut loader = sampler
            .loader(train_ds.clone(), per_rank)?
            .num_workers(cfg.workers);
        let pb = bar(loader.len(), show, epoch + 1, cfg.epochs);
        let (mut loss_sum, mut hits, mut seen) = (0.0f64, 0usize, 0usize);
        let prof = (main && epoch == first_epoch && cfg.profile.is_some()).then(Profiler::start);
        for batch in loader.iter() {
            let batch = batch?;
            let (x, y) = (&batch[0], &batch[1]);
            let _step = profiler::record_function("train_step");
            let t_step = Instant::now();
            let logits = fwd(x)?;
            let loss = F::cross_entropy(&logits, y, None, ClassLossOpts::default())?;
            opt.zero_grad();
            loss.backward()?;
            let step = profiler::record_function("optimizer.step");
            opt.step()?;
            drop(step);
            step_times.push(t_step.elapsed());
            let n = y.numel();
            loss_sum += loss.item()? * n as f64;
            hits += correct(&logits, y)?;
            seen += n;
            pb.inc(1);
            pb.set_message(format!(
                "loss {:.4} acc {:.4} (rank 0)",
                loss_sum / seen as f64,
                hits as f64 / seen as f64
            ));
        }
        sched.step(&mut opt)?;
        let g = sum_over_ranks(&[loss_sum, hits as f64, seen as f64])?;
        let test_accuracy = {
            let _eval = profiler::record_function("evaluate");
            evaluate_with(ddp.module(), &eval_fwd, &xte, &yte)?
        };
        let prof = prof.map(Profiler::stop);
        let s = EpochStats {
            epoch: epoch + 1,
            lr,
            train_loss: g[0] / g[2].max(1.0),
            train_accuracy: g[1] / g[2].max(1.0),
            test_accuracy,
            seconds: t0.elapsed().as_secs_f64(),
        };
        let line = format!(
            "epoch {}/{}: lr {:.4} loss {:.4} acc {:.4} test acc {:.4} ({:.1}s, {world} ranks)",
            s.epoch, cfg.epochs, s.lr, s.train_loss, s.train_accuracy, s.test_accuracy, s.seconds
        );
        if show {
            pb.finish_and_clear();
            println!("{line}");
        } else if main && cfg.verbose {
            println!("{line}");
        }
        stats.push(s);
        if let (Some(prof), Some(path)) = (prof, &cfg.profile) {
            write_profile(prof, path, epoch + 1, !cfg.verbose)?;
        }
        if let Some(p) = &cfg.checkpoint {
            let mut ck = Checkpoint::capture(
                ddp.module(),
                &opt,
                Some(&sched),
                epoch + 1,
                cfg.seed,
                epoch + 1,
            );
            ck.capture_rank_rngs()?;
            ck.extra.insert("model".into(), cfg.model.name().into());
            ck.extra.insert("split_seed".into(), split_seed.to_string());
            ck.extra.insert("seed".into(), cfg.seed.to_string());
            ck.extra
                .insert("batch_size".into(), cfg.batch_size.to_string());
            ck.extra.insert("world_size".into(), world.to_string());
            ck.extra.insert(
                "normalize".into(),
                format!("mean {} std {}", splits.mean, splits.std),
            );
            ck.save_distributed(p)?;
        }
    }
    let test_accuracy = match stats.last() {
        Some(s) => s.test_accuracy,
        None => evaluate_with(ddp.module(), &eval_fwd, &xte, &yte)?,
    };
    drop(compiled);
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let mut sorted: Vec<f64> = step_times.iter().map(ms).collect();
    sorted.sort_by(|a, b| a.total_cmp(b));
    Ok(Outcome {
        model: ddp.into_inner(),
        epochs: stats,
        test_accuracy,
        resumed_at: first_epoch,
        seconds: start.elapsed().as_secs_f64(),
        train_size: n_train,
        test_size: yte.numel(),
        peak_memory_bytes: crate::memory::max_memory_allocated(),
        steps: step_times.len(),
        step_ms_mean: sorted.iter().sum::<f64>() / sorted.len().max(1) as f64,
        step_ms_median: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        first_step_ms: step_times.first().map(ms).unwrap_or(0.0),
        step_records: vec![],
        best_test_accuracy: None,
        stopped_early: false,
        warnings: vec![],
    })
}

/// `kiln train --ddp`: trains on the ranks, prints on rank 0, and shuts the
/// group down (every rank, also after an error, so mpirun sees the result).
pub fn cli(cfg: TrainConfig, json: bool) -> Result<()> {
    unsupported_with_ddp(&cfg)?;
    let r = run(&cfg);
    let main = dist::is_main_process();
    let world = dist::world_size();
    match r {
        Ok(out) => {
            if main {
                if json {
                    let mut j: serde_json::Value =
                        serde_json::from_str(&out.json(&cfg)).expect("valid json");
                    j["world_size"] = world.into();
                    println!("{j}");
                } else {
                    println!(
                        "train step (ddp, {world} ranks): mean {:.3} ms, median {:.3} ms over {} steps (first {:.1} ms)",
                        out.step_ms_mean, out.step_ms_median, out.steps, out.first_step_ms
                    );
                }
                println!("{}", super::accuracy_line(out.test_accuracy));
            }
            dist::destroy_process_group();
            Ok(())
        }
        Err(e) => {
            let e = Error::op("train", format!("rank {}: {e}", dist::rank()));
            // After a failed collective the peers may be gone: MPI_Finalize
            // would wait for them (the group skips it then).
            dist::destroy_process_group();
            Err(e)
        }
    }
}

/// The run-config options the data-parallel loop does not implement yet
/// (it trains with the default SGD recipe): refused by name rather than
/// silently ignored.
fn unsupported_with_ddp(cfg: &TrainConfig) -> Result<()> {
    let d = TrainConfig::default();
    let checks = [
        ("--optimizer", cfg.optimizer.name != d.optimizer.name),
        ("--schedule", cfg.schedule.name != d.schedule.name),
        ("--accumulate", cfg.accumulate != d.accumulate),
        ("--clip-grad-norm", cfg.clip_grad_norm.is_some()),
        ("--amp", cfg.amp.is_some()),
        ("--keep-best", cfg.keep_best),
        ("--early-stop", cfg.early_stop.is_some()),
        ("--logdir", cfg.logdir.is_some()),
    ];
    let bad: Vec<&str> = checks.iter().filter(|c| c.1).map(|c| c.0).collect();
    if !bad.is_empty() {
        kiln_ir::bail!(
            "train --ddp",
            "{} not supported with --ddp/--nproc yet (the data-parallel loop trains with the default SGD recipe)",
            bad.join(", ")
        );
    }
    Ok(())
}
