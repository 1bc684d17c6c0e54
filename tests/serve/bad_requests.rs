//! Every bad request gets a 4xx naming the problem, and a fuzz of
//! malformed requests leaves the server serving correctly.

use super::*;

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
