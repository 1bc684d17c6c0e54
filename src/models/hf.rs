//! What the transformers ports share: `ACT2FN`, the activation a config
//! names.

use crate::nn::Activation;
use crate::Result;
use kiln_ir::bail;

/// transformers' `ACT2FN[name]` for the names kiln supports: `"gelu"`
/// (exact, erf), `"gelu_new"` / `"gelu_pytorch_tanh"` (tanh
/// approximation), `"relu"`, `"silu"` / `"swish"`, `"tanh"`.
///
/// ```
/// use kiln::models::hf::act2fn;
/// use kiln::nn::Module;
/// assert_eq!(act2fn("gelu").unwrap().describe(), "GELU(approximate='none')");
/// assert!(act2fn("mish").is_err());
/// ```
pub fn act2fn(name: &str) -> Result<Activation> {
    Ok(match name {
        "gelu" => Activation::gelu(false),
        "gelu_new" | "gelu_pytorch_tanh" => Activation::gelu(true),
        "relu" => Activation::relu(),
        "silu" | "swish" => Activation::silu(),
        "tanh" => Activation::tanh(),
        other => bail!(
            "ACT2FN",
            "activation '{other}' is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish, tanh)"
        ),
    })
}
