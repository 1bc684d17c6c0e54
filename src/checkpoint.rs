//! Full training checkpoints: everything needed to resume a run exactly, in
//! one safetensors file written atomically ([`serialize::save_with_metadata`]).
//!
//! Layout of the file (format `kiln-checkpoint`, version 1):
//!
//! | key | kind | holds |
//! |---|---|---|
//! | `model/{name}` | tensor | the model's `state_dict` (parameters and buffers, PyTorch's names) |
//! | `optim/state/{i}/{name}` | tensor | the optimizer's per-parameter state (`momentum_buffer`, `exp_avg`, `step`, ...), `i` counting parameters through the groups |
//! | `rng/default` | `u8 [64]` tensor | the default generator ([`random::get_rng_state`]) |
//! | `scaler/{name}` | tensor, optional | tensor state of a mixed-precision `GradScaler` |
//! | `format`, `version` | metadata | `kiln-checkpoint`, `1` |
//! | `epoch` | metadata | epochs completed |
//! | `loader/seed`, `loader/epoch` | metadata | the `DataLoader`'s seed and next epoch |
//! | `optim/param_groups` | metadata (JSON) | the groups' hyper-parameters and `params` indices |
//! | `scheduler` | metadata (JSON), optional | the LR scheduler's `state_dict` |
//! | `scaler` | metadata (JSON), optional | the `GradScaler`'s non-tensor state |
//! | `extra/{name}` | metadata | free-form strings (the run's configuration) |
//!
//! JSON values are tagged by type (`{"f": "0.1"}`, `{"i": 3}`, `{"b": true}`,
//! `{"fs": [..]}`, `{"is": [..]}`, `{"s": ".."}`, `{"l": [..]}`); floats are
//! written as Rust's shortest round-trip strings, so `inf`/`NaN` survive and
//! every value comes back bit for bit.
//!
//! Loading checks the structure; [`Checkpoint::restore_model`] and
//! [`Checkpoint::restore_optimizer`] check every key's shape and dtype against
//! the live model and optimizer, and every error names the file and the key.

use crate::nn::ModuleExt;
use crate::optim::lr_scheduler::LRScheduler;
use crate::optim::{Dict, Optimizer, OptimizerStateDict, ParamState, Value};
use crate::random::{self, GeneratorState};
use crate::serialize::{self, Loaded};
use crate::{Error, Result, Tensor};
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;
use std::path::Path;

mod distributed;

pub const FORMAT: &str = "kiln-checkpoint";
pub const VERSION: &str = "1";

/// The optional state of a mixed-precision gradient scaler: non-tensor values
/// (`scale`, `growth_factor`, `_growth_tracker`, ...) and any tensors.
#[derive(Clone, Debug, Default)]
pub struct ScalerState {
    pub values: Dict,
    pub tensors: Vec<(String, Tensor)>,
}

/// Everything a training run needs to continue exactly where it stopped.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The model's `state_dict`.
    pub model: Vec<(String, Tensor)>,
    pub optimizer: OptimizerStateDict,
    pub scheduler: Option<Dict>,
    pub scaler: Option<ScalerState>,
    /// Epochs completed.
    pub epoch: u64,
    /// The default generator's state.
    pub rng: GeneratorState,
    pub loader_seed: u64,
    /// The epoch the data loader yields next.
    pub loader_epoch: u64,
    /// Free-form strings (stored as `extra/{key}` metadata).
    pub extra: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Captures the live state: model, optimizer, scheduler and the default
    /// generator. Set `scaler` and `extra` on the result as needed.
    pub fn capture<M: ModuleExt + ?Sized>(
        model: &M,
        opt: &dyn Optimizer,
        sched: Option<&dyn LRScheduler>,
        epoch: u64,
        loader_seed: u64,
        loader_epoch: u64,
    ) -> Checkpoint {
        Checkpoint {
            model: model.state_dict(),
            optimizer: opt.state_dict(),
            scheduler: sched.map(|s| s.state_dict()),
            scaler: None,
            epoch,
            rng: random::get_rng_state(),
            loader_seed,
            loader_epoch,
            extra: BTreeMap::new(),
        }
    }

    /// Writes the checkpoint atomically (temp file, fsync, rename).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let mut tensors: Vec<(String, Tensor)> = vec![];
        for (k, t) in &self.model {
            tensors.push((format!("model/{k}"), t.clone()));
        }
        for (i, st) in &self.optimizer.state {
            for (k, t) in st {
                tensors.push((format!("optim/state/{i}/{k}"), t.clone()));
            }
        }
        tensors.push(("rng/default".into(), self.rng.to_tensor()));
        let mut meta = BTreeMap::new();
        meta.insert("format".into(), FORMAT.into());
        meta.insert("version".into(), VERSION.into());
        meta.insert("epoch".into(), self.epoch.to_string());
        meta.insert("loader/seed".into(), self.loader_seed.to_string());
        meta.insert("loader/epoch".into(), self.loader_epoch.to_string());
        let groups: Vec<Json> = self
            .optimizer
            .param_groups
            .iter()
            .map(dict_to_json)
            .collect();
        meta.insert("optim/param_groups".into(), Json::Array(groups).to_string());
        if let Some(s) = &self.scheduler {
            meta.insert("scheduler".into(), dict_to_json(s).to_string());
        }
        if let Some(s) = &self.scaler {
            meta.insert("scaler".into(), dict_to_json(&s.values).to_string());
            for (k, t) in &s.tensors {
                tensors.push((format!("scaler/{k}"), t.clone()));
            }
        }
        for (k, v) in &self.extra {
            meta.insert(format!("extra/{k}"), v.clone());
        }
        serialize::save_with_metadata(path, &tensors, Some(&meta))
    }

    /// Reads a checkpoint, checking its structure (format, metadata, RNG
    /// state, optimizer-state keys). Shapes against a live model are checked
    /// by the `restore_*` methods.
    pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let f = serialize::open(path)?;
        let err = |msg: String| io_err(path, msg);
        match f.metadata().get("format") {
            Some(v) if v == FORMAT => {}
            Some(v) => {
                return Err(err(format!(
                    "metadata key `format` is `{v}`, not `{FORMAT}`"
                )))
            }
            None => {
                return Err(err(format!(
                    "not a {FORMAT} file: missing metadata key `format`"
                )))
            }
        }
        let version = f.meta("version")?;
        if version != VERSION {
            return Err(err(format!(
                "metadata key `version`: version {version} is not supported (this build reads {VERSION})"
            )));
        }
        let int = |key: &str| -> Result<u64> {
            let v = f.meta(key)?;
            v.parse()
                .map_err(|_| err(format!("metadata key `{key}`: `{v}` is not an integer")))
        };
        let (epoch, loader_seed, loader_epoch) =
            (int("epoch")?, int("loader/seed")?, int("loader/epoch")?);
        let rng = GeneratorState::from_tensor(f.get("rng/default")?)
            .map_err(|e| err(format!("key `rng/default`: {e}")))?;
        let json_meta = |key: &str| -> Result<Json> {
            serde_json::from_str(f.meta(key)?)
                .map_err(|e| err(format!("metadata key `{key}`: invalid JSON ({e})")))
        };
        let param_groups = match json_meta("optim/param_groups")? {
            Json::Array(gs) => gs
                .iter()
                .map(|g| {
                    json_to_dict(g)
                        .map_err(|m| err(format!("metadata key `optim/param_groups`: {m}")))
                })
                .collect::<Result<Vec<_>>>()?,
            _ => {
                return Err(err(
                    "metadata key `optim/param_groups`: expected a JSON list".into(),
                ))
            }
        };
        let dict = |key: &str| -> Result<Option<Dict>> {
            if !f.metadata().contains_key(key) {
                return Ok(None);
            }
            json_to_dict(&json_meta(key)?)
                .map(Some)
                .map_err(|m| err(format!("metadata key `{key}`: {m}")))
        };
        let scheduler = dict("scheduler")?;
        let scaler_values = dict("scaler")?;
        let mut model = vec![];
        let mut state: BTreeMap<usize, ParamState> = BTreeMap::new();
        let mut scaler_tensors = vec![];
        for (k, t) in f.tensors() {
            if let Some(name) = k.strip_prefix("model/") {
                model.push((name.to_string(), t.clone()));
            } else if let Some(rest) = k.strip_prefix("optim/state/") {
                let (i, name) = rest
                    .split_once('/')
                    .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n)))
                    .ok_or_else(|| {
                        err(format!(
                            "key `{k}`: expected `optim/state/{{index}}/{{name}}`"
                        ))
                    })?;
                state
                    .entry(i)
                    .or_default()
                    .insert(name.to_string(), t.clone());
            } else if let Some(name) = k.strip_prefix("scaler/") {
                scaler_tensors.push((name.to_string(), t.clone()));
            }
        }
        if model.is_empty() {
            return Err(err(
                "no `model/*` keys: the checkpoint holds no model state".into(),
            ));
        }
        // (Keys come back sorted; restore_model matches them by name.)
        let scaler = match (scaler_values, scaler_tensors.is_empty()) {
            (None, true) => None,
            (v, _) => Some(ScalerState {
                values: v.unwrap_or_default(),
                tensors: scaler_tensors,
            }),
        };
        let extra = f
            .metadata()
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("extra/")?.to_string(), v.clone())))
            .collect();
        Ok(Checkpoint {
            model,
            optimizer: OptimizerStateDict {
                state,
                param_groups,
            },
            scheduler,
            scaler,
            epoch,
            rng,
            loader_seed,
            loader_epoch,
            extra,
        })
    }

    /// Loads the model state into `model` (strict): every missing or
    /// unexpected key and every shape or dtype mismatch is reported, naming
    /// the file (`path`) and the `model/...` key.
    pub fn restore_model<M: ModuleExt + ?Sized>(
        &self,
        path: impl AsRef<Path>,
        model: &M,
    ) -> Result<()> {
        let given: BTreeMap<&str, &Tensor> =
            self.model.iter().map(|(k, t)| (k.as_str(), t)).collect();
        let own = model.state_dict();
        let mut problems = vec![];
        for (k, t) in &own {
            match given.get(k.as_str()) {
                None => problems.push(format!("missing key `model/{k}`")),
                Some(s) if s.dims() != t.dims() => problems.push(format!(
                    "key `model/{k}`: shape mismatch: the file has {:?} but the model has {:?}",
                    s.dims(),
                    t.dims()
                )),
                Some(s) if s.dtype() != t.dtype() => problems.push(format!(
                    "key `model/{k}`: dtype mismatch: the file has {} but the model has {}",
                    s.dtype(),
                    t.dtype()
                )),
                Some(_) => {}
            }
        }
        let own_keys: std::collections::BTreeSet<&str> =
            own.iter().map(|(k, _)| k.as_str()).collect();
        for k in given.keys().filter(|k| !own_keys.contains(*k)) {
            problems.push(format!(
                "unexpected key `model/{k}` (the model has no such entry)"
            ));
        }
        if !problems.is_empty() {
            return Err(io_err(path.as_ref(), problems.join("; ")));
        }
        model
            .load_state_dict(&self.model, true)
            .map_err(|e| io_err(path.as_ref(), e.to_string()))?;
        Ok(())
    }

    /// Loads the optimizer state, checking every `optim/state/{i}/{name}`
    /// tensor against parameter `i` (counting through the groups).
    pub fn restore_optimizer(&self, path: impl AsRef<Path>, opt: &mut dyn Optimizer) -> Result<()> {
        let path = path.as_ref();
        let params: Vec<Tensor> = opt
            .param_groups()
            .iter()
            .flat_map(|g| g.params.iter().cloned())
            .collect();
        let mut problems = vec![];
        for (i, st) in &self.optimizer.state {
            let Some(p) = params.get(*i) else {
                problems.push(format!(
                    "key `optim/state/{i}/...`: parameter {i} does not exist (the optimizer has {})",
                    params.len()
                ));
                continue;
            };
            for (k, t) in st {
                if k == "step" {
                    continue;
                }
                if t.dims() != p.dims() {
                    problems.push(format!(
                        "key `optim/state/{i}/{k}`: shape mismatch: the file has {:?} but parameter {i} has {:?}",
                        t.dims(),
                        p.dims()
                    ));
                } else if t.dtype() != p.dtype() {
                    problems.push(format!(
                        "key `optim/state/{i}/{k}`: dtype mismatch: the file has {} but parameter {i} has {}",
                        t.dtype(),
                        p.dtype()
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(io_err(path, problems.join("; ")));
        }
        opt.load_state_dict(&self.optimizer)
            .map_err(|e| io_err(path, format!("optimizer state: {e}")))
    }

    /// Loads the scheduler state (an error if the file has none).
    pub fn restore_scheduler(
        &self,
        path: impl AsRef<Path>,
        sched: &mut dyn LRScheduler,
    ) -> Result<()> {
        let path = path.as_ref();
        let Some(sd) = &self.scheduler else {
            return Err(io_err(
                path,
                "missing metadata key `scheduler`: the checkpoint has no scheduler state".into(),
            ));
        };
        sched
            .load_state_dict(sd)
            .map_err(|e| io_err(path, format!("metadata key `scheduler`: {e}")))
    }

    /// Restores the default generator.
    pub fn restore_rng(&self) {
        random::set_rng_state(&self.rng);
    }
}

/// Opens a checkpoint file as plain named tensors (for inspection).
pub fn open_raw(path: impl AsRef<Path>) -> Result<Loaded> {
    serialize::open(path)
}

fn io_err(path: &Path, msg: String) -> Error {
    Error::Io {
        path: path.display().to_string(),
        msg,
    }
}

fn float_str(v: f64) -> Json {
    Json::String(format!("{v:?}"))
}

fn parse_float(j: &Json) -> Option<f64> {
    j.as_str()?.parse().ok()
}

/// A [`Value`] as tagged JSON (see the module docs).
pub fn value_to_json(v: &Value) -> Json {
    match v {
        Value::Bool(b) => json!({ "b": b }),
        Value::Int(i) => json!({ "i": i }),
        Value::Float(f) => json!({ "f": float_str(*f) }),
        Value::Floats(fs) => json!({ "fs": fs.iter().map(|f| float_str(*f)).collect::<Vec<_>>() }),
        Value::Ints(is) => json!({ "is": is }),
        Value::Str(s) => json!({ "s": s }),
        Value::List(ds) => json!({ "l": ds.iter().map(dict_to_json).collect::<Vec<_>>() }),
    }
}

/// Inverse of [`value_to_json`].
pub fn json_to_value(j: &Json) -> std::result::Result<Value, String> {
    let bad = || format!("cannot read value {j}");
    let obj = j.as_object().filter(|o| o.len() == 1).ok_or_else(bad)?;
    let (tag, x) = obj.iter().next().expect("one entry");
    Ok(match tag.as_str() {
        "b" => Value::Bool(x.as_bool().ok_or_else(bad)?),
        "i" => Value::Int(x.as_i64().ok_or_else(bad)?),
        "f" => Value::Float(parse_float(x).ok_or_else(bad)?),
        "fs" => Value::Floats(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|f| parse_float(f).ok_or_else(bad))
                .collect::<std::result::Result<_, _>>()?,
        ),
        "is" => Value::Ints(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|i| i.as_i64().ok_or_else(bad))
                .collect::<std::result::Result<_, _>>()?,
        ),
        "s" => Value::Str(x.as_str().ok_or_else(bad)?.to_string()),
        "l" => Value::List(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(json_to_dict)
                .collect::<std::result::Result<_, _>>()?,
        ),
        _ => return Err(bad()),
    })
}

/// A [`Dict`] as a JSON object of tagged values.
pub fn dict_to_json(d: &Dict) -> Json {
    Json::Object(
        d.iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect::<Map<_, _>>(),
    )
}

/// Inverse of [`dict_to_json`].
pub fn json_to_dict(j: &Json) -> std::result::Result<Dict, String> {
    let obj = j
        .as_object()
        .ok_or_else(|| format!("expected a JSON object, got {j}"))?;
    obj.iter()
        .map(|(k, v)| {
            Ok((
                k.clone(),
                json_to_value(v).map_err(|e| format!("entry `{k}`: {e}"))?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_bit_for_bit() {
        let mut d = Dict::new();
        d.insert("lr".into(), Value::Float(0.1 + 0.2));
        d.insert("best".into(), Value::Float(f64::INFINITY));
        d.insert(
            "betas".into(),
            Value::Floats(vec![0.9, 0.999, f64::MIN_POSITIVE]),
        );
        d.insert("params".into(), Value::Ints(vec![0, 1, 2]));
        d.insert("nesterov".into(), Value::Bool(true));
        d.insert("mode".into(), Value::Str("min".into()));
        d.insert("n".into(), Value::Int(-3));
        let mut inner = Dict::new();
        inner.insert("x".into(), Value::Float(1e-300));
        d.insert("subs".into(), Value::List(vec![inner]));
        let text = dict_to_json(&d).to_string();
        let back = json_to_dict(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back, d);
        let nan = json_to_value(&value_to_json(&Value::Float(f64::NAN))).unwrap();
        assert!(nan.as_f64().unwrap().is_nan());
    }
}
