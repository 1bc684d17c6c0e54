use super::*;

fn mine(p: &Profile) -> Vec<(usize, &Event)> {
    let me = current_thread_id();
    p.events()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.tid == me)
        .collect()
}

fn spin(us: u64) {
    let t = Instant::now();
    while t.elapsed().as_micros() < us as u128 {
        std::hint::spin_loop();
    }
}

#[test]
fn scopes_nest_and_self_time_excludes_children() {
    let ((), p) = profile(|| {
        let _outer = scope("outer", Category::Op);
        spin(200);
        for _ in 0..3 {
            let _k = scope("inner", Category::Kernel)
                .shapes(|| vec![vec![2, 3]])
                .bytes(|| 24);
            spin(100);
        }
    });
    let ev = mine(&p);
    assert_eq!(ev.len(), 4);
    let (oi, outer) = ev[0];
    assert_eq!((outer.name.as_ref(), outer.depth), ("outer", 0));
    for &(i, e) in &ev[1..] {
        assert_eq!((e.name.as_ref(), e.depth), ("inner", 1));
        assert_eq!(p.parent(i), Some(oi));
        assert!(outer.start_ns <= e.start_ns && e.end_ns() <= outer.end_ns());
        assert_eq!((e.shapes.clone(), e.bytes), (vec![vec![2, 3]], 24));
    }
    let children: u64 = ev[1..].iter().map(|(_, e)| e.dur_ns).sum();
    assert_eq!(p.self_ns(oi), outer.dur_ns - children);
    assert!(p.self_ns(oi) >= 200_000);

    let rows = p.key_averages(false);
    let inner = rows.iter().find(|r| r.name == "inner").unwrap();
    assert_eq!((inner.calls, inner.bytes), (3, 72));
    let t = p.table(true);
    assert!(t.contains("inner") && t.contains("[[2, 3]]"), "{t}");
}

#[test]
fn nothing_is_recorded_when_off() {
    {
        let _no_session = lock(&SESSION); // other tests profile concurrently
        let s = scope("off", Category::Op).shapes(|| panic!("shapes computed while off"));
        assert!(!s.is_recording());
        let _n = scope_with(Category::Kernel, || -> String {
            panic!("name computed while off")
        });
    }
    // a guard opened before a session does not record into it
    let early = scope("early", Category::Op);
    let ((), p) = profile(|| drop(early));
    assert!(mine(&p).is_empty());
    // nor does one opened during a session and closed after it
    let p = Profiler::start();
    let late = scope("late", Category::Op);
    let prof = p.stop();
    drop(late);
    assert!(mine(&prof).is_empty());
    let ((), p) = profile(|| {});
    assert!(mine(&p).is_empty());
}

#[test]
fn sessions_collect_other_threads() {
    let ((), p) = profile(|| {
        std::thread::Builder::new()
            .name("helper".into())
            .spawn(|| {
                let _s = scope("on helper", Category::User);
            })
            .unwrap()
            .join()
            .unwrap();
    });
    let e = p.events().iter().find(|e| e.name == "on helper").unwrap();
    assert_ne!(e.tid, current_thread_id());
    assert!(p
        .threads()
        .iter()
        .any(|(t, n)| *t == e.tid && n == "helper"));
}

#[test]
fn table_is_sorted_by_total_and_trace_is_escaped() {
    let ((), recorded) = profile(|| {
        for name in ["short", "long", "mid \"q\""] {
            let _s = scope_with(Category::Op, || name.to_string());
        }
    });
    // the durations are set, not measured: a test thread preempted inside
    // one scope (other tests, the pool's spinning workers) would reorder them
    let mut events = recorded.events().to_vec();
    for e in &mut events {
        e.dur_ns = match e.name.as_ref() {
            "short" => 50_000,
            "long" => 400_000,
            _ => 150_000,
        };
    }
    let p = super::report::Profile::new(events, recorded.threads().to_vec(), recorded.wall_ns());
    let rows: Vec<_> = p
        .key_averages(false)
        .into_iter()
        .filter(|r| ["short", "long", "mid \"q\""].contains(&r.name.as_str()))
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["long", "mid \"q\"", "short"]);
    let t = p.table_top(false, 2);
    assert!(t.find("long").unwrap() < t.find("mid").unwrap(), "{t}");
    let j = p.chrome_trace_json();
    assert!(j.contains(r#""name":"mid \"q\"""#), "{j}");
    assert!(j.contains(r#""ph":"X""#) && j.contains(r#""ph":"M""#));
}

#[test]
fn fmt_ns_picks_a_unit() {
    assert_eq!(report::fmt_ns(1_500), "1.500us");
    assert_eq!(report::fmt_ns(2_500_000), "2.500ms");
    assert_eq!(report::fmt_ns(3_000_000_000), "3.000s");
}
