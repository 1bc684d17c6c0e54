//! `kiln::models::resnet` against torchvision: every state_dict key and
//! shape of resnet18/34/50 (num_classes=10) in torchvision's order
//! (tests/fixtures/zoo/torchvision_keys.json, written by
//! scripts/torchvision-keys.py), and resnet18's eval output equal to the
//! hand port in `kiln::bench::vision` (checked against torchvision's) with
//! the same weights.

#[allow(dead_code)]
mod real_models;
#[allow(dead_code)]
mod zoo_support;

use kiln::models::resnet::{resnet18, resnet34, resnet50, ResNet};
use kiln::nn::{Module, ModuleExt};
use kiln::{Result, Tensor};

#[test]
fn state_dict_keys_and_shapes_are_torchvisions() {
    let builders: [(&str, fn(usize) -> Result<ResNet>); 3] = [
        ("resnet18", resnet18),
        ("resnet34", resnet34),
        ("resnet50", resnet50),
    ];
    for (name, build) in builders {
        zoo_support::assert_torchvision_keys(name, &build(10).unwrap());
    }
}

#[test]
fn resnet18_computes_the_hand_port() {
    kiln::manual_seed(3);
    let ours = resnet18(10).unwrap();
    let port = kiln::bench::vision::resnet18(10).unwrap();
    // the same tensors, entry by entry (both follow torchvision's order)
    let sd: Vec<(String, Tensor)> = port
        .state_dict()
        .into_iter()
        .zip(ours.state_dict())
        .map(|((k, _), (_, t))| (k, t))
        .collect();
    let report = port.load_state_dict(&sd, true).unwrap();
    println!("{report:?}");
    ours.eval();
    port.eval();
    let x = kiln::random::randn(&[2, 3, 64, 64], None);
    let (a, b) = (ours.forward(&x).unwrap(), port.forward(&x).unwrap());
    assert_eq!(a.dims(), &[2, 10]);
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
}
