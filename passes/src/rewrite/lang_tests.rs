use super::*;
use crate::rewrite::{rewrite_with, RewriteConfig};
use egg::{Pattern, RecExpr};

/// The graph ir's own every-op test prints: every `Op` variant, constants
/// (splat, listed, inf/NaN, int and bool), multi-output ops and getitem.
fn every_op() -> Graph {
    let snap = include_str!(
        "../../../ir/tests/snapshots/graph_every_op__every_op_variant_round_trips.snap"
    );
    let text = snap.splitn(3, "---\n").nth(2).expect("an insta snapshot");
    Graph::parse(text).unwrap()
}

#[test]
fn every_op_round_trips_through_a_rec_expr() {
    let g = every_op();
    let (expr, outs) = to_rec_expr(&g).unwrap();
    assert_eq!(expr.len(), g.len());
    let back = from_rec_expr(&expr, &outs, &Signature::of(&g)).unwrap();
    back.verify().unwrap();
    assert_eq!(back, g);
    assert_eq!(back.to_text(), g.to_text());
}

#[test]
fn every_op_round_trips_through_an_egraph() {
    let g = every_op();
    let out = rewrite_with(&g, &RewriteConfig::default(), &[]).unwrap();
    let h = &out.graph;
    h.verify().unwrap();
    assert_eq!(
        Signature::of(h),
        Signature::of(&g),
        "inputs: names, types, order"
    );
    assert_eq!(h.inputs(), g.inputs(), "input ids");
    let types = |g: &Graph| -> Vec<Meta> {
        g.outputs()
            .iter()
            .map(|&o| g.meta(o).unwrap().clone())
            .collect()
    };
    assert_eq!(types(h), types(&g));
    // every node of the fixture is used, and no two are the same, so nothing is lost
    assert_eq!(h.len(), g.len());
    let ops = |g: &Graph| -> Vec<String> {
        let mut v: Vec<String> = g
            .nodes()
            .iter()
            .map(|n| format!("{:?} {:?}", n.op, n.metas))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ops(h), ops(&g));
    // deterministic, and a fixpoint
    let again = rewrite_with(&g, &RewriteConfig::default(), &[]).unwrap();
    assert_eq!(again.graph.to_text(), h.to_text());
    let twice = rewrite_with(h, &RewriteConfig::default(), &[]).unwrap();
    assert_eq!(twice.graph.to_text(), h.to_text());
}

#[test]
fn a_graph_prints_as_an_s_expression() {
    let g = Graph::parse(
        "graph g(%0 x: f32[2,3], %1 w: f32[3]) {
           %2 = permute(%0) {dims=[1,0]} : f32[3,2]
           %3 = constant() {value=0.5} : f32[]
           %4 = mul_scalar(%1) {reversed=false, value=2.0} : f32[3]
           %5 = view(%4) {shape=[3,1]} : f32[3,1]
           %6 = mul(%2, %5) : f32[3,2]
           %7 = add(%6, %3) : f32[3,2]
           return %7
         }",
    )
    .unwrap();
    let (expr, outs) = to_rec_expr(&g).unwrap();
    assert_eq!(outs, [Id::from(7)]);
    assert_eq!(
        expr.to_string(),
        "(add (mul (permute<dims=[1,0]> input<0>) (view<shape=[3,1]> \
         (mul_scalar<reversed=false,value=2.0> input<1>))) constant<f32[]=0.5>)"
    );
    // the printed form parses back to the same e-nodes (in tree post-order)
    let parsed: RecExpr<KilnLang> = expr.to_string().parse().unwrap();
    assert_eq!(parsed.to_string(), expr.to_string());
    let back = from_rec_expr(&parsed, &[Id::from(parsed.len() - 1)], &Signature::of(&g)).unwrap();
    back.verify().unwrap();
    assert_eq!(back.len(), g.len());
    assert_eq!(
        back.meta(back.outputs()[0]).unwrap(),
        g.meta(g.outputs()[0]).unwrap()
    );
}

#[test]
fn patterns_read_like_the_ir() {
    for p in [
        "(relu (relu ?x))",
        "(permute<dims=[1,0]> ?x)",
        "(permute<*> (permute<*> ?x))",
        "(add ?x constant<f32[2]=[1.0,-0.0]>)",
        "(getitem<index=1> (max_pool2d<ceil_mode=false,dilation=[1,1],kernel_size=[2,2],padding=[0,0],stride=[2,2]> ?x))",
        "(cast<dtype=f16> input<3>)",
        "(conv2d<dilation=[1],groups=1,padding=same,stride=[1]> ?x ?w ?b)",
    ] {
        let pat: Pattern<KilnLang> = p.parse().unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(pat.to_string(), p);
    }
    for (bad, why) in [
        ("(relux ?x)", "unknown op 'relux'"),
        ("(relu ?x ?y)", "'relu' takes 1..=1 operands, got 2"),
        ("(permute ?x)", "missing attribute 'dims'"),
        (
            "(permute<dims=[1,0],size=[2]> ?x)",
            "unknown attribute 'size'",
        ),
        (
            "constant<f32[2]=[1.0,2.0,3.0]>",
            "3 values for a f32[2] tensor",
        ),
        ("(input<0> ?x)", "'input<0>' takes no operands, got 1"),
    ] {
        let e = bad.parse::<Pattern<KilnLang>>().unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn wildcards_match_any_attributes_of_one_op() {
    let node = |s: &str| -> KilnLang {
        let e: RecExpr<KilnLang> = format!("({s} input<0>)").parse().unwrap();
        e[Id::from(1)].clone()
    };
    let wild = node("permute<*>");
    assert!(wild.matches(&node("permute<dims=[1,0]>")));
    assert!(wild.matches(&node("permute<dims=[0,1]>")));
    assert!(!wild.matches(&node("view<shape=[6]>")));
    assert!(!node("permute<dims=[1,0]>").matches(&node("permute<dims=[0,1]>")));
    // ordered by name first, so one op's e-nodes sit together in a class
    assert!(node("permute<dims=[1,0]>") < node("relu"));
    assert!(node("exp") < node("permute<dims=[1,0]>"));
}

#[test]
fn every_op_survives_every_rule() {
    let g = every_op();
    let params = g.inputs()[1..].iter().copied().collect();
    let cfg = RewriteConfig {
        params,
        ..RewriteConfig::default()
    };
    let out = crate::rewrite::rewrite(&g, &cfg).unwrap();
    assert_eq!(out.report.stop_reason, "Saturated", "{}", out.report);
    out.graph.verify().unwrap();
    assert_eq!(Signature::of(&out.graph), Signature::of(&g));
    let again = crate::rewrite::rewrite(&g, &cfg).unwrap();
    assert_eq!(again.graph.to_text(), out.graph.to_text());
}
