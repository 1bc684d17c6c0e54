//! Dynamic batching and the bounded queue, request timeouts, graceful
//! shutdown and SIGTERM.

use super::*;

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
