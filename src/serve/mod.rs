//! `kiln serve`: an inference server speaking the Open Inference Protocol
//! (KServe v2) over HTTP/JSON, with a versioned model repository and
//! Triton-style dynamic batching.
//!
//! ```no_run
//! use kiln::serve::{Repository, Server, ServeOptions};
//! let repo = Repository::open(std::path::Path::new("models"))?;
//! let server = Server::start(repo, ServeOptions::default())?;   // 127.0.0.1:8000
//! server.run_until_signal()?;                                    // SIGTERM: graceful stop
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! - `model.rs`: [`ServableModel`] (names, dtypes, shapes with a dynamic
//!   batch dim, forward on a batch) and the digits models;
//! - `repository.rs`: `DIR/<model>/<version>/` folders, load/unload, the
//!   default (newest) version, failed loads kept with their reason;
//! - `config.rs`: `DIR/<model>/config.toml` (kind, batching knobs);
//! - `batcher.rs`: the bounded queue and the inference threads;
//! - `protocol.rs`: request checks and response bodies;
//! - `http.rs`: axum routes, logging, metrics, graceful shutdown;
//! - `client.rs`: a tiny blocking HTTP client for tests and the load test.

mod batcher;
pub mod client;
mod config;
mod http;
mod metrics;
mod model;
mod protocol;
mod repository;

pub use config::{BatchConfig, ModelConfig};
pub use http::{RequestLog, ServeOptions, Server};
pub use metrics::Metrics;
pub use model::{DigitsModel, ExportedServable, ServableModel, TensorSpec};
pub use protocol::datatype_name;
pub use repository::{IndexRow, LookupError, Repository};

use std::net::SocketAddr;
use std::path::Path;

/// `kiln serve --model-repo DIR --addr ADDR`: loads the repository, serves
/// until SIGTERM/Ctrl-C, then stops gracefully.
pub fn cli(dir: &Path, addr: SocketAddr) -> crate::Result<()> {
    let repo = Repository::open(dir)?;
    for row in repo.index() {
        let v = row
            .version
            .map_or(String::new(), |v| format!(" version {v}"));
        let why = if row.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", row.reason)
        };
        eprintln!("kiln serve: model {}{v} {}{why}", row.name, row.state);
    }
    let server = Server::start(
        repo,
        ServeOptions {
            addr,
            ..ServeOptions::default()
        },
    )?;
    eprintln!("kiln serve: listening on http://{}", server.addr());
    server.run_until_signal()
}
