//! One case where each rule fires and one where it must not.

use super::rules;
use crate::rewrite::rules::testing::{fired, run};

/// A graph of inputs `ins` whose body `body` (lines `%n = ...`) ends in `%ret`.
fn graph(ins: &str, body: &str, ret: &str) -> String {
    format!("graph t({ins}) {{\n{body}\n  return {ret}\n}}\n")
}

/// Runs the algebra rules; checks whether `rule` fired; returns the result text.
fn check(rule: &str, text: &str, fires: bool) -> String {
    let (out, r) = run(rules(), text, &[]);
    let n = fired(&r, rule);
    assert_eq!(
        n > 0,
        fires,
        "{rule} fired {n} times on\n{text}\ngiving\n{out}\n{r}"
    );
    out
}

const X: &str = "%0 x: f32[2,3]";

#[test]
fn identities() {
    let one = "  %1 = constant() {value=1.0} : f32[]";
    for (rule, op) in [
        ("mul-one", "mul(%0, %1)"),
        ("mul-one-left", "mul(%1, %0)"),
        ("div-one", "div(%0, %1)"),
    ] {
        let out = check(
            rule,
            &graph(X, &format!("{one}\n  %2 = {op} : f32[2,3]"), "%2"),
            true,
        );
        assert_eq!(out, "graph t(%0 x: f32[2,3]) {\n  return %0\n}\n");
    }
    let zero = |v: &str, dt: &str| format!("  %1 = constant() {{value={v}}} : {dt}[]");
    check(
        "sub-zero",
        &graph(
            X,
            &format!("{}\n  %2 = sub(%0, %1) : f32[2,3]", zero("0.0", "f32")),
            "%2",
        ),
        true,
    );
    check(
        "add-zero",
        &graph(
            X,
            &format!("{}\n  %2 = add(%0, %1) : f32[2,3]", zero("-0.0", "f32")),
            "%2",
        ),
        true,
    );
    let xi = "%0 x: i32[4]";
    check(
        "add-zero",
        &graph(
            xi,
            &format!("{}\n  %2 = add(%0, %1) : i32[4]", zero("0", "i32")),
            "%2",
        ),
        true,
    );
    check(
        "add-zero-left",
        &graph(
            xi,
            &format!("{}\n  %2 = add(%1, %0) : i32[4]", zero("0", "i32")),
            "%2",
        ),
        true,
    );
    let scalar = |op: &str, rev: bool, v: &str| {
        graph(
            X,
            &format!("  %1 = {op}_scalar(%0) {{reversed={rev}, value={v}}} : f32[2,3]"),
            "%1",
        )
    };
    check("mul-scalar-one", &scalar("mul", true, "1"), true);
    check("div-scalar-one", &scalar("div", false, "1.0"), true);
    check("sub-scalar-zero", &scalar("sub", false, "0"), true);
    check("add-scalar-zero", &scalar("add", false, "-0.0"), true);
}

#[test]
fn identities_that_are_not_exact_or_change_the_type() {
    // i32 * 1.0 is f32; x[3] * ones[2,3] broadcasts
    let t = graph(
        "%0 x: i32[3]",
        "  %1 = constant() {value=1.0} : f32[]\n  %2 = mul(%0, %1) : f32[3]",
        "%2",
    );
    check("mul-one", &t, false);
    let t = graph(
        "%0 x: f32[3]",
        "  %1 = constant() {value=1.0} : f32[2,3]\n  %2 = mul(%1, %0) : f32[2,3]",
        "%2",
    );
    check("mul-one-left", &t, false);
    // integer true division is floating
    let t = graph(
        "%0 x: i64[3]",
        "  %1 = constant() {value=1} : i64[]\n  %2 = div(%0, %1) : f32[3]",
        "%2",
    );
    check("div-one", &t, false);
    // -0 - (-0) = +0 and -0 + 0 = +0: these keep x only for integers
    let t = graph(
        X,
        "  %1 = constant() {value=-0.0} : f32[]\n  %2 = sub(%0, %1) : f32[2,3]",
        "%2",
    );
    check("sub-zero", &t, false);
    let t = graph(
        X,
        "  %1 = constant() {value=0.0} : f32[]\n  %2 = add(%0, %1) : f32[2,3]",
        "%2",
    );
    check("add-zero", &t, false);
    let t = graph(
        X,
        "  %1 = constant() {value=0.0} : f32[]\n  %2 = add(%1, %0) : f32[2,3]",
        "%2",
    );
    check("add-zero-left", &t, false);
    let scalar = |op: &str, rev: bool, v: &str, out: &str| {
        graph(
            "%0 x: i64[2]",
            &format!("  %1 = {op}_scalar(%0) {{reversed={rev}, value={v}}} : {out}[2]"),
            "%1",
        )
    };
    check("mul-scalar-one", &scalar("mul", false, "1.0", "f32"), false);
    check("div-scalar-one", &scalar("div", true, "1", "f32"), false);
    check("sub-scalar-zero", &scalar("sub", true, "0", "i64"), false);
    let t = graph(
        X,
        "  %1 = add_scalar(%0) {reversed=false, value=0.0} : f32[2,3]",
        "%1",
    );
    check("add-scalar-zero", &t, false);
}

#[test]
fn involutions_and_idempotence() {
    let t = graph(
        X,
        "  %1 = neg(%0) : f32[2,3]\n  %2 = neg(%1) : f32[2,3]",
        "%2",
    );
    assert_eq!(
        check("neg-neg", &t, true),
        "graph t(%0 x: f32[2,3]) {\n  return %0\n}\n"
    );
    let t = graph(
        X,
        "  %1 = abs(%0) : f32[2,3]\n  %2 = neg(%1) : f32[2,3]",
        "%2",
    );
    check("neg-neg", &t, false);
    let t = graph(
        X,
        "  %1 = relu(%0) : f32[2,3]\n  %2 = relu(%1) : f32[2,3]",
        "%2",
    );
    assert_eq!(
        check("relu-relu", &t, true),
        "graph t(%0 x: f32[2,3]) {\n  %1 = relu(%0) : f32[2,3]\n  return %1\n}\n"
    );
    let t = graph(
        X,
        "  %1 = relu(%0) : f32[2,3]\n  %2 = neg(%1) : f32[2,3]\n  %3 = relu(%2) : f32[2,3]",
        "%3",
    );
    check("relu-relu", &t, false);
    check(
        "cast-id",
        &graph(X, "  %1 = cast(%0) {dtype=f32} : f32[2,3]", "%1"),
        true,
    );
    check(
        "cast-id",
        &graph(X, "  %1 = cast(%0) {dtype=f16} : f16[2,3]", "%1"),
        false,
    );
}

#[test]
fn permutes_compose() {
    let t = graph(
        X,
        "  %1 = permute(%0) {dims=[1,0]} : f32[3,2]\n  %2 = permute(%1) {dims=[1,0]} : f32[2,3]",
        "%2",
    );
    assert_eq!(
        check("permute-permute", &t, true),
        "graph t(%0 x: f32[2,3]) {\n  return %0\n}\n"
    );
    let t = graph(
        "%0 x: f32[2,3,4]",
        "  %1 = permute(%0) {dims=[1,2,0]} : f32[3,4,2]\n  %2 = permute(%1) {dims=[-2,2,0]} : f32[4,2,3]",
        "%2",
    );
    assert_eq!(
        check("permute-permute", &t, true),
        "graph t(%0 x: f32[2,3,4]) {\n  %1 = permute(%0) {dims=[2,0,1]} : f32[4,2,3]\n  return %1\n}\n"
    );
    let t = graph(
        X,
        "  %1 = permute(%0) {dims=[1,0]} : f32[3,2]\n  %2 = relu(%1) : f32[3,2]\n  %3 = permute(%2) {dims=[1,0]} : f32[2,3]",
        "%3",
    );
    check("permute-permute", &t, false);
    check(
        "permute-id",
        &graph(X, "  %1 = permute(%0) {dims=[0,-1]} : f32[2,3]", "%1"),
        true,
    );
    let square = graph(
        "%0 x: f32[3,3]",
        "  %1 = permute(%0) {dims=[1,0]} : f32[3,3]",
        "%1",
    );
    check("permute-id", &square, false);
}

#[test]
fn reshapes_and_broadcasts_collapse() {
    let t = graph(
        X,
        "  %1 = view(%0) {shape=[-1]} : f32[6]\n  %2 = view(%1) {shape=[3,2]} : f32[3,2]",
        "%2",
    );
    assert_eq!(
        check("view-view", &t, true),
        "graph t(%0 x: f32[2,3]) {\n  %1 = view(%0) {shape=[3,2]} : f32[3,2]\n  return %1\n}\n"
    );
    let t = graph(
        X,
        "  %1 = view(%0) {shape=[6]} : f32[6]\n  %2 = exp(%1) : f32[6]\n  %3 = view(%2) {shape=[3,2]} : f32[3,2]",
        "%3",
    );
    check("view-view", &t, false);
    check(
        "view-id",
        &graph(X, "  %1 = view(%0) {shape=[2,-1]} : f32[2,3]", "%1"),
        true,
    );
    check(
        "view-id",
        &graph(X, "  %1 = view(%0) {shape=[3,2]} : f32[3,2]", "%1"),
        false,
    );
    let t = graph(
        "%0 x: f32[3]",
        "  %1 = expand(%0) {size=[2,3]} : f32[2,3]\n  %2 = expand(%1) {size=[4,-1,-1]} : f32[4,2,3]",
        "%2",
    );
    assert_eq!(
        check("expand-expand", &t, true),
        "graph t(%0 x: f32[3]) {\n  %1 = expand(%0) {size=[4,2,3]} : f32[4,2,3]\n  return %1\n}\n"
    );
    let t = graph(
        "%0 x: f32[3]",
        "  %1 = expand(%0) {size=[2,3]} : f32[2,3]\n  %2 = neg(%1) : f32[2,3]\n  %3 = expand(%2) {size=[4,2,3]} : f32[4,2,3]",
        "%3",
    );
    check("expand-expand", &t, false);
    check(
        "expand-id",
        &graph(X, "  %1 = expand(%0) {size=[2,-1]} : f32[2,3]", "%1"),
        true,
    );
    check(
        "expand-id",
        &graph(
            "%0 x: f32[1,3]",
            "  %1 = expand(%0) {size=[2,3]} : f32[2,3]",
            "%1",
        ),
        false,
    );
}

#[test]
fn splat_constants_take_any_layout() {
    let c = "  %1 = constant() {value=2.0} : f32[1,3]";
    for (rule, op, ty) in [
        ("splat-view", "view(%1) {shape=[3]}", "f32[3]"),
        ("splat-expand", "expand(%1) {size=[2,3]}", "f32[2,3]"),
        ("splat-permute", "permute(%1) {dims=[1,0]}", "f32[3,1]"),
        (
            "splat-slice",
            "slice(%1) {dim=1, end=2, start=0, step=1}",
            "f32[1,2]",
        ),
        ("splat-select", "select(%1) {dim=0, index=0}", "f32[3]"),
    ] {
        let t = graph("", &format!("{c}\n  %2 = {op} : {ty}"), "%2");
        let out = check(rule, &t, true);
        assert_eq!(
            out,
            format!("graph t() {{\n  %0 = constant() {{value=2.0}} : {ty}\n  return %0\n}}\n")
        );
        // a constant listing its values keeps the layout op
        let listed = t.replace("value=2.0", "value=[1.0,2.0,3.0]");
        check(rule, &listed, false);
    }
}

#[test]
fn broadcast_ones_vanish_through_expand() {
    // expand(1.0) is a splat of the new shape, and x * 1 is x
    let t = graph(
        X,
        "  %1 = constant() {value=1.0} : f32[]\n  %2 = expand(%1) {size=[2,3]} : f32[2,3]\n  %3 = mul(%0, %2) : f32[2,3]",
        "%3",
    );
    let (out, r) = run(rules(), &t, &[]);
    assert_eq!(out, "graph t(%0 x: f32[2,3]) {\n  return %0\n}\n", "{r}");
    assert_eq!((fired(&r, "splat-expand"), fired(&r, "mul-one")), (1, 1));
}
