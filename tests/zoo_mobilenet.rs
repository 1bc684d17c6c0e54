//! `kiln::models::mobilenetv3` and `kiln::models::efficientnet` against
//! torchvision: every state_dict key and shape of mobilenet_v3_small,
//! mobilenet_v3_large (also width_mult 0.5 with reduced_tail and dilated)
//! and efficientnet_b0, num_classes=10, in torchvision's order
//! (tests/fixtures/zoo/torchvision_keys.json); and the eval output of
//! torchvision models shrunk by their constructor arguments
//! (scripts/torchvision-zoo-fixtures.py) loaded into kiln's, eager and
//! compiled, to rtol 1e-4, atol 1e-5.

#[allow(dead_code)]
mod real_models;
mod zoo_support;

use kiln::models::efficientnet::{
    efficientnet_b0, efficientnet_conf, EfficientNet, EfficientNetOptions,
};
use kiln::models::mobilenetv3::{mobilenet_v3_large, mobilenet_v3_small, MobileNetV3Options};
use kiln::nn::BatchNormOptions;

fn ten_classes() -> MobileNetV3Options {
    MobileNetV3Options {
        num_classes: 10,
        ..MobileNetV3Options::default()
    }
}

#[test]
fn state_dict_keys_and_shapes_are_torchvisions() {
    let small = mobilenet_v3_small(&ten_classes()).unwrap();
    zoo_support::assert_torchvision_keys("mobilenet_v3_small", &small);
    let large = mobilenet_v3_large(&ten_classes()).unwrap();
    zoo_support::assert_torchvision_keys("mobilenet_v3_large", &large);
    let variant = MobileNetV3Options {
        width_mult: 0.5,
        reduced_tail: true,
        dilated: true,
        ..ten_classes()
    };
    let m = mobilenet_v3_small(&variant).unwrap();
    zoo_support::assert_torchvision_keys("mobilenet_v3_small_w0.5_reduced_dilated", &m);
    let eff = efficientnet_b0(&EfficientNetOptions {
        num_classes: 10,
        ..EfficientNetOptions::default()
    })
    .unwrap();
    zoo_support::assert_torchvision_keys("efficientnet_b0", &eff);
}

#[test]
fn mobilenet_v3_small_eval_output_is_torchvisions() {
    let o = MobileNetV3Options {
        width_mult: 0.5,
        ..ten_classes()
    };
    zoo_support::check_eval_output("mobilenet_v3_small", &mobilenet_v3_small(&o).unwrap());
}

#[test]
fn efficientnet_eval_output_is_torchvisions() {
    // EfficientNet(_efficientnet_conf("efficientnet_b0", width_mult=0.5, depth_mult=0.5), 0.2, num_classes=10)
    let setting = efficientnet_conf(0.5, 0.5);
    let m = EfficientNet::new(&setting, 0.2, 0.2, 10, BatchNormOptions::default(), None).unwrap();
    zoo_support::check_eval_output("efficientnet", &m);
}
