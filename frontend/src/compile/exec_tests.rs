//! The executable on hand-written graphs: results equal eager ops, and the
//! kernels launched are the ones the fusion plan lists.

use super::epilogue::MIN_TILED_SAMPLE;
use super::exec::{Executable, HoistCache};
use crate::functional as F;
use crate::Tensor;
use kiln_ir::graph::Graph;
use kiln_ir::op::conv::ConvParams;

fn randn(dims: &[usize], seed: u64) -> Tensor {
    let mut g = crate::random::Generator::new(seed);
    crate::random::randn(dims, Some(&mut g))
}

fn close(a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!(a.dims(), b.dims());
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!(
            (p - q).abs() <= tol * (1.0 + q.abs()),
            "element {i}: {p} vs {q}"
        );
    }
}

/// Runs `g` and returns its outputs and the names of the kernels launched.
fn run(exec: &Executable, ins: &[Tensor]) -> (Vec<Tensor>, Vec<String>) {
    let (outs, ks) =
        kiln_runtime::record_kernels(|| exec.run(ins, &[], &mut HoistCache::default()));
    (outs.unwrap(), ks.iter().map(|k| k.name.clone()).collect())
}

#[test]
fn w1_chain_is_one_kernel_and_matches_eager() {
    let g = Graph::parse(
        "graph w1(%0 x: f32[1000], %1 a: f32[1000], %2 b: f32[1000]) {
  %3 = mul(%0, %1) : f32[1000]
  %4 = add(%3, %2) : f32[1000]
  %5 = gelu(%4) : f32[1000]
  %6 = mul_scalar(%5) {reversed=false, value=0.5} : f32[1000]
  %7 = add(%6, %0) : f32[1000]
  return %7
}
",
    )
    .unwrap();
    let exec = Executable::new(g, &[false; 3]);
    let (x, a, b) = (randn(&[1000], 1), randn(&[1000], 2), randn(&[1000], 3));
    let (outs, ks) = run(&exec, &[x.clone(), a.clone(), b.clone()]);
    assert_eq!(ks.len(), 1, "{ks:?}");
    let want = &(&x.mul(&a).unwrap().add(&b).unwrap().gelu(false).unwrap() * 0.5) + &x;
    close(&outs[0], &want, 1e-6);
}

/// Runs `conv2d(x) + r` then relu (the residual `r` in any layout), tiling
/// the epilogue for outputs of at least `min_tiled_sample` elements per sample.
/// The conv is im2col's, one sample at a time: which algorithm a compiled
/// conv times fastest (microseconds apart here) decides how its epilogue is
/// tiled, and the tests below count those launches.
fn conv_residual_relu(r: Tensor, min_tiled_sample: usize) -> (Tensor, Tensor, Vec<String>) {
    use kiln_runtime::externs::conv::select::{with_algorithm, ConvAlgo};
    with_algorithm(ConvAlgo::Im2colGemm, || {
        conv_residual_relu_any(r, min_tiled_sample)
    })
}

fn conv_residual_relu_any(r: Tensor, min_tiled_sample: usize) -> (Tensor, Tensor, Vec<String>) {
    let g = Graph::parse(
        "graph c(%0 x: f32[2,3,8,8], %1 w: f32[4,3,3,3], %2 b: f32[4], %3 r: f32[2,4,6,6]) {
  %4 = conv2d(%0, %1, %2) {dilation=[1], groups=1, padding=[0], stride=[1]} : f32[2,4,6,6]
  %5 = add(%4, %3) : f32[2,4,6,6]
  %6 = relu(%5) : f32[2,4,6,6]
  return %6
}
",
    )
    .unwrap();
    let mut exec = Executable::new(g, &[false, true, true, false]);
    exec.min_tiled_sample = min_tiled_sample;
    let ins = [
        randn(&[2, 3, 8, 8], 1),
        randn(&[4, 3, 3, 3], 2),
        randn(&[4], 3),
        r,
    ];
    let (mut outs, ks) = run(&exec, &ins);
    let want = F::conv2d(&ins[0], &ins[1], Some(&ins[2]), &ConvParams::default())
        .unwrap()
        .add(&ins[3])
        .unwrap()
        .relu()
        .unwrap();
    (outs.remove(0), want, ks)
}

#[test]
fn conv_epilogue_runs_per_output_tile() {
    let (got, want, ks) = conv_residual_relu(randn(&[2, 4, 6, 6], 4), 0);
    close(&got, &want, 1e-5);
    // this small conv runs serially: one epilogue launch per output tile
    // (2 images x 1 tile of 36 positions), none over the whole output
    assert_eq!(ks, ["fused[add+relu]", "fused[add+relu]"]);
}

#[test]
fn small_conv_outputs_take_their_epilogue_in_one_pass() {
    let (got, want, ks) = conv_residual_relu(randn(&[2, 4, 6, 6], 4), MIN_TILED_SAMPLE);
    close(&got, &want, 1e-5);
    assert_eq!(ks, ["fused[add+relu]"]);
}

#[test]
fn conv_epilogue_falls_back_to_one_pass_when_a_tile_has_no_view() {
    // the residual's spatial dims are transposed: they do not flatten into one stride
    let r = randn(&[2, 4, 6, 6], 4).transpose(2, 3).unwrap();
    let (got, want, ks) = conv_residual_relu(r, 0);
    close(&got, &want, 1e-5);
    assert_eq!(ks, ["fused[add+relu]"]);
}

#[test]
fn parameter_only_values_are_hoisted_until_a_parameter_changes() {
    // y = x * exp(p): exp(p) depends only on the captured p
    let g = Graph::parse(
        "graph h(%0 x: f32[4], %1 p: f32[4]) {\n  %2 = exp(%1) : f32[4]\n  %3 = permute(%2) {dims=[0]} : f32[4]\n  %4 = mul(%0, %3) : f32[4]\n  return %4\n}\n",
    )
    .unwrap();
    let exec = Executable::new(g, &[false, true]);
    let (x, p) = (randn(&[4], 1), randn(&[4], 2));
    let mut cache = HoistCache::default();
    let (_, first) = kiln_runtime::record_kernels(|| {
        exec.run(&[x.clone(), p.clone()], &[0], &mut cache).unwrap()
    });
    let (y, again) = kiln_runtime::record_kernels(|| {
        exec.run(&[x.clone(), p.clone()], &[0], &mut cache).unwrap()
    });
    assert_eq!(first.len(), 2);
    assert_eq!(again.len(), 1, "exp(p) is reused");
    close(&y[0], &x.mul(&p.exp().unwrap()).unwrap(), 1e-6);
    let (_, moved) = kiln_runtime::record_kernels(|| {
        exec.run(&[x.clone(), p.clone()], &[1], &mut cache).unwrap()
    });
    assert_eq!(moved.len(), 2, "a new parameter version recomputes it");
}
