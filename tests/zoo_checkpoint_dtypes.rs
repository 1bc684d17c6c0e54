//! A full-size torchvision resnet18 state_dict written by kiln as safetensors
//! in f16 and bf16 under torchvision's key names (what
//! `model.half().state_dict()` saved with `safetensors.torch.save_file`
//! holds: floating tensors in the reduced dtype, `num_batches_tracked` still
//! int64) loads back strictly into an f32 model, every value equal to the f32
//! value rounded to f16 / bf16 to nearest, ties to even (the `half` crate's
//! conversion as the reference). Without torch, so it runs in CI; the check
//! against real PyTorch checkpoints is scripts/torch-checkpoint-check.sh.

#[allow(dead_code)]
mod real_models;
#[allow(dead_code)]
mod zoo_support;

use kiln::models::resnet::resnet18;
use kiln::nn::{LoadReport, ModuleExt};
use kiln::{serialize, DType, Tensor};

/// Values on the rounding edges of both formats: exact ties (to even, down
/// and up), a subnormal f16, overflow past f16's largest finite value, and
/// the largest finite f16 itself.
const EDGES: [f32; 8] = [
    1.0 + 1.0 / 2048.0, // f16 tie: 1.0 (even)
    1.0 + 3.0 / 2048.0, // f16 tie: 1 + 2^-9 (even)
    1.0 + 1.0 / 256.0,  // bf16 tie: 1.0 (even)
    1.0 + 3.0 / 256.0,  // bf16 tie: 1 + 2^-6 (even)
    -3.0e-6,            // f16 subnormal
    70000.0,            // past f16's max: inf in f16, finite in bf16
    65504.0,            // f16's max
    0.1,                // inexact in both
];

fn rounded(v: f32, d: DType) -> f32 {
    match d {
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// The state_dict as `model.to(d).state_dict()` holds it: floating tensors
/// converted, integer buffers unchanged.
fn cast(sd: &[(String, Tensor)], d: DType) -> Vec<(String, Tensor)> {
    sd.iter()
        .map(|(k, t)| {
            let t = if t.dtype().is_float() {
                t.to_dtype(d).unwrap()
            } else {
                t.clone()
            };
            (k.clone(), t)
        })
        .collect()
}

#[test]
fn resnet18_f16_and_bf16_checkpoints_load_rounded_to_nearest_even() {
    kiln::manual_seed(5);
    let src = resnet18(1000).unwrap();
    // torchvision's key names (the fixture's shapes are for num_classes=10)
    let names: Vec<String> = src.state_dict().into_iter().map(|(k, _)| k).collect();
    let want: Vec<String> = zoo_support::torchvision_keys("resnet18")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(names, want);
    // the edge values at the head of fc.bias (a state_dict entry is the
    // module's own tensor, so writing it writes the model)
    let fc_bias = |m: &kiln::models::resnet::ResNet| {
        m.state_dict()
            .into_iter()
            .find(|(k, _)| k == "fc.bias")
            .map(|(_, t)| t)
            .unwrap()
    };
    let mut bias = fc_bias(&src).to_vec::<f32>().unwrap();
    bias[..EDGES.len()].copy_from_slice(&EDGES);
    let _g = kiln::autograd::no_grad();
    fc_bias(&src)
        .copy_(&Tensor::from_vec(bias, &[1000]).unwrap())
        .unwrap();
    let f32_sd = src.state_dict();
    let dir = std::env::temp_dir().join(format!("kiln-zoo-dtypes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for d in [DType::F16, DType::BF16] {
        let path = dir.join(format!("resnet18.{d:?}.safetensors"));
        serialize::save(&path, &cast(&f32_sd, d)).unwrap();
        // the file holds the reduced dtype (read without kiln)
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let want = if d == DType::F16 {
            safetensors::Dtype::F16
        } else {
            safetensors::Dtype::BF16
        };
        assert_eq!(st.tensor("conv1.weight").unwrap().dtype(), want);
        assert_eq!(
            st.tensor("bn1.num_batches_tracked").unwrap().dtype(),
            safetensors::Dtype::I64
        );

        let back = serialize::load(&path).unwrap();
        let dst = resnet18(1000).unwrap();
        let report = dst.load_state_dict(&back, true).unwrap();
        assert_eq!(report, LoadReport::default(), "{d:?}");
        let mut checked = 0usize;
        for ((k, orig), (k2, got)) in f32_sd.iter().zip(dst.state_dict()) {
            assert_eq!(k, &k2);
            assert_eq!(got.dtype(), orig.dtype(), "{k}: the f32 model stays f32");
            if !orig.dtype().is_float() {
                assert_eq!(got.to_vec::<i64>().unwrap(), orig.to_vec::<i64>().unwrap());
                continue;
            }
            let (o, g) = (orig.to_vec::<f32>().unwrap(), got.to_vec::<f32>().unwrap());
            for (i, (a, b)) in o.iter().zip(&g).enumerate() {
                assert_eq!(rounded(*a, d).to_bits(), b.to_bits(), "{d:?} {k}[{i}]: {a}");
            }
            checked += o.len();
        }
        assert_eq!(
            checked,
            11_689_512 + 2 * 4_800,
            "{d:?}: every parameter and BN statistic"
        );
        let head = &fc_bias(&dst).to_vec::<f32>().unwrap()[..EDGES.len()];
        println!("{d:?}: {checked} values rounded as half's round-to-nearest-even; edges {head:?}");
        if d == DType::F16 {
            assert_eq!(&head[..2], &[1.0, 1.0 + 4.0 / 2048.0]);
            assert_eq!(head[5], f32::INFINITY);
        } else {
            assert_eq!(&head[2..4], &[1.0, 1.0 + 4.0 / 256.0]);
            assert!(head[5].is_finite());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
