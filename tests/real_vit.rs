//! `kiln::models::vit::VisionTransformer` against torchvision's
//! VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
//! hidden_dim=64, mlp_dim=128, num_classes=10) (tests/fixtures/real/vit_tiny):
//! eval and train outputs, loss, every gradient and the state after one SGD
//! step, eager and compiled (`real vit_tiny eager: P/T`, `real vit_tiny compiled: P/T`).

mod real_models;

use kiln::models::vit::{VisionTransformer, VitConfig};
use kiln::{ClassLossOpts, Tensor};

fn run(compiled: bool) {
    let t = real_models::load("vit_tiny");
    let cfg = VitConfig {
        image_size: 32,
        patch_size: 8,
        num_layers: 2,
        num_heads: 4,
        hidden_dim: 64,
        mlp_dim: 128,
        num_classes: 10,
        ..VitConfig::vit_b_16()
    };
    let model = VisionTransformer::new(&cfg).unwrap();
    let target = Tensor::from_vec(vec![2i64, 4], &[2]).unwrap();
    let loss = |out: &Tensor| {
        kiln::functional::cross_entropy(out, &target, None, ClassLossOpts::default())
    };
    let tally = real_models::run_protocol("vit_tiny", &t, &model, &t["input/x"], loss, compiled);
    assert!(tally.total > 60, "only {} checks ran", tally.total);
    assert!(
        tally.failed.is_empty(),
        "vit_tiny failed:\n{}",
        tally.failed.join("\n")
    );
}

#[test]
fn real_vit_tiny_eager() {
    run(false);
}

#[test]
fn real_vit_tiny_compiled() {
    run(true);
}
