//! `kiln serve` on loopback (127.0.0.1, ephemeral ports): the protocol end
//! to end, bad requests, a malformed-request fuzz, batching, the bounded
//! queue, timeouts, graceful shutdown and SIGTERM. The shared helpers are
//! here; the cases are in `serve/`: the protocol (`protocol.rs`), bad
//! requests and the fuzz (`bad_requests.rs`), batching, timeouts and
//! shutdown (`batching_and_shutdown.rs`).

use kiln::nn::ModuleExt;
use kiln::serve::client::{send_raw, Client};
use kiln::serve::{
    BatchConfig, DigitsModel, ModelConfig, Repository, RequestLog, ServableModel, ServeOptions,
    Server, TensorSpec,
};
use kiln::train::ModelKind;
use kiln::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "serve/bad_requests.rs"]
mod bad_requests;
#[path = "serve/batching_and_shutdown.rs"]
mod batching_and_shutdown;
#[path = "serve/protocol.rs"]
mod protocol;

fn opts(log: RequestLog) -> ServeOptions {
    ServeOptions {
        addr: ([127, 0, 0, 1], 0).into(),
        body_limit: 64 << 10,
        log,
        io_threads: 2,
    }
}

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_cnn(dir: &Path, version: u64, seed: u64) {
    kiln::manual_seed(seed);
    let m = ModelKind::Cnn.build().unwrap();
    let v = dir.join("cnn").join(version.to_string());
    std::fs::create_dir_all(&v).unwrap();
    kiln::serialize::save(v.join("model.safetensors"), &m.state_dict()).unwrap();
}

fn image(seed: usize) -> Vec<f32> {
    (0..64)
        .map(|i| (((i * 7 + seed * 13) % 17) as f32 - 8.0) / 5.0)
        .collect()
}

fn body(data: &[f32]) -> String {
    serde_json::json!({"id": "r1", "inputs": [{"name": "input", "shape": [data.len() / 64, 1, 8, 8], "datatype": "FP32", "data": data}]}).to_string()
}

fn logits(r: &kiln::serve::client::HttpResponse) -> Vec<f32> {
    let j = r.json();
    j["outputs"][0]["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no outputs in {}", r.text()))
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn local(dir: &Path, version: u64, x: &[f32]) -> Vec<f32> {
    let m = DigitsModel::load(
        ModelKind::Cnn,
        &dir.join(format!("cnn/{version}/model.safetensors")),
    )
    .unwrap();
    let t = Tensor::from_vec(x.to_vec(), &[x.len() / 64, 1, 8, 8]).unwrap();
    m.forward(&[t]).unwrap()[0].to_vec::<f32>().unwrap()
}

fn cnn_server(batching: BatchConfig) -> Server {
    let repo = Repository::in_memory();
    kiln::manual_seed(5);
    repo.insert(
        "cnn",
        1,
        Arc::new(DigitsModel::fresh(ModelKind::Cnn).unwrap()),
        ModelConfig {
            batching,
            ..ModelConfig::default()
        },
    )
    .unwrap();
    Server::start(repo, opts(RequestLog::Off)).unwrap()
}
