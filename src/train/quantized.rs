//! `kiln train --quantize`: the trained model's test accuracy with its
//! Linear layers dynamically quantized to int8, beside the float accuracy.

use super::{default_data_path, evaluate_with, load_splits, TrainConfig};
use crate::nn::{Module, Sequential};
use crate::quantization::{quantize_dynamic, Isa, QScheme, QuantType};
use crate::Result;

/// The int8 accuracy of `model` per scheme, as printable lines.
pub fn report(cfg: &TrainConfig, model: &Sequential, float_acc: f64) -> Result<Vec<String>> {
    let path = cfg.data.clone().unwrap_or_else(default_data_path);
    let splits = load_splits(&path, cfg.seed, cfg.limit)?;
    let (x, y) = &splits.test;
    let mut lines = vec![];
    for (scheme, name) in [
        (QScheme::PerTensor, "per-tensor"),
        (QScheme::PerChannel, "per-channel"),
    ] {
        let q = quantize_dynamic(model, &[QuantType::Linear], scheme)?;
        let acc = evaluate_with(model, &|x| q.forward(x), x, y)?;
        lines.push(format!(
            "quantized test accuracy: {acc:.4} (int8 dynamic, {name}, {} kernel, {} Linear layers; float {float_acc:.4}, change {:+.2} points)",
            Isa::detect().name(),
            q.quantized_layers(),
            (acc - float_acc) * 100.0
        ));
    }
    Ok(lines)
}
