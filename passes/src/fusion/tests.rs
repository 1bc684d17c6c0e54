//! One test per row of the fusion table (fires where it should, not where it must not).

use super::*;
use crate::lower::decompose_composites;

fn plan(text: &str) -> (Graph, FusionPlan) {
    let g = decompose_composites(&Graph::parse(text).unwrap()).unwrap();
    let p = plan_fusion(&g);
    (g, p)
}

fn names(g: &Graph, p: &FusionPlan) -> Vec<String> {
    p.kernels.iter().map(|k| kernel_name(g, k)).collect()
}

const W1: &str = "graph w1(%0 x: f32[64], %1 a: f32[64], %2 b: f32[64]) {
  %3 = mul(%0, %1) : f32[64]
  %4 = add(%3, %2) : f32[64]
  %5 = gelu(%4) : f32[64]
  %6 = mul_scalar(%5) {reversed=false, value=0.5} : f32[64]
  %7 = add(%6, %0) : f32[64]
  return %7
}
";

#[test]
fn pointwise_chain_is_one_kernel() {
    let (g, p) = plan(W1);
    assert_eq!(names(&g, &p), ["fused[mul+add+gelu+mul_scalar+add]"]);
    assert_eq!(p.kernels[0].reads.len(), 3);
}

#[test]
fn pointwise_prologue_fuses_into_reduction_and_result_is_read_by_epilogue() {
    let (g, p) = plan(
        "graph s(%0 x: f32[4,8]) {
  %1 = exp(%0) : f32[4,8]
  %2 = sum(%1) {dims=[1], keepdim=true} : f32[4,1]
  %3 = div(%1, %2) : f32[4,8]
  return %3
}
",
    );
    // exp is recomputed in the division rather than stored: 2 passes, not 3
    assert_eq!(names(&g, &p), ["sum[exp]", "fused[exp+div]"]);
}

#[test]
fn softmax_needs_at_most_three_kernels_without_online_lse() {
    let (_, p) =
        plan("graph s(%0 x: f32[4,8]) {\n  %1 = softmax(%0) {dim=1} : f32[4,8]\n  return %1\n}\n");
    assert!(p.launches() <= 3, "{}", p.launches());
}

#[test]
fn pointwise_feeding_a_view_or_extern_is_stored() {
    let (g, p) = plan(
        "graph v(%0 x: f32[4,8], %1 w: f32[8,2]) {
  %2 = relu(%0) : f32[4,8]
  %3 = permute(%2) {dims=[1,0]} : f32[8,4]
  %4 = exp(%0) : f32[4,8]
  %5 = matmul(%4, %1) : f32[4,2]
  return %3, %5
}
",
    );
    assert_eq!(names(&g, &p), ["relu", "exp", "matmul"]);
}

#[test]
fn values_read_by_many_kernels_are_stored_not_recomputed() {
    let mut t = String::from("graph m(%0 x: f32[8]) {\n  %1 = exp(%0) : f32[8]\n");
    let k = MAX_RECOMPUTE + 1;
    for i in 0..k {
        t += &format!(
            "  %{} = sum(%1) {{dims=[0], keepdim=false}} : f32[]\n",
            2 + i
        );
    }
    let outs: Vec<String> = (0..k).map(|i| format!("%{}", 2 + i)).collect();
    t += &format!("  return {}\n}}\n", outs.join(", "));
    let (g, p) = plan(&t);
    assert!(p.stored[1], "{}", dump(&g, &p));
    // at the limit, it is recomputed
    let t2 = "graph m(%0 x: f32[8]) {\n  %1 = exp(%0) : f32[8]\n  %2 = sum(%1) {dims=[0], keepdim=false} : f32[]\n  return %2\n}\n";
    let (_, p2) = plan(t2);
    assert!(!p2.stored[1]);
}

const CONV_RELU: &str =
    "graph c(%0 x: f32[2,3,8,8], %1 w: f32[4,3,3,3], %2 b: f32[4], %3 r: f32[2,4,6,6]) {
  %4 = conv2d(%0, %1, %2) {dilation=[1], groups=1, padding=[0], stride=[1]} : f32[2,4,6,6]
  %5 = add(%4, %3) : f32[2,4,6,6]
  %6 = relu(%5) : f32[2,4,6,6]
  return %6
}
";

#[test]
fn conv_takes_a_pointwise_epilogue() {
    let (g, p) = plan(CONV_RELU);
    assert_eq!(
        names(&g, &p),
        ["conv2d+epilogue[add+relu]"],
        "{}",
        dump(&g, &p)
    );
}

#[test]
fn conv_read_twice_takes_no_epilogue() {
    let t = CONV_RELU.replace("return %6", "return %6, %4");
    let (g, p) = plan(&t);
    assert_eq!(names(&g, &p), ["conv2d", "fused[add+relu]"]);
}

#[test]
fn fused_dump_names_kernels_reads_and_types() {
    let (g, p) = plan(CONV_RELU);
    assert_eq!(
        dump(&g, &p),
        "kernel 0 extern: %4 = conv2d+epilogue[add+relu] (%0, %1, %2, %3) fuses [%5, %6] : f32[2,4,6,6]\n"
    );
}

#[test]
fn long_chains_read_twice_are_stored_not_recomputed_per_reader() {
    // c_t = c_{t-1} * a, h_t = exp(c_t): an RNN-like recurrence whose state is
    // pointwise across steps; each h_t would otherwise inline the whole chain
    let steps = 3 * MAX_INLINED_CHAIN;
    let mut t = String::from("graph r(%0 x: f32[8], %1 a: f32[8]) {\n");
    let (mut prev, mut id, mut outs) = (0, 2, vec![]);
    for _ in 0..steps {
        t += &format!("  %{id} = mul(%{prev}, %1) : f32[8]\n");
        t += &format!("  %{} = exp(%{id}) : f32[8]\n", id + 1);
        outs.push(format!("%{}", id + 1));
        prev = id;
        id += 2;
    }
    t += &format!("  return {}\n}}\n", outs.join(", "));
    let (g, p) = plan(&t);
    let biggest = p.kernels.iter().map(|k| k.fused.len()).max().unwrap();
    assert!(
        biggest <= MAX_INLINED_CHAIN + 2,
        "a kernel inlines {biggest} nodes"
    );
    let chain_stored = (0..steps).filter(|s| p.stored[2 + 2 * s]).count();
    assert!(chain_stored >= 2, "{}", dump(&g, &p));
    // a short chain is still recomputed
    assert!(!p.stored[2]);
}

#[test]
fn a_residual_stream_read_twice_is_stored_once_its_chain_reads_enough() {
    // x_k = x_{k-1} + a_k, each x_k read by a sum (a layer norm's moments)
    // and by the next add: recomputed, x_k would re-read x_0, a_1 .. a_k in
    // both readers and keep them all alive; stored, each is read once
    let blocks = 4;
    let mut t = String::from("graph r(%0 x: f32[4,8]");
    for k in 1..=blocks {
        t += &format!(", %{k} a{k}: f32[4,8]");
    }
    t += ") {
";
    let (mut prev, mut id, mut outs) = (0, blocks + 1, vec![]);
    for k in 1..=blocks {
        t += &format!("  %{id} = add(%{prev}, %{k}) : f32[4,8]\n");
        t += &format!(
            "  %{} = sum(%{id}) {{dims=[1], keepdim=true}} : f32[4,1]\n",
            id + 1
        );
        outs.push(format!("%{}", id + 1));
        prev = id;
        id += 2;
    }
    t += &format!("  return {}, %{prev}\n}}\n", outs.join(", "));
    let (g, p) = plan(&t);
    let x = |k: usize| blocks + 1 + 2 * (k - 1);
    // x_1 = x + a_1 reads 2 values: recomputed in both readers (2 * 2 reads
    // against 1 write + 2 + 2 reads stored)
    assert!(!p.stored[x(1)], "{}", dump(&g, &p));
    // x_2 would read x, a_1, a_2 in each of 2 readers: 6 reads against 6
    // stored, a tie, recomputed; x_3 (8 against 7 with x_2 inlined) stored
    assert!(!p.stored[x(2)], "{}", dump(&g, &p));
    assert!(p.stored[x(3)], "{}", dump(&g, &p));
}

/// An LSTM-like recurrence over `steps` steps: per step, gate values read
/// from a stored `[steps, 8]` input (views), `c_t = f * c_{t-1} + i * g`
/// and `h_t = o * tanh(c_t)`, each `h_t` a graph output (read by a view),
/// `c_n` too.
fn lstm_like(steps: usize) -> String {
    let mut t = String::from("graph l(%0 gates: f32[4,8], %1 c0: f32[8]) {\n");
    let (mut c, mut id, mut outs) = (1, 2, vec![]);
    for _ in 0..steps {
        let gate = |t: &mut String, id: &mut usize, k: usize, f: &str| {
            *t += &format!("  %{id} = select(%0) {{dim=0, index={k}}} : f32[8]\n");
            *t += &format!("  %{} = {f}(%{id}) : f32[8]\n", *id + 1);
            *id += 2;
            *id - 1
        };
        let i = gate(&mut t, &mut id, 0, "sigmoid");
        let f = gate(&mut t, &mut id, 1, "sigmoid");
        let g = gate(&mut t, &mut id, 2, "tanh");
        let o = gate(&mut t, &mut id, 3, "sigmoid");
        t += &format!("  %{id} = mul(%{f}, %{c}) : f32[8]\n");
        t += &format!("  %{} = mul(%{i}, %{g}) : f32[8]\n", id + 1);
        t += &format!("  %{} = add(%{id}, %{}) : f32[8]\n", id + 2, id + 1);
        c = id + 2;
        t += &format!("  %{} = tanh(%{c}) : f32[8]\n", id + 3);
        t += &format!("  %{} = mul(%{o}, %{}) : f32[8]\n", id + 4, id + 3);
        t += &format!(
            "  %{} = view(%{}) {{shape=[1,8]}} : f32[1,8]\n",
            id + 5,
            id + 4
        );
        outs.push(format!("%{}", id + 5));
        id += 6;
    }
    outs.push(format!("%{c}"));
    t += &format!("  return {}\n}}\n", outs.join(", "));
    t
}

#[test]
fn a_value_needed_by_later_kernels_is_stored_by_its_readers_kernel() {
    // c_t is read by h_t and by the next step: stored by h_t's kernel, so
    // each step is one kernel of the same size storing (c_t, h_t)
    let steps = 6;
    let (g, p) = plan(&lstm_like(steps));
    let d = dump(&g, &p);
    assert_eq!(p.launches(), steps, "{d}");
    for k in &p.kernels {
        assert_eq!(k.kind, KernelKind::Pointwise, "{d}");
        assert_eq!(k.also.len(), 1, "{d}");
        assert_eq!(k.fused.len(), p.kernels[0].fused.len(), "{d}");
        assert!(p.stored[k.also[0].index()]);
    }
    assert!(names(&g, &p)[0].ends_with("stores 2"), "{d}");
}

#[test]
fn a_stored_value_joins_its_pointwise_reader_of_the_same_shape() {
    let (g, p) = plan(
        "graph s(%0 x: f32[4,8], %1 y: f32[4,8]) {
  %2 = exp(%0) : f32[4,8]
  %3 = mul(%2, %1) : f32[4,8]
  return %2, %3
}
",
    );
    assert_eq!(
        dump(&g, &p),
        "kernel 0 pointwise: %2, %3 = fused[exp+mul] stores 2 (%0, %1) fuses [%2, %3] : f32[4,8], f32[4,8]\n"
    );
    // a reader of another shape keeps its own kernel
    let (g, p) = plan(
        "graph s(%0 x: f32[4,8], %1 y: f32[8]) {
  %2 = exp(%1) : f32[8]
  %3 = add(%0, %2) : f32[4,8]
  return %2, %3
}
",
    );
    assert_eq!(names(&g, &p), ["exp", "add"]);
}

#[test]
fn a_group_is_not_formed_where_a_reader_would_wait_for_it() {
    // the sum reads exp before the division could store both: a cycle
    let (g, p) = plan(
        "graph s(%0 x: f32[4,8]) {
  %1 = exp(%0) : f32[4,8]
  %2 = sum(%1) {dims=[1], keepdim=true} : f32[4,1]
  %3 = div(%1, %2) : f32[4,8]
  return %1, %3
}
",
    );
    assert_eq!(names(&g, &p), ["exp", "sum", "div"], "{}", dump(&g, &p));
    assert!(p.kernels.iter().all(|k| k.also.is_empty()));
    // the same through an inlined reader: the sum inlines exp(x * y), so
    // x * y may not be stored by the kernel that runs after the sum
    let (g, p) = plan(
        "graph s(%0 x: f32[4,8], %1 y: f32[4,8]) {
  %2 = mul(%0, %1) : f32[4,8]
  %3 = exp(%2) : f32[4,8]
  %4 = sum(%3) {dims=[1], keepdim=true} : f32[4,1]
  %5 = div(%3, %4) : f32[4,8]
  %6 = add(%5, %2) : f32[4,8]
  return %6
}
",
    );
    assert!(!p.stored[2], "{}", dump(&g, &p));
    assert_eq!(names(&g, &p), ["sum[mul+exp]", "fused[mul+exp+div+add]"]);
}

#[test]
fn a_cheap_value_is_recomputed_rather_than_stored_twice() {
    // storing exp(x) for the sum would write as much as the sum saves reading
    let (g, p) = plan(
        "graph s(%0 x: f32[4,8]) {
  %1 = exp(%0) : f32[4,8]
  %2 = neg(%1) : f32[4,8]
  %3 = sum(%1) {dims=[1], keepdim=false} : f32[4]
  return %2, %3
}
",
    );
    assert_eq!(names(&g, &p), ["fused[exp+neg]", "sum[exp]"]);
    assert!(!p.stored[1]);
}

#[test]
fn grouping_can_be_refused_per_node() {
    let g = decompose_composites(&Graph::parse(&lstm_like(3)).unwrap()).unwrap();
    let p = plan_fusion_with(&g, &|_| false);
    assert!(p.kernels.iter().all(|k| k.also.is_empty()));
    assert_eq!(p, plan_fusion_with(&g, &|_| false));
    assert!(p.launches() > 3, "{}", dump(&g, &p));
}
