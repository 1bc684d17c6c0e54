//! Loading the PyTorch fixtures: manifest, safetensors, `input_view`
//! expressions, and NaN-aware comparison.
// each test binary uses part of the support code
#![allow(dead_code)]

pub mod backward;
pub mod layers;
pub mod layers_recurrent;
pub mod loss_more;
pub mod modules;
pub mod nn_more;
pub mod nn_more_ops;
pub mod ops;
pub mod ops_more;
pub mod optim;
pub mod optim_more;
pub mod reduce_more;
pub mod sched_more;
pub mod views_more;

use kiln::{DType, Tensor};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

/// The fixture suites with forward cases (`forward SUITE: P/T`, ...).
pub const FORWARD_SUITES: [&str; 15] = [
    "ops_unary",
    "ops_binary",
    "reduce",
    "views",
    "matmul",
    "conv",
    "pool",
    "norm",
    "loss",
    "embedding",
    "half",
    "ops_more",
    "reduce_more",
    "views_more",
    "loss_more",
];

/// The suites with gradient cases: all forward suites but `half`.
pub const BACKWARD_SUITES: [&str; 14] = [
    "ops_unary",
    "ops_binary",
    "reduce",
    "views",
    "matmul",
    "conv",
    "pool",
    "norm",
    "loss",
    "embedding",
    "ops_more",
    "reduce_more",
    "views_more",
    "loss_more",
];

/// Forward cases whose output shape (or, for roi_align's adaptive grid, the
/// number of samples per bin) depends on the input's values (`nonzero`,
/// `masked_select`, `nms`, ...): a trace stops at them with a graph
/// break naming that reason, as `torch.compile` does by default, and the
/// function runs eagerly. The compiled harnesses accept exactly that break,
/// for exactly these cases (their outputs are still checked).
pub const DATA_DEPENDENT: [&str; 9] = [
    "views_more/nonzero",
    "views_more/argwhere",
    "views_more/where_cond_only",
    "views_more/masked_select",
    "views_more/one_hot_inferred",
    "views_more/repeat_interleave_tensor",
    "nn_more/tv_nms",
    "nn_more/tv_batched_nms",
    "nn_more/tv_roi_align_legacy_adaptive",
];

/// Whether graph break `why` of case `c` is the data-dependent one it is listed for.
pub fn expected_break(c: &Case, why: &str) -> bool {
    DATA_DEPENDENT.contains(&format!("{}/{}", c.suite, c.case).as_str())
        && why.contains("depends on the input's values")
}

pub struct Fixtures {
    pub cases: Vec<Value>,
    files: HashMap<String, Vec<u8>>,
}

/// One manifest case, with the fields the harness uses.
pub struct Case {
    pub suite: String,
    pub file: String,
    pub case: String,
    pub op: String,
    pub attrs: Value,
    pub inputs: Vec<String>,
    pub roles: Vec<String>,
    pub outputs: Vec<String>,
    pub dtypes: HashMap<String, String>,
    pub input_view: HashMap<String, String>,
    pub rtol: f64,
    pub atol: f64,
    pub expect_error: bool,
    /// An error case's inputs (`error_inputs`, in order): shape and dtype.
    pub error_inputs: Vec<(Vec<usize>, String)>,
    pub views: Vec<Value>,
}

/// Where the fixtures are: `$KILN_FIXTURES` when set; else the checkout the
/// test was built in; else `./tests/fixtures` (a test binary carried to
/// another machine, e.g. by scripts/gpu-check.sh, runs from a copy of the
/// repository whose absolute path differs from the build's).
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_FIXTURES").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    if built.join("manifest.json").is_file() {
        return built;
    }
    PathBuf::from("tests/fixtures")
}

impl Fixtures {
    pub fn load() -> Fixtures {
        let manifest = dir().join("manifest.json");
        let text = std::fs::read_to_string(&manifest).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (set KILN_FIXTURES to the fixtures folder)",
                manifest.display()
            )
        });
        let m: Value = serde_json::from_str(&text).expect("manifest parses");
        let mut cases = m["cases"].as_array().expect("cases").clone();
        // the later suites each ship their own `manifest_SUITE.json`
        let mut extra: Vec<PathBuf> = std::fs::read_dir(dir())
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        extra.retain(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("manifest_") && name.ends_with(".json")
        });
        extra.sort();
        for p in extra {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let m: Value = serde_json::from_str(&text).expect("manifest parses");
            cases.extend(m["cases"].as_array().expect("cases").iter().cloned());
        }
        let mut files = HashMap::new();
        for c in &cases {
            let f = c["file"].as_str().unwrap().to_string();
            if !files.contains_key(&f) {
                let bytes = std::fs::read(dir().join(&f)).unwrap_or_else(|e| panic!("{f}: {e}"));
                files.insert(f, bytes);
            }
        }
        Fixtures { cases, files }
    }

    /// A stored tensor as a kiln tensor of the manifest's dtype (bools are stored as u8).
    pub fn tensor(&self, c: &Case, name: &str) -> Result<Tensor, String> {
        let st = safetensors::SafeTensors::deserialize(&self.files[&c.file])
            .map_err(|e| e.to_string())?;
        let v = st.tensor(name).map_err(|e| format!("{name}: {e}"))?;
        let dt = match v.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F64 => DType::F64,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::I64 => DType::I64,
            safetensors::Dtype::I32 => DType::I32,
            safetensors::Dtype::I16 => DType::I16,
            safetensors::Dtype::I8 => DType::I8,
            safetensors::Dtype::U8 => DType::U8,
            safetensors::Dtype::BOOL => DType::Bool,
            other => return Err(format!("{name}: unsupported dtype {other:?}")),
        };
        let dt = match c.dtypes.get(name).map(String::as_str) {
            Some("bool") => DType::Bool,
            _ => dt,
        };
        Ok(Tensor::from_bytes(dt, v.shape(), v.data()))
    }

    /// The case's inputs, each through its `input_view` expression when given.
    pub fn inputs(&self, c: &Case) -> Result<Vec<Tensor>, String> {
        self.inputs_on(c, kiln::Device::Cpu)
    }

    /// The inputs with their stored tensors on `device` (views are taken
    /// there, so a strided input stays strided).
    pub fn inputs_on(&self, c: &Case, device: kiln::Device) -> Result<Vec<Tensor>, String> {
        let stored = c
            .inputs
            .iter()
            .map(|n| {
                self.tensor(c, n)
                    .and_then(|t| t.to_device(device).map_err(|e| e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        (0..stored.len())
            .map(|k| match c.input_view.get(&format!("in{k}")) {
                Some(expr) => eval_view(&stored, expr),
                None => Ok(stored[k].clone()),
            })
            .collect()
    }
}

pub fn load_suite(fx: &Fixtures, suite: &str) -> Vec<Case> {
    fx.cases
        .iter()
        .filter(|c| {
            c["suite"] == suite
                && !c["outputs"]
                    .as_array()
                    .map(|o| o.is_empty())
                    .unwrap_or(true)
                || (c["suite"] == suite && c["expect_error"] == true)
        })
        .map(|c| {
            let strs = |k: &str| -> Vec<String> {
                c[k].as_array()
                    .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
                    .unwrap_or_default()
            };
            let map = |k: &str| -> HashMap<String, String> {
                c[k].as_object()
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            Case {
                suite: suite.to_string(),
                file: c["file"].as_str().unwrap().to_string(),
                case: c["case"].as_str().unwrap().to_string(),
                op: c["op"].as_str().unwrap().to_string(),
                attrs: c["attrs"].clone(),
                inputs: strs("inputs"),
                roles: if c["expect_error"] == true {
                    strs("error_roles")
                } else {
                    strs("roles")
                },
                outputs: strs("outputs"),
                dtypes: map("dtypes"),
                input_view: map("input_view"),
                rtol: c["rtol"].as_f64().unwrap_or(0.0),
                atol: c["atol"].as_f64().unwrap_or(0.0),
                expect_error: c["expect_error"] == true,
                error_inputs: error_inputs(c),
                views: c["views"].as_array().cloned().unwrap_or_default(),
            }
        })
        .collect()
}

/// `error_inputs` as (shape, dtype) pairs in input order.
fn error_inputs(c: &Value) -> Vec<(Vec<usize>, String)> {
    let Some(m) = c["error_inputs"].as_object() else {
        return vec![];
    };
    (0..m.len())
        .filter_map(|k| m.get(&format!("in{k}")))
        .map(|v| {
            let shape = v["shape"].as_array().unwrap();
            let shape = shape.iter().map(|d| d.as_u64().unwrap() as usize).collect();
            (shape, v["dtype"].as_str().unwrap().to_string())
        })
        .collect()
}

fn ints(s: &str) -> Vec<i64> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().unwrap())
        .collect()
}

/// Evaluates the small Python view expressions of the manifest:
/// `in0.t()`, `in0.transpose(0, 2)`, `in0.permute(1, 0, 2)`, `in0.expand(3, 4)`, `in0[1:]`,
/// and `in0.log_softmax(2)` (loss_more's CTC logits).
pub fn eval_view(stored: &[Tensor], expr: &str) -> Result<Tensor, String> {
    let k: usize = expr[2..3].parse().map_err(|_| format!("bad expr {expr}"))?;
    let mut t = stored[k].clone();
    let mut rest = &expr[3..];
    while !rest.is_empty() {
        let r = if let Some(body) = rest.strip_prefix('[') {
            let end = body.find(']').unwrap();
            for (d, part) in body[..end].split(',').enumerate() {
                let p: Vec<&str> = part.split(':').map(str::trim).collect();
                let num = |s: &str| {
                    if s.is_empty() {
                        None
                    } else {
                        Some(s.parse::<i64>().unwrap())
                    }
                };
                t = t
                    .slice(
                        d as i64,
                        num(p[0]),
                        p.get(1).and_then(|s| num(s)),
                        p.get(2).and_then(|s| num(s)).unwrap_or(1),
                    )
                    .map_err(|e| e.to_string())?;
            }
            rest = &body[end + 1..];
            continue;
        } else {
            rest.strip_prefix('.').ok_or(format!("bad expr {expr}"))?
        };
        let open = r.find('(').unwrap();
        let close = r.find(')').unwrap();
        let (name, args) = (&r[..open], ints(&r[open + 1..close]));
        t = match name {
            "t" => t.t(),
            "transpose" => t.transpose(args[0], args[1]),
            "permute" => t.permute(&args),
            "expand" => t.expand(&args),
            // not a view: the CTC cases feed logits through log_softmax
            "log_softmax" => t.log_softmax(args[0]),
            _ => return Err(format!("unknown view method {name} in {expr}")),
        }
        .map_err(|e| e.to_string())?;
        rest = &r[close + 1..];
    }
    Ok(t)
}

/// `|a - b| <= atol + rtol |b|` elementwise, NaN == NaN, infinities equal only
/// to themselves; shapes and dtypes must match too.
pub fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dims() != want.dims() {
        return Err(format!(
            "shape {:?}, expected {:?}",
            got.dims(),
            want.dims()
        ));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, expected {}", got.dtype(), want.dtype()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut worst: Option<(usize, f64, f64)> = None;
    let mut bad = 0;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= atol + rtol * b.abs()
        };
        if !ok {
            bad += 1;
            if worst.is_none() {
                worst = Some((i, a, b));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, a, b)) => Err(format!(
            "{bad}/{} elements differ; first at {i}: got {a:e}, expected {b:e}",
            g.len()
        )),
    }
}

/// Layout checks of view cases: shape, strides, offset, contiguity, aliasing.
/// Compares a case's outputs with the stored ones under its tolerances (a
/// device output after a copy to the CPU), and checks the views it makes.
pub fn check_outputs(
    fx: &Fixtures,
    c: &Case,
    outs: &[Tensor],
    inputs: &[Tensor],
) -> Result<(), String> {
    if outs.len() != c.outputs.len() {
        return Err(format!(
            "{} outputs, expected {}",
            outs.len(),
            c.outputs.len()
        ));
    }
    for (k, (got, name)) in outs.iter().zip(&c.outputs).enumerate() {
        let want = fx.tensor(c, name)?;
        let host = got
            .to_device(kiln::Device::Cpu)
            .map_err(|e| e.to_string())?;
        compare(&host, &want, c.rtol, c.atol).map_err(|e| format!("out{k}: {e}"))?;
        if let Some(v) = c.views.get(k) {
            check_view(got, v, inputs).map_err(|e| format!("out{k}: {e}"))?;
        }
    }
    Ok(())
}

pub fn check_view(got: &Tensor, v: &Value, inputs: &[Tensor]) -> Result<(), String> {
    let arr = |k: &str| -> Vec<i64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    let dims: Vec<i64> = got.dims().iter().map(|&d| d as i64).collect();
    let strides: Vec<i64> = got.strides().iter().map(|&d| d as i64).collect();
    if dims != arr("shape") {
        return Err(format!("view shape {dims:?}, expected {:?}", arr("shape")));
    }
    if got.is_contiguous() != v["is_contiguous"].as_bool().unwrap() {
        return Err(format!(
            "is_contiguous {}, expected {}",
            got.is_contiguous(),
            v["is_contiguous"]
        ));
    }
    let aliases = inputs.iter().any(|i| got.shares_storage(i));
    if aliases != v["aliases_input"].as_bool().unwrap() {
        return Err(format!(
            "aliases input: {aliases}, expected {}",
            v["aliases_input"]
        ));
    }
    let want_s = arr("strides");
    if strides != want_s {
        return Err(format!("strides {strides:?}, expected {want_s:?}"));
    }
    if aliases && got.offset() as i64 != v["offset"].as_i64().unwrap() {
        return Err(format!("offset {}, expected {}", got.offset(), v["offset"]));
    }
    Ok(())
}
