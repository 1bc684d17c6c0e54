//! `kiln bench --serve`: a bounded load test of `kiln serve` on loopback —
//! the digits CNN and a zoo model (the tiny ViT of `kiln::models::catalog`,
//! exported with a dynamic batch and served as a `.kiln` model is) behind
//! the HTTP server, 1, 8 and 64 concurrent clients (keep-alive connections,
//! one request at a time each), dynamic batching off and on. Reports
//! throughput and p50/p99 latency.

use crate::serve::client::Client;
use crate::serve::{
    BatchConfig, DigitsModel, ExportedServable, ModelConfig, Repository, RequestLog, ServableModel,
    ServeOptions, Server,
};
use crate::train::ModelKind;
use crate::Result;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One load-test configuration's result.
#[derive(Debug, Clone)]
pub struct ServeRow {
    pub model: String,
    pub batching: bool,
    pub clients: usize,
    pub requests: usize,
    pub errors: usize,
    pub seconds: f64,
    pub throughput: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl ServeRow {
    pub fn json(&self) -> String {
        serde_json::json!({
            "workload": format!("SERVE-{}", self.model.to_uppercase()),
            "mode": if self.batching { "batching" } else { "no-batching" },
            "clients": self.clients, "requests": self.requests, "errors": self.errors,
            "seconds": self.seconds, "throughput_rps": self.throughput,
            "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
        })
        .to_string()
    }
}

/// How much load: requests per configuration and a time cap on each.
#[derive(Debug, Clone, Copy)]
pub struct ServeLoad {
    pub requests: usize,
    pub time_cap: Duration,
}

/// The models load-tested: the digits CNN and a zoo model.
const MODELS: [&str; 2] = ["cnn", "vit_tiny"];

/// A fresh instance of one of [`MODELS`].
fn servable(name: &str) -> Result<Arc<dyn ServableModel>> {
    crate::manual_seed(0);
    if name == "cnn" {
        return Ok(Arc::new(DigitsModel::fresh(ModelKind::Cnn)?));
    }
    use crate::nn::ModuleExt;
    let zoo = crate::models::catalog::build(name)?;
    let model = zoo.model.as_ref();
    model.eval();
    let mut names = model.named_parameters();
    names.extend(model.named_buffers());
    let forward = |xs: &[crate::Tensor]| -> Result<Vec<crate::Tensor>> {
        Ok(vec![crate::nn::Module::forward(model, &xs[0])?])
    };
    let dynamic = [crate::export::DynamicDim::new(0, 0, "batch")];
    let e = crate::export::export_fn("forward", forward, &names, &(zoo.example)(2), &dynamic)?;
    Ok(Arc::new(ExportedServable::new(e)))
}

/// Runs every configuration (per model: batching off, then on; 1, 8, 64 clients).
pub fn serve_rows(load: ServeLoad) -> Result<Vec<ServeRow>> {
    let mut rows = vec![];
    for model in MODELS {
        for batching in [false, true] {
            let repo = Repository::in_memory();
            let config = ModelConfig {
                batching: if batching {
                    BatchConfig {
                        max_batch_size: 64,
                        max_queue_delay: Duration::from_micros(2000),
                        queue_capacity: 1024,
                        ..BatchConfig::default()
                    }
                } else {
                    BatchConfig {
                        queue_capacity: 1024,
                        ..BatchConfig::off()
                    }
                },
                ..ModelConfig::default()
            };
            repo.insert(model, 1, servable(model)?, config)?;
            let server = Server::start(
                repo,
                ServeOptions {
                    addr: ([127, 0, 0, 1], 0).into(),
                    log: RequestLog::Off,
                    ..ServeOptions::default()
                },
            )?;
            for clients in [1, 8, 64] {
                rows.push(run_load(&server, model, batching, clients, load)?);
            }
            server.shutdown()?;
        }
    }
    Ok(rows)
}

/// One request body for `model` (the `seed`-th of a client).
fn body(model: &str, seed: usize) -> String {
    if model == "cnn" {
        return cnn_body(seed);
    }
    // vit_tiny: one 3x32x32 image
    let data: Vec<String> = (0..3 * 32 * 32)
        .map(|i| format!("{:.3}", (((i * 7 + seed * 13) % 17) as f32 - 8.0) / 5.0))
        .collect();
    format!("{{\"inputs\":[{{\"name\":\"input\",\"shape\":[1,3,32,32],\"datatype\":\"FP32\",\"data\":[{}]}}]}}", data.join(","))
}

/// One digit image (64 standardised pixels) as an infer body.
pub fn cnn_body(seed: usize) -> String {
    let data: Vec<String> = (0..64)
        .map(|i| format!("{:.3}", (((i * 7 + seed * 13) % 17) as f32 - 8.0) / 5.0))
        .collect();
    format!("{{\"inputs\":[{{\"name\":\"input\",\"shape\":[1,1,8,8],\"datatype\":\"FP32\",\"data\":[{}]}}]}}", data.join(","))
}

fn run_load(
    server: &Server,
    model: &str,
    batching: bool,
    clients: usize,
    load: ServeLoad,
) -> Result<ServeRow> {
    let addr = server.addr();
    let path = format!("/v2/models/{model}/infer");
    // warm-up: kernels compiled, connections made
    let mut c = Client::new(addr);
    for i in 0..5 {
        let _ = c.post(&path, body(model, i).as_bytes());
    }
    let issued = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let lat = Arc::new(Mutex::new(Vec::with_capacity(load.requests)));
    let start = Instant::now();
    let deadline = start + load.time_cap;
    std::thread::scope(|s| {
        for t in 0..clients {
            let (issued, errors, lat, path) =
                (issued.clone(), errors.clone(), lat.clone(), path.clone());
            s.spawn(move || {
                let mut c = Client::new(addr);
                let mut mine = vec![];
                let body = body(model, t);
                while issued.fetch_add(1, Ordering::SeqCst) < load.requests
                    && Instant::now() < deadline
                {
                    let s = Instant::now();
                    match c.post(&path, body.as_bytes()) {
                        Ok(r) if r.status == 200 => mine.push(s.elapsed().as_secs_f64() * 1e3),
                        _ => {
                            errors.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                lat.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut l = Arc::try_unwrap(lat)
        .map(|m| m.into_inner().unwrap_or_default())
        .unwrap_or_default();
    l.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let pct = |p: f64| {
        if l.is_empty() {
            f64::NAN
        } else {
            l[((l.len() - 1) as f64 * p).round() as usize]
        }
    };
    Ok(ServeRow {
        model: model.into(),
        batching,
        clients,
        requests: l.len(),
        errors: errors.load(Ordering::SeqCst),
        seconds,
        throughput: l.len() as f64 / seconds,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    })
}

/// The table, and the two targets checked against the measurements.
pub fn serve_report(rows: &[ServeRow]) -> String {
    let mut s = format!(
        "{:<10} {:<12} {:>7} {:>9} {:>7} {:>11} {:>9} {:>9}\n",
        "model", "batching", "clients", "requests", "errors", "req/s", "p50 ms", "p99 ms"
    );
    for r in rows {
        s += &format!(
            "{:<10} {:<12} {:>7} {:>9} {:>7} {:>11.1} {:>9.3} {:>9.3}\n",
            r.model,
            if r.batching { "on" } else { "off" },
            r.clients,
            r.requests,
            r.errors,
            r.throughput,
            r.p50_ms,
            r.p99_ms
        );
    }
    for model in MODELS {
        let find = |b: bool, c: usize| {
            rows.iter()
                .find(|r| r.model == model && r.batching == b && r.clients == c)
        };
        if let (Some(off64), Some(on64), Some(single)) =
            (find(false, 64), find(true, 64), find(false, 1))
        {
            s += &format!(
                "{model}: batching at 64 clients: {:.2}x the throughput without (target >= 3x); p99 {:.2} ms = {:.2}x the single-request latency {:.3} ms (target < 4x)\n",
                on64.throughput / off64.throughput,
                on64.p99_ms,
                on64.p99_ms / single.p50_ms,
                single.p50_ms
            );
        }
    }
    s
}
