//! The protocol end to end: health, metadata, infer, versions, rollback,
//! unload, metrics, and an exported `.kiln` model.

use super::*;

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
