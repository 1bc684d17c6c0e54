//! `DIR/<model>/config.toml`: what a model is and how it batches.
//!
//! ```toml
//! kind = "cnn"                 # cnn | mlp: the digits model a version's model.safetensors holds
//! version = 2                  # optional: serve this version by default (else the newest)
//! allow_non_finite = false     # reject NaN/Inf inputs (default)
//! request_timeout_ms = 10000   # a request not answered by then gets 504
//!
//! [dynamic_batching]           # as Triton's dynamic_batching
//! enabled = true               # false: one request per forward
//! max_batch_size = 64          # rows merged into one forward (and the most one request may send)
//! max_queue_delay_us = 2000    # how long the first request waits for company
//! queue_capacity = 256         # requests waiting; beyond it: 503 at once
//! instance_count = 1           # inference threads
//! ```
//!
//! Only this subset of TOML is read (`key = value` lines, one section,
//! `#` comments, integers, booleans and quoted strings); anything else is
//! an error naming the line.

use kiln_ir::{bail, Result};
use std::time::Duration;

/// A model's serving configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub kind: Option<String>,
    pub version: Option<u64>,
    pub allow_non_finite: bool,
    pub request_timeout: Duration,
    pub batching: BatchConfig,
}

/// Triton-style dynamic batching knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchConfig {
    /// Merge queued requests into one forward (false: one request per forward).
    pub enabled: bool,
    /// The most rows of one forward, and of one request.
    pub max_batch_size: usize,
    pub max_queue_delay: Duration,
    pub queue_capacity: usize,
    pub instance_count: usize,
}

impl BatchConfig {
    /// One request per forward, no waiting.
    pub fn off() -> BatchConfig {
        BatchConfig {
            enabled: false,
            max_queue_delay: Duration::ZERO,
            ..BatchConfig::default()
        }
    }
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            enabled: true,
            max_batch_size: 64,
            max_queue_delay: Duration::from_micros(2000),
            queue_capacity: 256,
            instance_count: 1,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            kind: None,
            version: None,
            allow_non_finite: false,
            request_timeout: Duration::from_secs(10),
            batching: BatchConfig::default(),
        }
    }
}

impl ModelConfig {
    /// Parses the TOML subset described in the module docs.
    ///
    /// ```
    /// let c = kiln::serve::ModelConfig::parse("kind = \"cnn\"\n[dynamic_batching]\nmax_batch_size = 8\n", "config.toml").unwrap();
    /// assert_eq!((c.kind.as_deref(), c.batching.max_batch_size), (Some("cnn"), 8));
    /// ```
    pub fn parse(text: &str, origin: &str) -> Result<ModelConfig> {
        let mut c = ModelConfig::default();
        let mut section = String::new();
        for (no, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            let at = || format!("{origin}:{}", no + 1);
            if line.is_empty() {
                continue;
            }
            if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                section = s.trim().to_string();
                if section != "dynamic_batching" {
                    bail!(
                        "serve config",
                        "{}: unknown section [{section}] (only [dynamic_batching])",
                        at()
                    );
                }
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                bail!(
                    "serve config",
                    "{}: expected `key = value`, got `{line}`",
                    at()
                );
            };
            let (key, value) = (key.trim(), value.trim());
            let int = || -> Result<u64> {
                value.parse::<u64>().map_err(|_| {
                    kiln_ir::Error::op(
                        "serve config",
                        format!(
                            "{}: `{key}` must be a non-negative integer, got `{value}`",
                            at()
                        ),
                    )
                })
            };
            match (section.as_str(), key) {
                ("", "kind") => match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                    Some(v) => c.kind = Some(v.to_string()),
                    None => bail!(
                        "serve config",
                        "{}: `kind` must be a quoted string, got `{value}`",
                        at()
                    ),
                },
                ("", "version") => c.version = Some(int()?),
                ("", "allow_non_finite") => {
                    c.allow_non_finite = match value {
                        "true" => true,
                        "false" => false,
                        _ => bail!(
                            "serve config",
                            "{}: `allow_non_finite` must be true or false, got `{value}`",
                            at()
                        ),
                    }
                }
                ("", "request_timeout_ms") => {
                    c.request_timeout = Duration::from_millis(int()?.max(1))
                }
                ("dynamic_batching", "enabled") => {
                    c.batching.enabled = match value {
                        "true" => true,
                        "false" => false,
                        _ => bail!(
                            "serve config",
                            "{}: `enabled` must be true or false, got `{value}`",
                            at()
                        ),
                    }
                }
                ("dynamic_batching", "max_batch_size") => {
                    c.batching.max_batch_size = int()?.max(1) as usize
                }
                ("dynamic_batching", "max_queue_delay_us") => {
                    c.batching.max_queue_delay = Duration::from_micros(int()?)
                }
                ("dynamic_batching", "queue_capacity") => {
                    c.batching.queue_capacity = int()?.max(1) as usize
                }
                ("dynamic_batching", "instance_count") => {
                    c.batching.instance_count = int()?.clamp(1, 64) as usize
                }
                _ => bail!(
                    "serve config",
                    "{}: unknown key `{key}`{}",
                    at(),
                    if section.is_empty() {
                        String::new()
                    } else {
                        format!(" in [{section}]")
                    }
                ),
            }
        }
        Ok(c)
    }
}
