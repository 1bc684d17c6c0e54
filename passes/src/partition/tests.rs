use super::*;

fn joint(text: &str) -> Graph {
    Graph::parse(text).unwrap()
}

fn tangents(g: &Graph) -> Vec<NodeId> {
    g.inputs()
        .iter()
        .copied()
        .filter(
            |id| matches!(&g.node(*id).op, NodeOp::Input { name } if name.starts_with("tangent")),
        )
        .collect()
}

#[test]
fn an_output_read_by_backward_is_handed_over() {
    // out = exp(x * w); grad_w = t * out * x
    let g = joint(
        "graph f(%0 x: f32[4], %1 w: f32[4], %2 tangent0: f32[4]) {
  %3 = mul(%0, %1) : f32[4]
  %4 = exp(%3) : f32[4]
  %5 = mul(%2, %4) : f32[4]
  %6 = mul(%5, %0) : f32[4]
  return %4, %6
}
",
    );
    let p = partition(&g, &tangents(&g), 1).unwrap();
    // exp's result is an output (alive anyway): the backward reads it, and
    // recomputes nothing
    assert_eq!((p.n_saved, p.saved_bytes, p.recomputed), (1, 0, 0));
    assert_eq!(p.forward_inputs, vec![0, 1]);
    assert_eq!(
        p.backward_inputs,
        vec![
            BackwardInput::Saved(0),
            BackwardInput::Primal(0),
            BackwardInput::Tangent(2)
        ]
    );
    assert_eq!(p.forward.outputs().len(), 2);
    insta::assert_snapshot!(format!("{}{}", p.forward.to_text(), p.backward.to_text()));
}

#[test]
fn reductions_are_saved_and_pointwise_over_them_recomputed() {
    // y = relu(x - sum(x)); out = sum(y); grad x (through y only) = t * y
    let g = joint(
        "graph f(%0 x: f32[2,3], %1 tangent0: f32[]) {
  %2 = sum(%0) {dims=[1], keepdim=true} : f32[2,1]
  %3 = sub(%0, %2) : f32[2,3]
  %4 = relu(%3) : f32[2,3]
  %5 = sum(%4) {dims=[0, 1], keepdim=false} : f32[]
  %6 = mul(%1, %4) : f32[2,3]
  return %5, %6
}
",
    );
    let p = partition(&g, &tangents(&g), 1).unwrap();
    // saving the [2,1] sum beats saving the [2,3] relu
    assert_eq!((p.n_saved, p.saved_bytes), (1, 8));
    assert_eq!(p.recomputed, 2);
    assert_eq!(p.backward_inputs[0], BackwardInput::Saved(0));
    assert_eq!(p.forward.outputs().len(), 2);
    insta::assert_snapshot!(format!("{}{}", p.forward.to_text(), p.backward.to_text()));
}

#[test]
fn a_matmul_output_read_by_backward_is_saved() {
    let g = joint(
        "graph f(%0 x: f32[2,3], %1 w: f32[3,4], %2 tangent0: f32[]) {
  %3 = matmul(%0, %1) : f32[2,4]
  %4 = tanh(%3) : f32[2,4]
  %5 = mul(%4, %4) : f32[2,4]
  %6 = sub_scalar(%5) {reversed=true, value=1.0} : f32[2,4]
  %7 = mul(%2, %6) : f32[2,4]
  %8 = permute(%0) {dims=[1,0]} : f32[3,2]
  %9 = matmul(%8, %7) : f32[3,4]
  %10 = sum(%4) {dims=[0, 1], keepdim=false} : f32[]
  return %10, %9
}
",
    );
    let p = partition(&g, &tangents(&g), 1).unwrap();
    // one [2,4] value is saved, never two: 1 - tanh^2 itself (saving
    // tanh^2 instead would cost as much and rebuild the subtraction); x's
    // transpose is rebuilt from x
    assert_eq!((p.n_saved, p.saved_bytes, p.recomputed), (1, 32, 1));
    assert!(!p.backward.to_text().contains("tanh"));
    assert!(!p.backward.to_text().contains("sub_scalar"));
    assert!(p.backward_inputs.contains(&BackwardInput::Primal(0)));
}

#[test]
fn a_forward_output_depending_on_a_tangent_is_an_error() {
    let g = joint(
        "graph f(%0 x: f32[2], %1 tangent0: f32[2]) {\n  %2 = mul(%0, %1) : f32[2]\n  return %2\n}\n",
    );
    let e = partition(&g, &tangents(&g), 1).unwrap_err().to_string();
    assert!(e.contains("depends on a tangent"), "{e}");
}

#[test]
fn a_pointwise_chain_is_recomputed_from_the_inputs() {
    // out = sum(exp(x * w)); grad_w = t * exp(x * w) * x
    let g = joint(
        "graph f(%0 x: f32[4], %1 w: f32[4], %2 tangent0: f32[]) {
  %3 = mul(%0, %1) : f32[4]
  %4 = exp(%3) : f32[4]
  %5 = sum(%4) {dims=[0], keepdim=false} : f32[]
  %6 = mul(%2, %4) : f32[4]
  %7 = mul(%6, %0) : f32[4]
  return %5, %7
}
",
    );
    let p = partition(&g, &tangents(&g), 1).unwrap();
    assert_eq!((p.n_saved, p.recomputed, p.recomputed_bytes), (0, 2, 32));
    assert_eq!(
        p.backward_inputs,
        vec![
            BackwardInput::Primal(0),
            BackwardInput::Primal(1),
            BackwardInput::Tangent(2)
        ]
    );
    insta::assert_snapshot!(format!("{}{}", p.forward.to_text(), p.backward.to_text()));
}

#[test]
fn one_saved_relu_beats_its_transpose_and_its_mask() {
    // backward reads relu's transpose (weight grad) and its mask (relu grad)
    let g = joint(
        "graph f(%0 x: f32[4,8], %1 w: f32[8,8], %2 tangent0: f32[]) {
  %3 = matmul(%0, %1) : f32[4,8]
  %4 = relu(%3) : f32[4,8]
  %5 = sum(%4) {dims=[0, 1], keepdim=false} : f32[]
  %6 = expand(%2) {size=[4,8]} : f32[4,8]
  %7 = permute(%4) {dims=[1,0]} : f32[8,4]
  %8 = matmul(%7, %6) : f32[8,8]
  %9 = gt_scalar(%4) {reversed=false, value=0.0} : bool[4,8]
  %10 = where(%9, %6, %6) : f32[4,8]
  return %5, %8, %10
}
",
    );
    let p = partition(&g, &tangents(&g), 1).unwrap();
    assert_eq!((p.n_saved, p.saved_bytes), (1, 128));
    assert!(p.backward.to_text().contains("permute") && p.backward.to_text().contains("gt_scalar"));
}

#[test]
fn checkpointed_regions_save_their_boundary_and_recompute_the_rest() {
    // two regions: z1 = x @ w, h = tanh(z1) | z2 = h @ w, out = tanh(z2);
    // the backward reads z1 and z2 (made-up rules, to force the reads)
    let g = joint(
        "graph f(%0 x: f32[2,3], %1 w: f32[3,3], %2 tangent0: f32[2,3]) {
  %3 = matmul(%0, %1) : f32[2,3]
  %4 = tanh(%3) : f32[2,3]
  %5 = matmul(%4, %1) : f32[2,3]
  %6 = tanh(%5) : f32[2,3]
  %7 = mul(%2, %5) : f32[2,3]
  %8 = mul(%7, %3) : f32[2,3]
  return %6, %8
}
",
    );
    let t = tangents(&g);
    // by default both matmul results are saved
    let plain = partition(&g, &t, 1).unwrap();
    assert_eq!((plain.n_saved, plain.saved_bytes), (2, 48));
    use SavePolicy::{Auto, Recompute, Save};
    let policy = [Auto, Auto, Auto, Recompute, Save, Recompute, Save];
    let p = partition_with(&g, &t, 1, &policy).unwrap();
    // only the first region's output (the second's input) is saved; the
    // forward output is handed over for free and both matmuls run again
    assert_eq!((p.n_saved, p.saved_bytes, p.recomputed), (1, 24, 2));
    let bwd = p.backward.to_text();
    assert_eq!(bwd.matches("matmul(").count(), 2, "{bwd}");
    assert_eq!(p.backward_inputs[0], BackwardInput::Saved(0));
    // a policy shorter than the graph leaves the rest Auto
    let p = partition_with(&g, &t, 1, &policy[..4]).unwrap();
    assert_eq!(p.n_saved, 1, "z1 recomputed, z2 saved");
}
