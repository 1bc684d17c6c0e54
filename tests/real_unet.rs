//! `kiln::models::unet::UNet` against gen_real.py's `TinyUNet` (conv-BN-ReLU,
//! max_pool2d, ConvTranspose2d, a bilinear skip of the bottleneck's first
//! channels, cat; tests/fixtures/real/unet_tiny): eval and train outputs,
//! the per-pixel cross-entropy, every gradient and the state after one SGD
//! step, eager and compiled (`real unet_tiny eager: P/T`,
//! `real unet_tiny compiled: P/T`).

mod real_models;

use kiln::models::unet::{UNet, UNetConfig};
use kiln::{ClassLossOpts, Tensor};

fn run(compiled: bool) {
    let t = real_models::load("unet_tiny");
    let model = UNet::new(&UNetConfig::default()).unwrap();
    // gen_real.py: torch.randint(0, 2, (2, 16, 16), generator=manual_seed(9))
    let mask = real_models::torch_randint_cpu(9, 2, 2 * 16 * 16);
    let target = Tensor::from_vec(mask, &[2, 16, 16]).unwrap();
    let loss = |out: &Tensor| {
        kiln::functional::cross_entropy(out, &target, None, ClassLossOpts::default())
    };
    let tally = real_models::run_protocol("unet_tiny", &t, &model, &t["input/x"], loss, compiled);
    // 3 outputs, 14 gradients, 20 state entries after the step
    assert_eq!(tally.total, 37, "checks run");
    assert!(
        tally.failed.is_empty(),
        "unet_tiny failed:\n{}",
        tally.failed.join("\n")
    );
}

#[test]
fn real_unet_tiny_eager() {
    run(false);
}

#[test]
fn real_unet_tiny_compiled() {
    run(true);
}

#[test]
fn bad_inputs_are_errors_naming_the_shape() {
    let model = UNet::new(&UNetConfig::default()).unwrap();
    for dims in [[2, 3, 15, 16], [2, 4, 16, 16]] {
        let e = model
            .forward(&Tensor::zeros(&dims, kiln::DType::F32))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("UNet") && e.contains("expected images (N, 3, H, W)"),
            "{e}"
        );
    }
    let zero = UNetConfig {
        width: 0,
        ..UNetConfig::default()
    };
    assert!(UNet::new(&zero).is_err());
}
