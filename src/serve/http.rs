//! The HTTP front: axum routes for the Open Inference Protocol, the
//! repository extension, `/metrics`, one log line per request, and a
//! graceful shutdown (in-flight requests finish; new ones are refused).

use super::batcher::{Job, Rejected};
use super::protocol;
use super::repository::{LookupError, Repository};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

/// Where the per-request log lines go.
#[derive(Clone, Default)]
pub enum RequestLog {
    /// One JSON line per request on stderr.
    #[default]
    Stderr,
    /// Kept in memory (tests read them).
    Memory(Arc<Mutex<Vec<String>>>),
    Off,
}

/// How the server listens.
#[derive(Clone)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    /// Largest request body; larger ones get 413 before they are parsed.
    pub body_limit: usize,
    pub log: RequestLog,
    /// The async runtime's threads (inference runs on the models' own threads).
    pub io_threads: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            body_limit: 8 << 20,
            log: RequestLog::Stderr,
            io_threads: 2,
        }
    }
}

struct App {
    repo: Repository,
    draining: AtomicBool,
    log: RequestLog,
    next_id: AtomicU64,
}

/// An HTTP error: the status and a message, sent as `{"error": message}`.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.0, &json!({ "error": self.1 }))
    }
}

impl From<LookupError> for ApiError {
    fn from(e: LookupError) -> Self {
        ApiError(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            e.message,
        )
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn router(app: Arc<App>, body_limit: usize) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{model}", get(model_metadata))
        .route(
            "/v2/models/{model}/versions/{version}",
            get(version_metadata),
        )
        .route("/v2/models/{model}/ready", get(model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(version_ready),
        )
        .route("/v2/models/{model}/infer", post(infer))
        .route(
            "/v2/models/{model}/versions/{version}/infer",
            post(version_infer),
        )
        .route("/v2/repository/index", post(repo_index))
        .route("/v2/repository/models/{model}/load", post(repo_load))
        .route("/v2/repository/models/{model}/unload", post(repo_unload))
        .route("/metrics", get(metrics))
        .fallback(|req: Request| async move {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("no route {} {}", req.method(), req.uri().path()),
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(app.clone(), log_and_count))
        .with_state(app)
}

/// Counts every response by status, times it, and writes one log line.
async fn log_and_count(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let resp = next.run(req).await;
    let latency = start.elapsed();
    let status = resp.status().as_u16();
    app.repo.metrics().request(status, latency);
    let line = || {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        json!({"ts_ms": ts as u64, "id": id, "method": method, "path": path, "status": status, "latency_us": latency.as_micros() as u64}).to_string()
    };
    match &app.log {
        RequestLog::Stderr => eprintln!("{}", line()),
        RequestLog::Memory(v) => v.lock().unwrap_or_else(|e| e.into_inner()).push(line()),
        RequestLog::Off => {}
    }
    resp
}

async fn server_metadata() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"name": "kiln", "version": env!("CARGO_PKG_VERSION"), "extensions": ["model_repository"]}),
    )
}

async fn live() -> Response {
    json_response(StatusCode::OK, &json!({"live": true}))
}

async fn ready(State(app): State<Arc<App>>) -> Response {
    if app.draining.load(Ordering::SeqCst) {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"ready": false, "error": "shutting down"}),
        );
    }
    let why = app.repo.not_ready();
    if why.is_empty() {
        json_response(StatusCode::OK, &json!({"ready": true}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"ready": false, "error": why.join("; ")}),
        )
    }
}

fn metadata_of(app: &App, model: &str, version: Option<&str>) -> Result<Response, ApiError> {
    let loaded = app.repo.resolve(model, version)?;
    let versions: Vec<u64> = app
        .repo
        .index()
        .iter()
        .filter(|r| r.name == model && r.state == "READY")
        .filter_map(|r| r.version)
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &protocol::metadata(model, &versions, loaded.model.as_ref()),
    ))
}

async fn model_metadata(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
) -> Result<Response, ApiError> {
    metadata_of(&app, &model, None)
}

async fn version_metadata(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    metadata_of(&app, &model, Some(&version))
}

fn ready_of(app: &App, model: &str, version: Option<&str>) -> Response {
    match app.repo.resolve(model, version) {
        Ok(l) => json_response(
            StatusCode::OK,
            &json!({"name": model, "version": l.version.to_string(), "ready": true}),
        ),
        Err(e) if e.status == 503 => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"name": model, "ready": false, "error": e.message}),
        ),
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn model_ready(State(app): State<Arc<App>>, Path(model): Path<String>) -> Response {
    ready_of(&app, &model, None)
}

async fn version_ready(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
) -> Response {
    ready_of(&app, &model, Some(&version))
}

async fn infer(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    run_infer(app, model, None, body).await
}

async fn version_infer(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    run_infer(app, model, Some(version), body).await
}

async fn run_infer(
    app: Arc<App>,
    model: String,
    version: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body =
        body.map_err(|e| ApiError(e.status(), format!("request body: {}", e.body_text())))?;
    let loaded = app.repo.resolve(&model, version.as_deref())?;
    let cfg = &loaded.config;
    let req = protocol::parse_infer(
        &body,
        loaded.model.as_ref(),
        &model,
        cfg.batching.max_batch_size,
        cfg.allow_non_finite || loaded.model.allows_non_finite(),
    )
    .map_err(|m| ApiError(StatusCode::BAD_REQUEST, m))?;
    let (tx, rx) = oneshot::channel();
    let job = Job {
        inputs: req.inputs,
        rows: req.rows,
        deadline: Instant::now() + cfg.request_timeout,
        reply: tx,
    };
    match loaded.batcher.submit(job) {
        Ok(()) => {}
        Err(Rejected::QueueFull) => {
            let msg = format!(
                "model `{model}`: the queue is full ({} waiting); retry later",
                loaded.batcher.config.queue_capacity
            );
            let mut r = ApiError(StatusCode::SERVICE_UNAVAILABLE, msg).into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return Ok(r);
        }
        Err(Rejected::Closed) => {
            return Err(ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("model `{model}` is unloading"),
            ))
        }
    }
    let outputs = match tokio::time::timeout(cfg.request_timeout, rx).await {
        Err(_) => {
            return Err(ApiError(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "model `{model}`: no answer within the {} ms request timeout",
                    cfg.request_timeout.as_millis()
                ),
            ))
        }
        Ok(Err(_)) => {
            return Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("model `{model}`: the inference thread dropped the request"),
            ))
        }
        Ok(Ok(Err(e))) if e.contains("timed out") => {
            return Err(ApiError(
                StatusCode::GATEWAY_TIMEOUT,
                format!("model `{model}`: {e}"),
            ))
        }
        Ok(Ok(Err(e))) => {
            return Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("model `{model}` failed: {e}"),
            ))
        }
        Ok(Ok(Ok(o))) => o,
    };
    let specs = loaded.model.outputs();
    let picked: Vec<(&super::model::TensorSpec, &[usize], &[f32])> = req
        .outputs
        .iter()
        .map(|&i| (&specs[i], outputs[i].0.as_slice(), outputs[i].1.as_slice()))
        .collect();
    let text = protocol::infer_response(&model, loaded.version, req.id.as_deref(), &picked);
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response())
}

async fn repo_index(State(app): State<Arc<App>>) -> Response {
    let rows: Vec<Value> = app
        .repo
        .index()
        .into_iter()
        .map(|r| {
            let mut v = json!({"name": r.name, "state": r.state, "reason": r.reason});
            if let Some(ver) = r.version {
                v["version"] = json!(ver.to_string());
            }
            v
        })
        .collect();
    json_response(StatusCode::OK, &Value::Array(rows))
}

async fn repo_load(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body =
        body.map_err(|e| ApiError(e.status(), format!("request body: {}", e.body_text())))?;
    let pin = if body.iter().all(|b| b.is_ascii_whitespace()) {
        None
    } else {
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))?;
        match v.pointer("/parameters/version") {
            None => None,
            Some(Value::String(s)) => Some(s.parse::<u64>().map_err(|_| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("parameters.version `{s}` is not a number"),
                )
            })?),
            Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("parameters.version {n} is not a version number"),
                )
            })?),
            Some(other) => {
                return Err(ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("parameters.version {other} is not a version number"),
                ))
            }
        }
    };
    let app2 = app.clone();
    let m = model.clone();
    // Loading reads files and builds models: not on the async threads.
    tokio::task::spawn_blocking(move || app2.repo.load(&m, pin))
        .await
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("loading `{model}`: {e}"),
            )
        })??;
    Ok(json_response(
        StatusCode::OK,
        &json!({"name": model, "loaded": true}),
    ))
}

async fn repo_unload(
    State(app): State<Arc<App>>,
    Path(model): Path<String>,
) -> Result<Response, ApiError> {
    app.repo.unload(&model)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"name": model, "unloaded": true}),
    ))
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut depths = vec![];
    for row in app.repo.index() {
        if let Some(v) = row.version {
            if let Ok(l) = app.repo.resolve(&row.name, Some(&v.to_string())) {
                depths.push((row.name.clone(), v, l.batcher.depth()));
            }
        }
    }
    let text = app.repo.metrics().render(&depths);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}

/// A running server (its own threads); [`Server::shutdown`] stops it gracefully.
pub struct Server {
    addr: SocketAddr,
    app: Arc<App>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Binds `opts.addr` (port 0: an ephemeral port) and serves `repo` on
    /// background threads.
    pub fn start(repo: Repository, opts: ServeOptions) -> crate::Result<Server> {
        let listener = std::net::TcpListener::bind(opts.addr)
            .map_err(|e| kiln_ir::Error::op("serve", format!("binding {}: {e}", opts.addr)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| kiln_ir::Error::op("serve", e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| kiln_ir::Error::op("serve", e.to_string()))?;
        let app = Arc::new(App {
            repo,
            draining: AtomicBool::new(false),
            log: opts.log.clone(),
            next_id: AtomicU64::new(0),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let routes = router(app.clone(), opts.body_limit);
        let app2 = app.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.io_threads.max(1))
            .thread_name("kiln-serve-io")
            .enable_all()
            .build()
            .map_err(|e| kiln_ir::Error::op("serve", format!("starting the async runtime: {e}")))?;
        let thread = std::thread::Builder::new()
            .name("kiln-serve".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    axum::serve(listener, routes)
                        .with_graceful_shutdown(async move {
                            let _ = stopped.await;
                            app2.draining.store(true, Ordering::SeqCst);
                        })
                        .await
                })
            })
            .map_err(|e| kiln_ir::Error::op("serve", e.to_string()))?;
        Ok(Server {
            addr,
            app,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn repository(&self) -> &Repository {
        &self.app.repo
    }

    /// Stops accepting, lets in-flight requests finish, then returns.
    pub fn shutdown(mut self) -> crate::Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> crate::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => Err(kiln_ir::Error::op("serve", format!("server: {e}"))),
            Some(Err(_)) => Err(kiln_ir::Error::op("serve", "the server thread panicked")),
            _ => Ok(()),
        }
    }

    /// Serves until SIGTERM or Ctrl-C, then shuts down gracefully (`kiln serve`).
    pub fn run_until_signal(mut self) -> crate::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| kiln_ir::Error::op("serve", e.to_string()))?;
        rt.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(2);
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .map_err(|e| {
                            kiln_ir::Error::op("serve", format!("SIGTERM handler: {e}"))
                        })?;
                let t = tx.clone();
                tokio::spawn(async move {
                    term.recv().await;
                    let _ = t.send(()).await;
                });
            }
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                let _ = tx.send(()).await;
            });
            rx.recv().await;
            Ok::<(), kiln_ir::Error>(())
        })?;
        eprintln!("kiln serve: shutting down (finishing in-flight requests)");
        self.stop_and_join()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}
