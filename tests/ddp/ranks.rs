//! What each of the 2 ranks runs (see `tests/ddp.rs`): checks of the
//! collectives against hand-computed values, the sampler, SyncBatchNorm
//! against BatchNorm on the global batch, DDP against one process on the
//! global batch (eager, compiled, no_sync, unused parameters), distributed
//! checkpoints — and the `kill` case.

use kiln::distributed::{
    self as dist, Backend, DdpOptions, DistributedDataParallel, DistributedSampler, ReduceOp,
    SyncBatchNorm,
};
use kiln::nn::{Activation, BatchNorm, Entry, Linear, Module, ModuleExt, Sequential};
use kiln::optim::{Optimizer, SgdConfig, SGD};
use kiln::random::{self, Generator};
use kiln::{DType, Result, Tensor};

mod collectives;
use collectives::{collective_errors, collectives, sampler, sync_bn};

type Check = (&'static str, fn() -> std::result::Result<(), String>);

fn e(x: kiln::Error) -> String {
    x.to_string()
}

pub fn run(case: &str) {
    dist::init_process_group(Backend::Mpi).expect("init_process_group");
    let rank = dist::rank();
    match case {
        "unit" => {
            let checks: &[Check] = &[
                ("collectives", collectives),
                ("collective_errors", collective_errors),
                ("sampler_disjoint_covering", sampler),
                ("sync_batchnorm_equals_global_batchnorm", sync_bn),
                ("ddp_equals_one_process", ddp_eager),
                ("ddp_compiled_equals_eager", ddp_compiled),
                ("ddp_no_sync_accumulates", ddp_no_sync),
                ("ddp_unused_parameters", ddp_unused),
                ("checkpoint_rank0_writes", checkpoint),
            ];
            for (name, f) in checks {
                let r = f();
                match r {
                    Ok(()) => println!("check {name} rank {rank}: ok"),
                    Err(why) => println!(
                        "check {name} rank {rank}: FAILED: {}",
                        why.replace('\n', " | ")
                    ),
                }
            }
            dist::destroy_process_group();
        }
        "kill" => kill(rank),
        other => panic!("unknown case {other}"),
    }
}

fn close(what: &str, a: &[f64], b: &[f64], tol: f64) -> std::result::Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{what}: {} vs {} values", a.len(), b.len()));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if (x - y).abs() > tol * (1.0 + y.abs()) || x.is_nan() != y.is_nan() {
            return Err(format!("{what}[{i}]: {x} vs {y}"));
        }
    }
    Ok(())
}

fn f32s(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims).unwrap()
}

/// The global batch every rank builds the same way; rank r holds rows r*4..r*4+4.
fn global_batch(seed: u64, dims: &[usize]) -> Tensor {
    random::randn(dims, Some(&mut Generator::new(seed)))
}

fn rows(t: &Tensor) -> Tensor {
    let half = t.dims()[0] / 2;
    t.narrow(0, (dist::rank() * half) as i64, half).unwrap()
}

fn mlp() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(6, 16, true)?)
        .add(Activation::relu())
        .add(Linear::new(16, 16, true)?)
        .add(Activation::relu())
        .add(Linear::new(16, 3, true)?))
}

fn params(m: &dyn ModuleExtDyn) -> Vec<f64> {
    m.all_params()
}

/// Helper trait: flattened parameters of any module.
trait ModuleExtDyn {
    fn all_params(&self) -> Vec<f64>;
}
impl<M: ModuleExt> ModuleExtDyn for M {
    fn all_params(&self) -> Vec<f64> {
        self.parameters()
            .iter()
            .flat_map(|p| p.to_f64_vec())
            .collect()
    }
}

fn sgd(m: &impl ModuleExt) -> Result<SGD> {
    SGD::with_params(
        m.parameters(),
        SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..SgdConfig::default()
        },
    )
}

fn loss_of(out: &Tensor, target: &Tensor) -> Result<Tensor> {
    kiln::functional::cross_entropy(out, target, None, kiln::ClassLossOpts::default())
}

fn batch(step: u64) -> (Tensor, Tensor) {
    let x = global_batch(100 + step, &[16, 6]);
    let y = random::randint(0, 3, &[16], Some(&mut Generator::new(200 + step))).unwrap();
    (x, y)
}

/// One process on the global batch: the reference every rank computes locally.
fn reference(steps: u64, init: &[(String, Tensor)]) -> Result<Vec<f64>> {
    let m = mlp()?;
    m.load_state_dict(init, true)?;
    let mut opt = sgd(&m)?;
    for s in 0..steps {
        let (x, y) = batch(s);
        opt.zero_grad();
        loss_of(&m.forward(&x)?, &y)?.backward()?;
        opt.step()?;
    }
    Ok(params(&m))
}

fn ddp_eager() -> std::result::Result<(), String> {
    random::manual_seed(10 + dist::rank() as u64); // different inits: DDP broadcasts rank 0's
    let opts = DdpOptions {
        bucket_cap_mb: 0.0005,
        ..DdpOptions::default()
    }; // ~130 floats: several buckets
    let ddp = DistributedDataParallel::new(mlp().map_err(e)?, opts).map_err(e)?;
    let names = ddp.bucket_names();
    if names.len() < 3 || names[0][0] != "4.bias" {
        return Err(format!(
            "buckets {names:?}: expected several, the last parameter first"
        ));
    }
    let init: Vec<(String, Tensor)> = ddp
        .module()
        .state_dict()
        .into_iter()
        .map(|(k, t)| (k, t.copy().unwrap()))
        .collect();
    let first = Tensor::from_vec(params(ddp.module()), &[params(ddp.module()).len()]).map_err(e)?;
    let both = dist::all_gather(&first).map_err(e)?;
    close(
        "broadcast at construction",
        &both[1].to_f64_vec(),
        &both[0].to_f64_vec(),
        0.0,
    )?;
    let mut opt = sgd(ddp.module()).map_err(e)?;
    let (steps, _prof) = (3u64, ());
    let ((), prof) = kiln::profiler::profile(|| {
        for s in 0..steps {
            let (x, y) = batch(s);
            opt.zero_grad();
            let l = loss_of(&ddp.forward(&rows(&x)).unwrap(), &rows(&y)).unwrap();
            l.backward().unwrap();
            opt.step().unwrap();
        }
    });
    close(
        "params after 3 steps",
        &params(ddp.module()),
        &reference(steps, &init).map_err(e)?,
        1e-5,
    )?;
    // communication is on its own track, with the bytes of each all-reduce
    let comm: Vec<_> = prof
        .events()
        .iter()
        .filter(|ev| ev.category.as_str() == "comm")
        .collect();
    let main_tid = prof
        .events()
        .iter()
        .find(|ev| ev.name == "backward")
        .map(|ev| ev.tid);
    if comm.is_empty() || comm.iter().any(|ev| Some(ev.tid) == main_tid) {
        return Err("no comm events on a track of their own".into());
    }
    let total: usize = ddp
        .module()
        .parameters()
        .iter()
        .map(|p| p.numel() * 4)
        .sum();
    let reduced: u64 = comm
        .iter()
        .filter(|ev| ev.name.starts_with("all_reduce"))
        .map(|ev| ev.bytes)
        .sum();
    if reduced != (total as u64) * steps {
        return Err(format!(
            "all_reduce bytes {reduced}, expected {} per step",
            total
        ));
    }
    Ok(())
}

fn ddp_compiled() -> std::result::Result<(), String> {
    random::manual_seed(5);
    let ddp = DistributedDataParallel::new(mlp().map_err(e)?, DdpOptions::default()).map_err(e)?;
    let init: Vec<(String, Tensor)> = ddp
        .module()
        .state_dict()
        .into_iter()
        .map(|(k, t)| (k, t.copy().unwrap()))
        .collect();
    let fast = kiln::compile::compile(ddp.module());
    let mut opt = sgd(ddp.module()).map_err(e)?;
    for s in 0..3 {
        let (x, y) = batch(s);
        opt.zero_grad();
        let out = ddp
            .forward_with(&rows(&x), |x| fast.forward(x))
            .map_err(e)?;
        if s == 0
            && out.grad_fn().map(|n| n.name().to_string()).as_deref() != Some("CompiledBackward")
        {
            return Err(format!(
                "not the compiled backward: {:?}",
                out.grad_fn().map(|n| n.name().to_string())
            ));
        }
        loss_of(&out, &rows(&y)).map_err(e)?.backward().map_err(e)?;
        opt.step().map_err(e)?;
    }
    close(
        "compiled ddp vs one process",
        &params(ddp.module()),
        &reference(3, &init).map_err(e)?,
        1e-5,
    )
}

fn ddp_no_sync() -> std::result::Result<(), String> {
    random::manual_seed(6);
    let ddp = DistributedDataParallel::new(mlp().map_err(e)?, DdpOptions::default()).map_err(e)?;
    let init: Vec<(String, Tensor)> = ddp
        .module()
        .state_dict()
        .into_iter()
        .map(|(k, t)| (k, t.copy().unwrap()))
        .collect();
    // two micro-batches (halves of batch 0 and of batch 1), the first without sync
    let (x0, y0) = batch(0);
    let (x1, y1) = batch(1);
    {
        let _g = ddp.no_sync();
        loss_of(&ddp.forward(&rows(&x0)).map_err(e)?, &rows(&y0))
            .map_err(e)?
            .backward()
            .map_err(e)?;
    }
    // local gradients differ between the ranks while not synchronised
    let g = ddp.module().parameters()[0]
        .grad()
        .ok_or("no grad")?
        .copy()
        .map_err(e)?;
    let both = dist::all_gather(&g).map_err(e)?;
    if both[0].to_f64_vec() == both[1].to_f64_vec() {
        return Err("no_sync still synchronised".into());
    }
    loss_of(&ddp.forward(&rows(&x1)).map_err(e)?, &rows(&y1))
        .map_err(e)?
        .backward()
        .map_err(e)?;
    // reference: the sum of the two global-batch gradients
    let m = mlp().map_err(e)?;
    m.load_state_dict(&init, true).map_err(e)?;
    loss_of(&m.forward(&x0).map_err(e)?, &y0)
        .map_err(e)?
        .backward()
        .map_err(e)?;
    loss_of(&m.forward(&x1).map_err(e)?, &y1)
        .map_err(e)?
        .backward()
        .map_err(e)?;
    for (p, q) in ddp.module().parameters().iter().zip(m.parameters()) {
        close(
            "accumulated grad",
            &p.grad().unwrap().to_f64_vec(),
            &q.grad().unwrap().to_f64_vec(),
            1e-5,
        )?;
    }
    Ok(())
}

/// A model whose second layer is skipped by forward.
struct Skips {
    used: Linear,
    unused: Linear,
}
impl Module for Skips {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.used.forward(x)
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Child("used", &self.used));
        f(Entry::Child("unused", &self.unused));
    }
    fn describe(&self) -> String {
        "Skips".into()
    }
}

fn ddp_unused() -> std::result::Result<(), String> {
    let make = || Skips {
        used: Linear::new(6, 3, true).unwrap(),
        unused: Linear::new(6, 3, true).unwrap(),
    };
    let (x, y) = batch(0);
    let ddp = DistributedDataParallel::new(make(), DdpOptions::default()).map_err(e)?;
    let m = loss_of(&ddp.forward(&rows(&x)).map_err(e)?, &rows(&y))
        .map_err(e)?
        .backward()
        .err()
        .ok_or("a parameter without gradient was accepted")?
        .to_string();
    if !m.contains("unused.weight") || !m.contains("find_unused_parameters") {
        return Err(m);
    }
    drop(ddp);
    let opts = DdpOptions {
        find_unused_parameters: true,
        ..DdpOptions::default()
    };
    let ddp = DistributedDataParallel::new(make(), opts).map_err(e)?;
    loss_of(&ddp.forward(&rows(&x)).map_err(e)?, &rows(&y))
        .map_err(e)?
        .backward()
        .map_err(e)?;
    let g = ddp
        .module()
        .unused
        .weight
        .grad()
        .ok_or("no grad for the unused weight")?;
    if g.to_f64_vec().iter().any(|v| *v != 0.0) {
        return Err("the unused parameter's gradient is not zero".into());
    }
    let used = ddp
        .module()
        .used
        .weight
        .grad()
        .ok_or("no grad")?
        .copy()
        .map_err(e)?;
    let both = dist::all_gather(&used).map_err(e)?;
    close(
        "used grad synchronised",
        &both[0].to_f64_vec(),
        &both[1].to_f64_vec(),
        0.0,
    )
}

fn checkpoint() -> std::result::Result<(), String> {
    // the launching test names one folder for both ranks
    let dir =
        std::path::PathBuf::from(std::env::var("KILN_DDP_TMP").map_err(|_| "KILN_DDP_TMP unset")?);
    if dist::rank() == 0 {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|x| x.to_string())?;
    }
    dist::barrier().map_err(e)?;
    let path = dir.join("model.ckpt");
    let m = Linear::new(2, 2, true).map_err(e)?;
    let opt = SGD::with_params(m.parameters(), SgdConfig::default()).map_err(e)?;
    random::manual_seed(40 + dist::rank() as u64);
    let mut ck = kiln::checkpoint::Checkpoint::capture(&m, &opt, None, 1, 0, 1);
    ck.extra.insert("writer".into(), dist::rank().to_string());
    ck.capture_rank_rngs().map_err(e)?;
    let before = random::get_rng_state().to_bytes();
    let wrote = ck.save_distributed(&path).map_err(e)?;
    if wrote != (dist::rank() == 0) {
        return Err(format!("rank {} wrote: {wrote}", dist::rank()));
    }
    // every rank sees the finished file, written by rank 0 alone
    let back = kiln::checkpoint::Checkpoint::load(&path).map_err(e)?;
    if back.extra.get("writer").map(String::as_str) != Some("0") {
        return Err(format!("writer {:?}", back.extra.get("writer")));
    }
    let files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|x| x.to_string())?
        .collect();
    if files.len() != 1 {
        return Err(format!("{} files in the checkpoint folder", files.len()));
    }
    random::manual_seed(999);
    back.restore_rank_rng(&path).map_err(e)?;
    if random::get_rng_state().to_bytes() != before {
        return Err("this rank's generator was not restored".into());
    }
    dist::barrier().map_err(e)?;
    Ok(())
}

/// Rank 1 kills itself mid-epoch; rank 0 must fail with an error (the
/// timeout), print it and exit.
fn kill(rank: usize) {
    random::manual_seed(1);
    let ddp = DistributedDataParallel::new(mlp().unwrap(), DdpOptions::default()).unwrap();
    let mut opt = sgd(ddp.module()).unwrap();
    let t0 = std::time::Instant::now();
    for s in 0..1000u64 {
        if rank == 1 && s == 5 {
            let _ = std::process::Command::new("kill")
                .args(["-9", &std::process::id().to_string()])
                .status();
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
        let (x, y) = batch(s % 4);
        opt.zero_grad();
        let r = ddp
            .forward(&rows(&x))
            .and_then(|o| loss_of(&o, &rows(&y)))
            .and_then(|l| l.backward());
        if let Err(err) = r {
            println!(
                "rank {rank} failed as expected: {err} (after {:.1}s, step {s})",
                t0.elapsed().as_secs_f64()
            );
            dist::destroy_process_group();
            std::process::exit(1);
        }
        opt.step().unwrap();
    }
    println!("rank {rank} finished without noticing the dead peer");
    std::process::exit(2);
}
