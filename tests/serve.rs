//! `kiln serve` on loopback (127.0.0.1, ephemeral ports): the protocol end
//! to end, bad requests, a malformed-request fuzz, batching, the bounded
//! queue, timeouts, graceful shutdown and SIGTERM.

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

#[test]
fn protocol_repository_versions_and_metrics() {
    let dir = tmp_dir("proto");
    write_cnn(&dir, 1, 1);
    write_cnn(&dir, 2, 2);
    std::fs::write(
        dir.join("cnn/config.toml"),
        "kind = \"cnn\"\n[dynamic_batching]\nmax_batch_size = 16\nmax_queue_delay_us = 500\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("broken/1")).unwrap();
    std::fs::write(dir.join("broken/config.toml"), "kind = \"cnn\"\n").unwrap();
    std::fs::write(
        dir.join("broken/1/model.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    let log = Arc::new(Mutex::new(vec![]));
    let server = Server::start(
        Repository::open(&dir).unwrap(),
        opts(RequestLog::Memory(log.clone())),
    )
    .unwrap();
    let mut c = Client::new(server.addr());
    assert_eq!(c.get("/v2/health/live").unwrap().status, 200);
    // strict readiness: the broken model is reported, and nothing crashed
    let r = c.get("/v2/health/ready").unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("broken"), "{}", r.text());
    let r = c.get("/v2/models/broken/ready").unwrap();
    assert_eq!(r.status, 503);
    assert!(
        r.json()["error"].as_str().unwrap().contains("version 1"),
        "{}",
        r.text()
    );
    assert_eq!(c.get("/v2/models/cnn/ready").unwrap().status, 200);
    let meta = c.get("/v2/models/cnn").unwrap().json();
    assert_eq!(meta["versions"], serde_json::json!(["1", "2"]));
    assert_eq!(
        meta["inputs"][0],
        serde_json::json!({"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]})
    );
    assert_eq!(meta["outputs"][0]["shape"], serde_json::json!([-1, 10]));
    assert_eq!(c.get("/v2/models/cnn/versions/1").unwrap().status, 200);
    assert_eq!(c.get("/v2/models/cnn/versions/7").unwrap().status, 404);
    // the newest version by default; an explicit version on request
    let x: Vec<f32> = [image(1), image(2)].concat();
    let r = c.post("/v2/models/cnn/infer", body(&x).as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        (r.json()["model_version"].as_str(), r.json()["id"].as_str()),
        (Some("2"), Some("r1"))
    );
    assert_eq!(r.json()["outputs"][0]["shape"], serde_json::json!([2, 10]));
    assert_eq!(logits(&r), local(&dir, 2, &x));
    let r = c
        .post("/v2/models/cnn/versions/1/infer", body(&x).as_bytes())
        .unwrap();
    assert_eq!(
        (r.status, r.json()["model_version"].as_str()),
        (200, Some("1"))
    );
    assert_eq!(logits(&r), local(&dir, 1, &x));
    // rollback without restart, then back to the newest, then a new version appears
    let r = c
        .post(
            "/v2/repository/models/cnn/load",
            br#"{"parameters": {"version": "1"}}"#,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.post("/v2/models/cnn/infer", body(&x).as_bytes()).unwrap();
    assert_eq!(r.json()["model_version"].as_str(), Some("1"));
    write_cnn(&dir, 3, 3);
    assert_eq!(
        c.post("/v2/repository/models/cnn/load", b"")
            .unwrap()
            .status,
        200
    );
    let r = c.post("/v2/models/cnn/infer", body(&x).as_bytes()).unwrap();
    assert_eq!(r.json()["model_version"].as_str(), Some("3"));
    assert_eq!(logits(&r), local(&dir, 3, &x));
    // unload: 404; the index says so; load brings it back
    assert_eq!(
        c.post("/v2/repository/models/cnn/unload", b"")
            .unwrap()
            .status,
        200
    );
    let r = c.post("/v2/models/cnn/infer", body(&x).as_bytes()).unwrap();
    assert_eq!(r.status, 404);
    let idx = c.post("/v2/repository/index", b"").unwrap().json();
    let states: Vec<(String, String)> = idx
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        states.contains(&("cnn".into(), "UNAVAILABLE".into()))
            && states.contains(&("broken".into(), "UNAVAILABLE".into())),
        "{idx}"
    );
    assert_eq!(
        c.post("/v2/repository/models/cnn/load", b"")
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        c.post("/v2/models/cnn/infer", body(&x).as_bytes())
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        c.post("/v2/repository/models/nothere/load", b"")
            .unwrap()
            .status,
        404
    );
    // metrics: statuses, latency, batch sizes, queue depth
    let m = c.get("/metrics").unwrap().text();
    for needle in [
        "kiln_requests_total{code=\"200\"}",
        "kiln_requests_total{code=\"404\"}",
        "kiln_request_duration_seconds_bucket{le=\"+Inf\"}",
        "kiln_batch_size_bucket{model=\"cnn\",le=\"2\"}",
        "kiln_queue_depth{model=\"cnn\",version=\"3\"} 0",
    ] {
        assert!(m.contains(needle), "metrics lack {needle}:\n{m}");
    }
    server.shutdown().unwrap();
    // one structured log line per request (the /metrics call included)
    let lines = log.lock().unwrap();
    assert!(lines.len() >= 20, "{} log lines", lines.len());
    let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        (
            first["method"].as_str(),
            first["path"].as_str(),
            first["status"].as_u64()
        ),
        (Some("GET"), Some("/v2/health/live"), Some(200))
    );
    std::fs::remove_dir_all(&dir).ok();
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

/// (body, expected status, text the error must contain)
fn bad_requests() -> Vec<(String, u16, &'static str)> {
    let good = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&body(&image(0))).unwrap();
        f(&mut v);
        v.to_string()
    };
    vec![
        ("{\"inputs\": [".into(), 400, "malformed JSON"),
        ("[1,2]".into(), 400, "JSON object"),
        ("{}".into(), 400, "`inputs`"),
        (
            good(&|v| v["inputs"][0]["name"] = "pixels".into()),
            400,
            "unexpected input `pixels`",
        ),
        (
            good(&|v| v["inputs"] = serde_json::json!([])),
            400,
            "missing input `input`",
        ),
        (
            good(&|v| {
                let t = v["inputs"][0].clone();
                v["inputs"].as_array_mut().unwrap().push(t);
            }),
            400,
            "input `input` is given twice",
        ),
        (
            good(&|v| v["inputs"][0]["datatype"] = "INT64".into()),
            400,
            "input `input`: datatype INT64",
        ),
        (
            good(&|v| v["inputs"][0]["shape"] = serde_json::json!([1, 8, 8])),
            400,
            "input `input`: shape [1, 8, 8]",
        ),
        (
            good(&|v| v["inputs"][0]["shape"] = serde_json::json!([2, 1, 8, 8])),
            400,
            "holds 128 values but `data` has 64",
        ),
        (
            good(&|v| v["inputs"][0]["shape"] = serde_json::json!([65, 1, 8, 8])),
            400,
            "batch size 65",
        ),
        (
            good(&|v| v["inputs"][0]["data"][3] = "NaN".into()),
            400,
            "element 3 is NaN",
        ),
        (
            good(&|v| v["inputs"][0]["data"][5] = serde_json::json!(1e39)),
            400,
            "element 5 is inf",
        ),
        (
            good(&|v| v["inputs"][0]["data"][0] = serde_json::json!(true)),
            400,
            "input `input`: element 0 is true",
        ),
        (
            good(&|v| v["inputs"][0]["extra"] = 1.into()),
            400,
            "input `input`: unknown field `extra`",
        ),
        (
            good(&|v| v["outputs"] = serde_json::json!([{"name": "probs"}])),
            400,
            "unknown output `probs`",
        ),
        (
            good(&|v| v["bogus"] = 1.into()),
            400,
            "unknown request field `bogus`",
        ),
    ]
}

#[test]
fn every_bad_request_gets_a_4xx_naming_the_problem() {
    let server = cnn_server(BatchConfig::default());
    let mut c = Client::new(server.addr());
    for (b, status, needle) in bad_requests() {
        let r = c.post("/v2/models/cnn/infer", b.as_bytes()).unwrap();
        assert_eq!(r.status, status, "{b} -> {}", r.text());
        let msg = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(needle), "{b}: error {msg:?} lacks {needle:?}");
    }
    let r = c
        .post("/v2/models/nope/infer", body(&image(0)).as_bytes())
        .unwrap();
    assert_eq!(
        (
            r.status,
            r.json()["error"]
                .as_str()
                .unwrap()
                .contains("unknown model `nope`")
        ),
        (404, true)
    );
    let r = c
        .post(
            "/v2/models/cnn/versions/9/infer",
            body(&image(0)).as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    let big = vec![b' '; 70 << 10];
    let r = c.post("/v2/models/cnn/infer", &big).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(c.get("/v2/nowhere").unwrap().status, 404);
    // still serving
    let r = c
        .post("/v2/models/cnn/infer", body(&image(0)).as_bytes())
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    server.shutdown().unwrap();
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn malformed_request_fuzz_leaves_the_server_serving() {
    let server = cnn_server(BatchConfig::default());
    let addr = server.addr();
    let valid = body(&image(3));
    let mut rng = Lcg(2026);
    let mut c = Client::new(addr);
    let (mut answered, mut closed) = (0, 0);
    let tokens = [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"inputs\"",
        "\"name\"",
        "\"input\"",
        "\"shape\"",
        "\"data\"",
        "\"datatype\"",
        "\"FP32\"",
        "1",
        "-1",
        "1e400",
        "null",
        "true",
        "\"NaN\"",
        "0.5",
        "[1,1,8,8]",
    ];
    for i in 0..1200 {
        let kind = i % 6;
        let status = if kind == 5 {
            // raw HTTP garbage on a fresh connection
            let mut bytes: Vec<u8> = match rng.below(4) {
                0 => b"POST /v2/models/cnn/infer HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n{"
                    .to_vec(),
                1 => b"GARBAGE\r\n\r\n".to_vec(),
                2 => b"POST /v2/models/cnn/infer HTTP/1.1\r\nContent-Length: abc\r\n\r\n".to_vec(),
                _ => (0..rng.below(200)).map(|_| rng.next() as u8).collect(),
            };
            bytes.truncate(4096);
            match send_raw(addr, &bytes, Duration::from_secs(10)).unwrap() {
                Some(s) => s,
                None => {
                    closed += 1;
                    continue;
                }
            }
        } else {
            let b: Vec<u8> = match kind {
                0 => {
                    let mut b = valid.clone().into_bytes();
                    b.truncate(rng.below(valid.len()));
                    b
                }
                1 => {
                    let mut b = valid.clone().into_bytes();
                    for _ in 0..1 + rng.below(4) {
                        let p = rng.below(b.len());
                        b[p] = rng.next() as u8;
                    }
                    b
                }
                2 => (0..rng.below(40))
                    .map(|_| tokens[rng.below(tokens.len())])
                    .collect::<Vec<_>>()
                    .join("")
                    .into_bytes(),
                3 => {
                    let n = rng.below(130);
                    let shape = [rng.below(3), 1, 8, 8 + rng.below(2)];
                    serde_json::json!({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": vec![0.5; n]}]}).to_string().into_bytes()
                }
                _ => (0..rng.below(300)).map(|_| rng.next() as u8).collect(),
            };
            c.post("/v2/models/cnn/infer", &b).unwrap().status
        };
        answered += 1;
        // a mutated body can still be a valid request; nothing may be a 5xx
        assert!(
            status == 200 || (400..500).contains(&status),
            "request {i} (kind {kind}) got {status}"
        );
    }
    assert!(answered + closed >= 1000);
    let r = c.post("/v2/models/cnn/infer", valid.as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(logits(&r).len(), 10);
    let m = server.repository().metrics();
    assert_eq!(m.requests_with(500) + m.requests_with(503), 0);
    eprintln!("fuzz: {answered} answered, {closed} closed by the server, then served correctly");
    server.shutdown().unwrap();
}

/// A model that sleeps, echoes `2x` and records its batch sizes.
struct Slow {
    delay: Duration,
    batches: Mutex<Vec<usize>>,
    specs: (Vec<TensorSpec>, Vec<TensorSpec>),
    panic_on_negative: bool,
}

impl Slow {
    fn new(delay_ms: u64) -> Arc<Slow> {
        Arc::new(Slow {
            delay: Duration::from_millis(delay_ms),
            batches: Mutex::new(vec![]),
            specs: (
                vec![TensorSpec::batched("x", DType::F32, &[2])],
                vec![TensorSpec::batched("y", DType::F32, &[2])],
            ),
            panic_on_negative: true,
        })
    }
}

impl ServableModel for Slow {
    fn inputs(&self) -> &[TensorSpec] {
        &self.specs.0
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.specs.1
    }
    fn forward(&self, xs: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
        self.batches.lock().unwrap().push(xs[0].dims()[0]);
        std::thread::sleep(self.delay);
        let v = xs[0].to_vec::<f32>()?;
        if self.panic_on_negative && v.iter().any(|x| *x < 0.0) {
            panic!("negative input");
        }
        Ok(vec![Tensor::from_vec(
            v.iter().map(|x| x * 2.0).collect(),
            xs[0].dims(),
        )?])
    }
}

fn slow_server(model: Arc<Slow>, batching: BatchConfig, timeout_ms: u64) -> Server {
    let repo = Repository::in_memory();
    let cfg = ModelConfig {
        batching,
        request_timeout: Duration::from_millis(timeout_ms),
        ..ModelConfig::default()
    };
    repo.insert("slow", 1, model, cfg).unwrap();
    Server::start(repo, opts(RequestLog::Off)).unwrap()
}

fn xbody(a: f32) -> String {
    format!("{{\"inputs\":[{{\"name\":\"x\",\"shape\":[1,2],\"datatype\":\"FP32\",\"data\":[{a},{}]}}]}}", a + 0.5)
}

#[test]
fn batching_merges_requests_splits_answers_and_the_queue_is_bounded() {
    let model = Slow::new(200);
    let cfg = BatchConfig {
        enabled: true,
        max_batch_size: 4,
        max_queue_delay: Duration::from_millis(100),
        queue_capacity: 2,
        instance_count: 1,
    };
    let server = slow_server(model.clone(), cfg, 10_000);
    let addr = server.addr();
    let results: Vec<(f32, u16, Vec<f32>, Option<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..24)
            .map(|i| {
                s.spawn(move || {
                    let a = i as f32;
                    let r = Client::new(addr)
                        .post("/v2/models/slow/infer", xbody(a).as_bytes())
                        .unwrap();
                    let data = r.json()["outputs"][0]["data"]
                        .as_array()
                        .map(|d| d.iter().map(|v| v.as_f64().unwrap() as f32).collect())
                        .unwrap_or_default();
                    (a, r.status, data, r.header("retry-after").map(String::from))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: Vec<_> = results.iter().filter(|r| r.1 == 200).collect();
    let full: Vec<_> = results.iter().filter(|r| r.1 == 503).collect();
    assert_eq!(ok.len() + full.len(), 24, "{results:?}");
    assert!(
        !full.is_empty() && full.iter().all(|r| r.3.as_deref() == Some("1")),
        "a full queue answers 503 + Retry-After at once: {results:?}"
    );
    for (a, _, data, _) in &ok {
        assert_eq!(
            data,
            &vec![2.0 * a, 2.0 * a + 1.0],
            "request {a} got another request's rows"
        );
    }
    let batches = model.batches.lock().unwrap().clone();
    assert!(
        batches.iter().any(|&b| b > 1) && batches.iter().all(|&b| b <= 4),
        "batches {batches:?}"
    );
    assert_eq!(batches.iter().sum::<usize>(), ok.len());
    // a panicking forward: 500 for its request, the server stays up
    let mut c = Client::new(addr);
    let r = c
        .post("/v2/models/slow/infer", xbody(-3.0).as_bytes())
        .unwrap();
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("panicked"), "{}", r.text());
    assert_eq!(
        c.post("/v2/models/slow/infer", xbody(1.0).as_bytes())
            .unwrap()
            .status,
        200
    );
    server.shutdown().unwrap();
}

#[test]
fn slow_requests_time_out_with_504() {
    let server = slow_server(Slow::new(400), BatchConfig::off(), 100);
    let r = Client::new(server.addr())
        .post("/v2/models/slow/infer", xbody(1.0).as_bytes())
        .unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(r.text().contains("100 ms"), "{}", r.text());
    server.shutdown().unwrap();
}

#[test]
fn graceful_shutdown_finishes_in_flight_and_refuses_new() {
    let server = slow_server(Slow::new(400), BatchConfig::off(), 10_000);
    let addr = server.addr();
    let inflight = std::thread::spawn(move || {
        Client::new(addr)
            .post("/v2/models/slow/infer", xbody(4.0).as_bytes())
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    server.shutdown().unwrap();
    let r = inflight.join().unwrap();
    assert_eq!(
        r.status,
        200,
        "the in-flight request finished: {}",
        r.text()
    );
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "shutdown waited for it"
    );
    assert!(
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "new connections are refused"
    );
}

#[test]
fn kiln_serve_stops_on_sigterm() {
    let dir = tmp_dir("sigterm");
    write_cnn(&dir, 1, 1);
    std::fs::write(dir.join("cnn/config.toml"), "kind = \"cnn\"\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--model-repo",
            dir.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    for _ in 0..20 {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut err, &mut line).unwrap() == 0 {
            break;
        }
        if let Some(a) = line.trim().strip_prefix("kiln serve: listening on http://") {
            addr = Some(a.parse::<std::net::SocketAddr>().unwrap());
            break;
        }
    }
    let addr = addr.expect("kiln serve printed its address");
    let mut c = Client::new(addr);
    assert_eq!(c.get("/v2/health/ready").unwrap().status, 200);
    assert_eq!(
        c.post("/v2/models/cnn/infer", body(&image(0)).as_bytes())
            .unwrap()
            .status,
        200
    );
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "kiln serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_exported_kiln_model_is_served() {
    use kiln::export::{self, DynamicDim};
    let dir = tmp_dir("kilnfile");
    kiln::manual_seed(5);
    let m = ModelKind::Cnn.build().unwrap();
    m.eval();
    let example = Tensor::zeros(&[4, 1, 8, 8], DType::F32);
    let v = dir.join("cnn/1");
    std::fs::create_dir_all(&v).unwrap();
    export::export(&m, &[example], &[DynamicDim::new(0, 0, "batch")])
        .unwrap()
        .save(v.join("model.kiln"))
        .unwrap();
    let server = Server::start(Repository::open(&dir).unwrap(), opts(RequestLog::Off)).unwrap();
    let mut c = Client::new(server.addr());
    let meta = c.get("/v2/models/cnn").unwrap().json();
    assert_eq!(meta["inputs"][0]["shape"], serde_json::json!([-1, 1, 8, 8]));
    let x: Vec<f32> = [image(3), image(4), image(5)].concat();
    let r = c.post("/v2/models/cnn/infer", body(&x).as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let expect = {
        let _ng = kiln::autograd::no_grad();
        let t = Tensor::from_vec(x.clone(), &[3, 1, 8, 8]).unwrap();
        kiln::nn::Module::forward(&m, &t)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_eq!(logits(&r), expect);
}
