//! The `real` fixtures (tests/fixtures/real, made by gen_real.py with
//! PyTorch, torchvision and transformers): a whole architecture's state_dict,
//! inputs, eval and train outputs, loss, every parameter gradient and the
//! state after one SGD(lr 0.05, momentum 0.9) step, checked through a kiln
//! port loaded under the same key names.

use kiln::nn::{Module, ModuleExt};
use kiln::optim::{Optimizer, SgdConfig, SGD};
use kiln::{DType, Tensor};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

/// Every tensor of `tests/fixtures/real/NAME.safetensors` by key.
pub fn load(name: &str) -> BTreeMap<String, Tensor> {
    load_from("real", name)
}

/// Every tensor of `tests/fixtures/SUBDIR/NAME.safetensors` by key.
pub fn load_from(subdir: &str, name: &str) -> BTreeMap<String, Tensor> {
    let dir = std::env::var_os("KILN_FIXTURES")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"));
    let path = dir.join(subdir).join(format!("{name}.safetensors"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    st.tensors()
        .into_iter()
        .map(|(k, v)| {
            let dt = match v.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::I64 => DType::I64,
                d => panic!("{k}: unexpected dtype {d:?}"),
            };
            (k, Tensor::from_bytes(dt, v.shape(), v.data()))
        })
        .collect()
}

/// The tensors under `prefix/` with the prefix taken off.
pub fn group(t: &BTreeMap<String, Tensor>, prefix: &str) -> Vec<(String, Tensor)> {
    t.iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(&format!("{prefix}/"))
                .map(|k| (k.to_string(), v.clone()))
        })
        .collect()
}

/// Passed and total checks, and what failed.
#[derive(Default)]
pub struct Tally {
    pub pass: usize,
    pub total: usize,
    pub failed: Vec<String>,
}

impl Tally {
    fn check(&mut self, what: &str, got: Option<&Tensor>, want: &Tensor, rtol: f64, atol: f64) {
        self.total += 1;
        let r = match got {
            None => Err("missing".to_string()),
            Some(g) => compare(g, want, rtol, atol),
        };
        match r {
            Ok(()) => self.pass += 1,
            Err(e) => self.failed.push(format!("{what}: {e}")),
        }
    }
    fn fail(&mut self, what: &str, e: impl std::fmt::Display) {
        self.total += 1;
        self.failed.push(format!("{what}: {e}"));
    }
}

/// `|a - b| <= atol + rtol |b|` elementwise, shapes equal.
pub fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dims() != want.dims() {
        return Err(format!(
            "shape {:?}, expected {:?}",
            got.dims(),
            want.dims()
        ));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let bad: Vec<(usize, f64, f64)> = g
        .iter()
        .zip(&w)
        .enumerate()
        .filter(|(_, (a, b))| {
            // NaN is never close
            let close = (*a - *b).abs() <= atol + rtol * b.abs();
            !close
        })
        .map(|(i, (a, b))| (i, *a, *b))
        .collect();
    match bad.first() {
        None => Ok(()),
        Some((i, a, b)) => Err(format!(
            "{} of {} elements differ; first at {i}: {a} vs {b}",
            bad.len(),
            g.len()
        )),
    }
}

/// The protocol of gen_real.py on `model`: load `state/*` strictly; eval
/// output under no_grad; train output, loss (`loss(out)`), every gradient;
/// one SGD(lr 0.05, momentum 0.9) step and the whole state_dict after it.
/// With `compiled`, every forward goes through `kiln::compile` (the train
/// output must carry the compiled backward). Prints `real NAME MODE: P/T`.
pub fn run_protocol<M: Module>(
    name: &str,
    t: &BTreeMap<String, Tensor>,
    model: &M,
    input: &Tensor,
    loss: impl Fn(&Tensor) -> kiln::Result<Tensor>,
    compiled: bool,
) -> Tally {
    run_protocol_many(name, t, model, std::slice::from_ref(input), loss, compiled)
}

/// [`run_protocol`] for a model of several inputs (`Module::forward_many`;
/// the first output is the one compared and given to `loss`).
pub fn run_protocol_many<M: Module>(
    name: &str,
    t: &BTreeMap<String, Tensor>,
    model: &M,
    inputs: &[Tensor],
    loss: impl Fn(&Tensor) -> kiln::Result<Tensor>,
    compiled: bool,
) -> Tally {
    let mut tally = Tally::default();
    if let Err(e) = model.load_state_dict(&group(t, "state"), true) {
        tally.fail("load_state_dict", e);
        return tally;
    }
    let fast = compiled.then(|| kiln::compile::compile(model));
    let forward = |xs: &[Tensor]| -> Result<Tensor, String> {
        let ys = match &fast {
            Some(f) => f.call(xs),
            None => model.forward_many(&xs.iter().map(Some).collect::<Vec<_>>()),
        }
        .map_err(|e| e.to_string())?;
        let y = ys.into_iter().next().ok_or("no output")?;
        if let Some(f) = &fast {
            if let Some(b) = f
                .explain()
                .entries
                .iter()
                .find_map(|e| e.graph_break.clone())
            {
                return Err(format!("graph break: {b}"));
            }
            if kiln::autograd::is_grad_enabled()
                && y.grad_fn().map(|n| n.name().to_string()).as_deref() != Some("CompiledBackward")
            {
                return Err("the compiled train output has no CompiledBackward".into());
            }
        }
        Ok(y)
    };
    let (rtol, atol, grad_rtol) = (1e-4, 1e-5, 1e-3);
    model.eval();
    {
        let _g = kiln::autograd::no_grad();
        match forward(inputs) {
            Ok(y) => tally.check("eval/out", Some(&y), &t["eval/out"], rtol, atol),
            Err(e) => tally.fail("eval/out", e),
        }
    }
    model.train();
    let cfg = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let mut opt = match SGD::with_params(model.parameters(), cfg) {
        Ok(o) => o,
        Err(e) => {
            tally.fail("SGD", e);
            return tally;
        }
    };
    let out = match forward(inputs) {
        Ok(y) => y,
        Err(e) => {
            tally.fail("train/out", e);
            return tally;
        }
    };
    tally.check("train/out", Some(&out), &t["train/out"], rtol, atol);
    let l = match loss(&out) {
        Ok(l) => l,
        Err(e) => {
            tally.fail("train/loss", e);
            return tally;
        }
    };
    tally.check("train/loss", Some(&l), &t["train/loss"], rtol, atol);
    opt.zero_grad();
    if let Err(e) = l.backward() {
        tally.fail("backward", e);
        return tally;
    }
    let params: BTreeMap<String, Tensor> = model.named_parameters().into_iter().collect();
    for (k, want) in group(t, "grad") {
        let got = params.get(&k).and_then(|p| p.grad());
        tally.check(&format!("grad/{k}"), got.as_ref(), &want, grad_rtol, atol);
    }
    if let Err(e) = opt.step() {
        tally.fail("SGD step", e);
        return tally;
    }
    let state: BTreeMap<String, Tensor> = model.state_dict().into_iter().collect();
    for (k, want) in group(t, "step1") {
        tally.check(&format!("step1/{k}"), state.get(&k), &want, rtol, atol);
    }
    let mode = if compiled { "compiled" } else { "eager" };
    let mut err = std::io::stderr();
    let _ = writeln!(err, "real {name} {mode}: {}/{}", tally.pass, tally.total);
    for f in &tally.failed {
        let _ = writeln!(err, "  real {name} {mode}: {f}");
    }
    tally
}

/// `torch.randint(0, high, (n,), generator=torch.Generator().manual_seed(seed))`
/// on the CPU, for the targets gen_real.py draws but does not store: CPU
/// generators are MT19937 seeded with the low 32 bits of the seed, and for
/// a range below 2^32 each element is one 32-bit output modulo the range,
/// drawn in row-major order.
#[allow(dead_code)] // only the fixtures whose targets are drawn this way use it
pub fn torch_randint_cpu(seed: u64, high: u32, n: usize) -> Vec<i64> {
    const N: usize = 624;
    let mut mt = [0u32; N];
    mt[0] = seed as u32;
    for i in 1..N {
        mt[i] = 1812433253u32
            .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
            .wrapping_add(i as u32);
    }
    let mut idx = N;
    let mut next = move || {
        if idx == N {
            for i in 0..N {
                let y = (mt[i] & 0x8000_0000) | (mt[(i + 1) % N] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                mt[i] = mt[(i + 397) % N] ^ (y >> 1) ^ mag;
            }
            idx = 0;
        }
        let mut y = mt[idx];
        idx += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    };
    (0..n).map(|_| (next() % high) as i64).collect()
}
