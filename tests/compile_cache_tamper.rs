//! The compile disk cache cannot lie, end to end: an entry edited on disk
//! (exp changed to neg, the finding of issue #19) is refused by its content
//! hash, recomputed, and the call returns the right values. (Own test
//! binary: the cache root is read from the environment once.)

use kiln::compile::{compile_fn, plan_cache_dir};
use kiln::{Result, Tensor};

fn f(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].exp()?.add(&t[0])?])
}

#[test]
fn an_edited_plan_on_disk_is_recomputed_not_trusted() {
    let root = std::env::temp_dir().join(format!("kiln-tamper-{}", std::process::id()));
    std::env::set_var("KILN_CACHE_DIR", &root);
    let x = kiln::bench::randn(&[16], 1);
    let want = f(std::slice::from_ref(&x)).unwrap()[0].to_f64_vec();
    compile_fn("tamper", f).call(&[x.clone()]).unwrap();
    let dir = plan_cache_dir().expect("a plan cache");
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|s| s.contains("exp")))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?} in {}", dir.display());
    let text = std::fs::read_to_string(&entries[0]).unwrap();
    std::fs::write(&entries[0], text.replace("exp", "neg")).unwrap();
    let c = compile_fn("tamper", f);
    let got = c.call(&[x.clone()]).unwrap()[0].to_f64_vec();
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
    let r = c.explain();
    assert!(
        !r.entries[0].times.from_disk_cache,
        "the edited plan was used: {r}"
    );
    // the entry was rewritten with the right plan: the next compile reads it
    let again = compile_fn("tamper", f);
    again.call(&[x]).unwrap();
    assert!(again.explain().entries[0].times.from_disk_cache);
    let _ = std::fs::remove_dir_all(&root);
}
