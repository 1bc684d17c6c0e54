//! `GET /metrics`: Prometheus text — requests by status, a latency
//! histogram, the batch-size histogram and the queue depth per model.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

const LATENCY_BUCKETS_S: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0,
];
const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

#[derive(Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len()];
        }
        for (c, b) in self.counts.iter_mut().zip(bounds) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in bounds.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {c}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Default)]
struct State {
    requests: BTreeMap<u16, u64>,
    latency: Histogram,
    batches: BTreeMap<String, Histogram>,
}

/// The server's counters (shared by handlers and inference threads).
#[derive(Default)]
pub struct Metrics {
    state: Mutex<State>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// One finished request.
    pub fn request(&self, status: u16, latency: Duration) {
        self.with(|s| {
            *s.requests.entry(status).or_default() += 1;
            s.latency.observe(&LATENCY_BUCKETS_S, latency.as_secs_f64());
        })
    }

    /// One forward of `rows` rows for `model`.
    pub fn batch(&self, model: &str, rows: usize) {
        self.with(|s| {
            s.batches
                .entry(model.to_string())
                .or_default()
                .observe(&BATCH_BUCKETS, rows as f64)
        })
    }

    /// Requests answered with `status` so far.
    pub fn requests_with(&self, status: u16) -> u64 {
        self.with(|s| s.requests.get(&status).copied().unwrap_or(0))
    }

    /// The Prometheus text exposition; `queues` holds each loaded
    /// version's queue depth `(model, version, waiting)`.
    pub fn render(&self, queues: &[(String, u64, usize)]) -> String {
        self.with(|s| {
            let mut out = String::new();
            out.push_str("# HELP kiln_requests_total HTTP requests answered, by status code.\n# TYPE kiln_requests_total counter\n");
            for (code, n) in &s.requests {
                let _ = writeln!(out, "kiln_requests_total{{code=\"{code}\"}} {n}");
            }
            out.push_str("# HELP kiln_request_duration_seconds Time from request to response.\n# TYPE kiln_request_duration_seconds histogram\n");
            s.latency.render(&mut out, "kiln_request_duration_seconds", "", &LATENCY_BUCKETS_S);
            out.push_str("# HELP kiln_batch_size Rows per model forward (dynamic batching).\n# TYPE kiln_batch_size histogram\n");
            for (m, h) in &s.batches {
                h.render(&mut out, "kiln_batch_size", &format!("model=\"{m}\""), &BATCH_BUCKETS);
            }
            out.push_str("# HELP kiln_queue_depth Requests waiting for an inference thread.\n# TYPE kiln_queue_depth gauge\n");
            for (m, v, d) in queues {
                let _ = writeln!(out, "kiln_queue_depth{{model=\"{m}\",version=\"{v}\"}} {d}");
            }
            out
        })
    }
}
