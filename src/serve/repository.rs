//! The model repository: `DIR/<model>/<version>/` folders, loaded at start
//! and on `POST /v2/repository/models/{m}/load`, dropped on `unload`. The
//! newest loaded version serves by default (or the one pinned by
//! `config.toml`'s `version` or the load request's `{"parameters":
//! {"version": "N"}}`), so switching or rolling back needs no restart.
//! A version that fails to load is recorded with its error (reported by
//! `ready` and the index) and never takes the server down.

use super::batcher::Batcher;
use super::config::ModelConfig;
use super::metrics::Metrics;
use super::model::{DigitsModel, ExportedServable, ServableModel};
use crate::train::ModelKind;
use crate::DType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// A version that loaded: the model, its batcher and its configuration.
pub struct Loaded {
    pub name: String,
    pub version: u64,
    pub model: Arc<dyn ServableModel>,
    pub batcher: Batcher,
    pub config: ModelConfig,
}

enum Slot {
    Ready(Arc<Loaded>),
    Failed(String),
}

struct Entry {
    versions: BTreeMap<u64, Slot>,
    pinned: Option<u64>,
    /// Why the model as a whole could not load (a bad config.toml, no versions).
    error: Option<String>,
    unloaded: bool,
}

/// Why a lookup failed, with the HTTP status it maps to.
#[derive(Debug, Clone, PartialEq)]
pub struct LookupError {
    pub status: u16,
    pub message: String,
}

fn lookup_err(status: u16, message: String) -> LookupError {
    LookupError { status, message }
}

/// One row of `POST /v2/repository/index`.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexRow {
    pub name: String,
    pub version: Option<u64>,
    pub state: &'static str,
    pub reason: String,
}

/// All models the server knows.
pub struct Repository {
    dir: Option<PathBuf>,
    models: RwLock<BTreeMap<String, Entry>>,
    metrics: Arc<Metrics>,
}

impl Repository {
    /// An empty repository with no folder (models are [`Repository::insert`]ed).
    pub fn in_memory() -> Repository {
        Repository {
            dir: None,
            models: RwLock::new(BTreeMap::new()),
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// Opens `dir` and loads every model in it (failures are recorded, not fatal).
    pub fn open(dir: &Path) -> crate::Result<Repository> {
        if !dir.is_dir() {
            kiln_ir::bail!(
                "serve",
                "model repository {} is not a folder",
                dir.display()
            );
        }
        let repo = Repository {
            dir: Some(dir.to_path_buf()),
            ..Repository::in_memory()
        };
        for name in list_dirs(dir) {
            let _ = repo.load(&name, None);
        }
        Ok(repo)
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Adds `model` as `name` version `version` (tests, load tests, embedding).
    pub fn insert(
        &self,
        name: &str,
        version: u64,
        model: Arc<dyn ServableModel>,
        config: ModelConfig,
    ) -> crate::Result<()> {
        check_specs(model.as_ref())
            .map_err(|e| kiln_ir::Error::op("serve", format!("model `{name}`: {e}")))?;
        let loaded = self.start(name, version, model, config);
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        let entry = models.entry(name.to_string()).or_insert_with(|| Entry {
            versions: BTreeMap::new(),
            pinned: None,
            error: None,
            unloaded: false,
        });
        entry.unloaded = false;
        entry.versions.insert(version, Slot::Ready(loaded));
        Ok(())
    }

    fn start(
        &self,
        name: &str,
        version: u64,
        model: Arc<dyn ServableModel>,
        config: ModelConfig,
    ) -> Arc<Loaded> {
        let batcher = Batcher::start(name, model.clone(), config.batching, self.metrics.clone());
        Arc::new(Loaded {
            name: name.to_string(),
            version,
            model,
            batcher,
            config,
        })
    }

    /// (Re)loads `DIR/<name>/`: every numeric version folder, afresh.
    /// `pin` makes that version the default (a rollback); it must load.
    pub fn load(&self, name: &str, pin: Option<u64>) -> Result<(), LookupError> {
        let Some(dir) = &self.dir else {
            return Err(lookup_err(
                400,
                format!("model `{name}`: this server has no repository folder to load from"),
            ));
        };
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            return Err(lookup_err(400, format!("`{name}` is not a model name")));
        }
        let mdir = dir.join(name);
        if !mdir.is_dir() {
            return Err(lookup_err(
                404,
                format!("unknown model `{name}`: no folder {}", mdir.display()),
            ));
        }
        let mut entry = Entry {
            versions: BTreeMap::new(),
            pinned: pin,
            error: None,
            unloaded: false,
        };
        match read_config(&mdir) {
            Err(e) => entry.error = Some(e),
            Ok(config) => {
                entry.pinned = pin.or(config.version);
                for v in list_dirs(&mdir)
                    .iter()
                    .filter_map(|d| d.parse::<u64>().ok())
                {
                    let slot = match load_version(&mdir.join(v.to_string()), &config) {
                        Ok(model) => Slot::Ready(self.start(name, v, model, config.clone())),
                        Err(e) => Slot::Failed(e),
                    };
                    entry.versions.insert(v, slot);
                }
                if entry.versions.is_empty() {
                    entry.error = Some(format!(
                        "no version folders (DIR/{name}/<number>/) in {}",
                        mdir.display()
                    ));
                }
            }
        }
        let result = match (pin, &entry.error) {
            (_, Some(e)) => Err(lookup_err(
                400,
                format!("model `{name}` failed to load: {e}"),
            )),
            (Some(p), None) => match entry.versions.get(&p) {
                Some(Slot::Ready(_)) => Ok(()),
                Some(Slot::Failed(e)) => Err(lookup_err(
                    400,
                    format!("model `{name}` version {p} failed to load: {e}"),
                )),
                None => Err(lookup_err(
                    404,
                    format!("model `{name}` has no version {p}"),
                )),
            },
            (None, None) => Ok(()),
        };
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        if result.is_ok() || !models.contains_key(name) || pin.is_none() {
            models.insert(name.to_string(), entry);
        }
        result
    }

    /// Stops serving `name` (in-flight requests finish on their batch).
    pub fn unload(&self, name: &str) -> Result<(), LookupError> {
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        match models.get_mut(name) {
            Some(e) if !e.unloaded => {
                e.versions.clear();
                e.unloaded = true;
                Ok(())
            }
            _ => Err(lookup_err(
                404,
                format!("unknown model `{name}` (not loaded)"),
            )),
        }
    }

    /// The loaded version a request for `name` (and `version`, if given) goes to.
    pub fn resolve(&self, name: &str, version: Option<&str>) -> Result<Arc<Loaded>, LookupError> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let entry = match models.get(name) {
            Some(e) if !e.unloaded => e,
            Some(_) => return Err(lookup_err(404, format!("model `{name}` is unloaded"))),
            None => return Err(lookup_err(404, format!("unknown model `{name}`"))),
        };
        if let Some(e) = &entry.error {
            return Err(lookup_err(
                503,
                format!("model `{name}` failed to load: {e}"),
            ));
        }
        let wanted = match version {
            Some(v) => Some(v.parse::<u64>().map_err(|_| {
                lookup_err(
                    400,
                    format!("model `{name}`: version `{v}` is not a number"),
                )
            })?),
            None => entry.pinned,
        };
        let slot_ready = |v: u64| match entry.versions.get(&v) {
            Some(Slot::Ready(l)) => Ok(l.clone()),
            Some(Slot::Failed(e)) => Err(lookup_err(
                503,
                format!("model `{name}` version {v} failed to load: {e}"),
            )),
            None => Err(lookup_err(
                404,
                format!("model `{name}` has no version {v}"),
            )),
        };
        match wanted {
            Some(v) => slot_ready(v),
            None => entry
                .versions
                .iter()
                .rev()
                .find_map(|(_, s)| match s {
                    Slot::Ready(l) => Some(l.clone()),
                    Slot::Failed(_) => None,
                })
                .ok_or_else(|| {
                    let why: Vec<String> = entry
                        .versions
                        .iter()
                        .filter_map(|(v, s)| match s {
                            Slot::Failed(e) => Some(format!("version {v}: {e}")),
                            Slot::Ready(_) => None,
                        })
                        .collect();
                    lookup_err(
                        503,
                        format!("model `{name}` has no ready version ({})", why.join("; ")),
                    )
                }),
        }
    }

    /// Every model and version with its state, as the repository index reports them.
    pub fn index(&self) -> Vec<IndexRow> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let mut rows = vec![];
        let mut names: Vec<String> = models.keys().cloned().collect();
        if let Some(dir) = &self.dir {
            names.extend(
                list_dirs(dir)
                    .into_iter()
                    .filter(|n| !models.contains_key(n)),
            );
        }
        names.sort();
        for name in names {
            match models.get(&name) {
                None => rows.push(IndexRow {
                    name,
                    version: None,
                    state: "UNAVAILABLE",
                    reason: "not loaded".into(),
                }),
                Some(e) if e.unloaded => rows.push(IndexRow {
                    name,
                    version: None,
                    state: "UNAVAILABLE",
                    reason: "unloaded".into(),
                }),
                Some(e) if e.error.is_some() => rows.push(IndexRow {
                    name,
                    version: None,
                    state: "UNAVAILABLE",
                    reason: e.error.clone().unwrap_or_default(),
                }),
                Some(e) => {
                    for (v, s) in &e.versions {
                        let (state, reason) = match s {
                            Slot::Ready(_) => ("READY", String::new()),
                            Slot::Failed(why) => ("UNAVAILABLE", why.clone()),
                        };
                        rows.push(IndexRow {
                            name: name.clone(),
                            version: Some(*v),
                            state,
                            reason,
                        });
                    }
                }
            }
        }
        rows
    }

    /// Strict readiness (as Triton's default): every loaded model has a ready
    /// default version. Returns the reasons when not.
    pub fn not_ready(&self) -> Vec<String> {
        let names: Vec<String> = {
            let models = self.models.read().unwrap_or_else(|e| e.into_inner());
            models
                .iter()
                .filter(|(_, e)| !e.unloaded)
                .map(|(n, _)| n.clone())
                .collect()
        };
        names
            .iter()
            .filter_map(|n| self.resolve(n, None).err().map(|e| e.message))
            .collect()
    }
}

fn list_dirs(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn read_config(mdir: &Path) -> Result<ModelConfig, String> {
    let path = mdir.join("config.toml");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            ModelConfig::parse(&text, &path.display().to_string()).map_err(|e| e.to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelConfig::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Loads one version folder: `model.kiln` (an exported model) or
/// `model.safetensors` (a digits model of the config's `kind`).
fn load_version(vdir: &Path, config: &ModelConfig) -> Result<Arc<dyn ServableModel>, String> {
    let kiln_file = vdir.join("model.kiln");
    let st_file = vdir.join("model.safetensors");
    let model: Arc<dyn ServableModel> = if kiln_file.is_file() {
        load_exported(&kiln_file)?
    } else if st_file.is_file() {
        let kind = config.kind.as_deref().ok_or_else(|| {
            format!(
                "{}: config.toml must name the model `kind` (cnn or mlp) for a .safetensors file",
                st_file.display()
            )
        })?;
        let kind = ModelKind::parse(kind)
            .ok_or_else(|| format!("config.toml: unknown kind `{kind}` (cnn or mlp)"))?;
        Arc::new(DigitsModel::load(kind, &st_file).map_err(|e| e.to_string())?)
    } else {
        return Err(format!(
            "{}: no model.kiln or model.safetensors",
            vdir.display()
        ));
    };
    check_specs(model.as_ref())?;
    Ok(model)
}

/// The `.kiln` loader: an exported model ([`crate::export::load`]) served
/// through [`ExportedServable`].
fn load_exported(path: &Path) -> Result<Arc<dyn ServableModel>, String> {
    let model = crate::export::load(path).map_err(|e| e.to_string())?;
    Ok(Arc::new(ExportedServable::new(model)))
}

/// The server batches along dim 0 and speaks FP32: both are checked once here.
fn check_specs(model: &dyn ServableModel) -> Result<(), String> {
    for s in model.inputs().iter().chain(model.outputs()) {
        if s.dtype != DType::F32 {
            return Err(format!(
                "`{}` is {}; only FP32 tensors are served",
                s.name, s.dtype
            ));
        }
        if s.dims.first() != Some(&None) || s.dims[1..].iter().any(|d| d.is_none()) {
            return Err(format!(
                "`{}` has shape {:?}: dim 0 must be the (dynamic) batch dim and the others fixed",
                s.name,
                s.shape()
            ));
        }
    }
    Ok(())
}
