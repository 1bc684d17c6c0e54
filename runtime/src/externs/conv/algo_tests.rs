//! Every conv algorithm against im2col and the definition on random shapes,
//! the algorithm cache's round trip (memory and disk, a corrupt file), and
//! packed weights following the weight's version.

use super::super::testutil::{assert_close, Lcg};
use super::select::{self, disk, ConvAlgo};
use super::*;
use crate::externs::packed::{packed_or_insert, WeightKey};
use kiln_ir::op::conv::{conv_geometry, ConvParams, Padding};
use std::sync::Arc;

/// The geometry of `input` * `weight` with `(stride, padding, dilation, groups)`.
fn geometry(
    input: &[usize],
    weight: &[usize],
    (stride, padding, dilation, groups): (usize, Vec<usize>, usize, usize),
) -> ConvGeometry {
    let p = ConvParams {
        stride: vec![stride],
        padding: Padding::Explicit(padding),
        dilation: vec![dilation],
        groups,
    };
    conv_geometry("conv2d", input, weight, Some(&[weight[0]]), &p).unwrap()
}

/// `algo`'s output for random operands of `g`.
fn run<T: Elem>(algo: ConvAlgo, g: &ConvGeometry, seed: u64) -> Vec<T> {
    let mut r = Lcg(seed);
    let x: Vec<T> = r.vec(g.n * g.c_in * g.in_size[0] * g.in_size[1]);
    let w: Vec<T> = r.vec(g.c_out * g.c_in_per_group() * g.kernel[0] * g.kernel[1]);
    let b: Vec<T> = r.vec(g.c_out);
    let mut out = vec![T::from_f64(f64::NAN); g.n * g.c_out * g.out_size[0] * g.out_size[1]];
    let used = select::with_algorithm(algo, || {
        conv2d_call(g, &x, &w, Some(&b), &mut out, ConvCall::default()).unwrap()
    });
    assert_eq!(used, algo, "{g:?}: forced {algo:?}, ran {used:?}");
    out
}

/// Shapes covering stride, padding (asymmetric too), dilation, groups, odd
/// sizes and batch 1.
fn shapes() -> Vec<ConvGeometry> {
    vec![
        geometry(&[1, 3, 7, 9], &[5, 3, 3, 3], (1, vec![1], 1, 1)),
        geometry(&[2, 4, 6, 6], &[4, 4, 3, 3], (1, vec![0], 1, 1)),
        geometry(&[2, 5, 11, 5], &[3, 5, 3, 3], (1, vec![2, 0], 1, 1)),
        geometry(&[3, 2, 1, 5], &[2, 2, 3, 3], (1, vec![1], 1, 1)),
        geometry(&[1, 6, 9, 8], &[6, 3, 3, 3], (1, vec![1], 1, 2)),
        geometry(&[2, 4, 9, 9], &[4, 1, 3, 3], (1, vec![1], 1, 4)),
        geometry(&[2, 4, 9, 9], &[8, 1, 3, 3], (2, vec![1], 2, 4)),
        geometry(&[2, 3, 10, 7], &[4, 3, 3, 3], (2, vec![1], 1, 1)),
        geometry(&[1, 3, 12, 12], &[2, 3, 3, 3], (1, vec![2], 2, 1)),
        geometry(&[2, 8, 5, 5], &[16, 8, 1, 1], (1, vec![0], 1, 1)),
        geometry(&[1, 16, 30, 29], &[24, 16, 3, 3], (1, vec![1], 1, 1)),
        geometry(&[1, 2, 2, 2], &[3, 2, 3, 3], (1, vec![1], 1, 1)),
        geometry(&[5, 1, 8, 8], &[8, 1, 3, 3], (1, vec![1], 1, 1)),
        geometry(&[7, 8, 8, 8], &[16, 8, 3, 3], (2, vec![1], 1, 1)),
        geometry(&[4, 6, 5, 7], &[6, 3, 3, 2], (1, vec![1, 0], 1, 2)),
        // several work items and weight panels, partial tiles, 7x7 stride 2
        geometry(&[2, 20, 23, 37], &[13, 20, 3, 3], (1, vec![1], 1, 1)),
        geometry(&[3, 3, 29, 31], &[8, 3, 7, 7], (2, vec![3], 1, 1)),
        geometry(&[2, 12, 9, 9], &[40, 12, 1, 1], (2, vec![0], 1, 1)),
        geometry(&[1, 9, 17, 12], &[7, 9, 3, 3], (3, vec![2, 1], 2, 1)),
        // depthwise: channels past a vector's sixteen, 5x5 on a 7x7 plane,
        // stride 2 with uneven padding, dilation
        geometry(&[2, 20, 7, 7], &[20, 1, 5, 5], (1, vec![2], 1, 20)),
        geometry(&[1, 33, 14, 13], &[33, 1, 5, 5], (2, vec![2, 1], 1, 33)),
        geometry(&[3, 17, 9, 10], &[17, 1, 3, 3], (1, vec![2], 2, 17)),
        // stems: sixteen output channels and more, rows of 16 and more
        geometry(&[2, 3, 30, 37], &[20, 3, 3, 3], (2, vec![1], 1, 1)),
        geometry(&[1, 3, 40, 40], &[16, 3, 3, 3], (2, vec![1], 1, 1)),
    ]
}

#[test]
fn depthwise_channels_gives_the_plane_kernels_bits() {
    // the same bias-then-taps fused multiply-adds in the same order
    for (i, g) in shapes().iter().enumerate() {
        if !ConvAlgo::DepthwiseChannels.applies(g) {
            continue;
        }
        let want = run::<f32>(ConvAlgo::Depthwise, g, i as u64);
        let got = run::<f32>(ConvAlgo::DepthwiseChannels, g, i as u64);
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{g:?}: depthwise-channels differs from depthwise-direct"
        );
    }
}

#[test]
fn every_algorithm_matches_im2col_on_random_shapes() {
    let mut ran = std::collections::HashMap::new();
    for (i, g) in shapes().iter().enumerate() {
        let want64 = run::<f64>(ConvAlgo::Im2colGemm, g, i as u64);
        let want32 = run::<f32>(ConvAlgo::Im2colGemm, g, i as u64);
        for algo in ConvAlgo::ALL {
            if !algo.applies(g) || algo == ConvAlgo::Im2colGemm {
                continue;
            }
            *ran.entry(algo).or_insert(0) += 1;
            let got = run::<f64>(algo, g, i as u64);
            assert_close(&got, &want64, 1e-12, &format!("{algo:?} f64 {g:?}"));
            let got = run::<f32>(algo, g, i as u64);
            assert_close(&got, &want32, 1e-5, &format!("{algo:?} f32 {g:?}"));
        }
    }
    // each algorithm met several shapes (the list is not vacuous)
    for algo in ConvAlgo::ALL
        .into_iter()
        .filter(|&a| a != ConvAlgo::Im2colGemm)
    {
        assert!(
            ran.get(&algo).copied().unwrap_or(0) >= 1,
            "{algo:?} never ran"
        );
    }
    assert!(ran[&ConvAlgo::WinogradF2x2] >= 5);
    assert!(ran[&ConvAlgo::DepthwiseChannels] >= 4);
    assert!(ran[&ConvAlgo::DirectChannels] >= 8);
    assert!(ran[&ConvAlgo::Direct] >= 12);
}

#[test]
fn every_algorithm_calls_the_epilogue_on_every_output_element_once() {
    for (i, g) in shapes().iter().enumerate() {
        for algo in ConvAlgo::ALL.into_iter().filter(|a| a.applies(g)) {
            let mut r = Lcg(i as u64);
            let x: Vec<f32> = r.vec(g.n * g.c_in * g.in_size[0] * g.in_size[1]);
            let w: Vec<f32> = r.vec(g.c_out * g.c_in_per_group() * g.kernel[0] * g.kernel[1]);
            let mut out = vec![0.0f32; g.n * g.c_out * g.out_size[0] * g.out_size[1]];
            let seen = std::sync::Mutex::new(vec![0u8; out.len()]);
            let p = g.out_size[0] * g.out_size[1];
            let ep = |t: Tile| {
                let mut s = seen.lock().unwrap();
                for c in t.c0..t.c0 + t.channels {
                    for q in t.p0..t.p0 + t.cols {
                        s[(t.n * g.c_out + c) * p + q] += 1;
                    }
                }
            };
            let call = ConvCall {
                epilogue: Some(&ep),
                weight_key: None,
            };
            select::with_algorithm(algo, || {
                conv2d_call(g, &x, &w, None, &mut out, call).unwrap()
            });
            let seen = seen.into_inner().unwrap();
            assert!(seen.iter().all(|&n| n == 1), "{algo:?} {g:?}: {seen:?}");
        }
    }
}

/// Which candidates [`select::fastest`] ran, in order, and its pick, when
/// the n-th run of each takes `secs[algo][n]`.
fn ranked(secs: &[(ConvAlgo, &[f64])]) -> (Vec<ConvAlgo>, ConvAlgo) {
    let cands: Vec<ConvAlgo> = secs.iter().map(|s| s.0).collect();
    let mut ran = vec![];
    let pick = select::fastest(&cands, |a| {
        let runs = ran.iter().filter(|&&r| r == a).count();
        ran.push(a);
        secs.iter().find(|s| s.0 == a).unwrap().1[runs]
    });
    (ran, pick)
}

#[test]
fn timing_reruns_only_close_candidates_and_keeps_each_ones_fastest_run() {
    use ConvAlgo::{Direct, Im2colGemm, WinogradF2x2};
    // im2col and direct within 1.5x of each other run again (the leader,
    // im2col, last), Winograd at 3x does not; direct's second run (a burst of
    // preemption undone) leads, then both, within 1.2x, run twice more, the
    // leader last each time, and im2col's third run overturns it
    let (ran, pick) = ranked(&[
        (Im2colGemm, &[1.0, 0.95, 0.85, 0.99]),
        (Direct, &[1.4, 0.9, 0.92, 0.93]),
        (WinogradF2x2, &[3.0]),
    ]);
    assert_eq!(
        ran,
        [
            Im2colGemm,
            Direct,
            WinogradF2x2,
            Direct,
            Im2colGemm,
            Im2colGemm,
            Direct,
            Direct,
            Im2colGemm
        ]
    );
    assert_eq!(pick, Im2colGemm);
    // beyond 1.2x after the second round, nothing runs again
    let (ran, pick) = ranked(&[(Im2colGemm, &[1.2, 1.3]), (Direct, &[1.4, 0.9])]);
    assert_eq!(ran, [Im2colGemm, Direct, Direct, Im2colGemm]);
    assert_eq!(pick, Direct);
    // a lone leader is not re-timed: nothing could overtake it; the first
    // candidate, which ran cold, runs once more, and wins when its first run
    // was the cold start's
    let (ran, pick) = ranked(&[(Im2colGemm, &[2.6, 2.4]), (WinogradF2x2, &[1.5])]);
    assert_eq!(ran, [Im2colGemm, WinogradF2x2, Im2colGemm]);
    assert_eq!(pick, WinogradF2x2);
    let (ran, pick) = ranked(&[(Im2colGemm, &[2.6, 1.2]), (WinogradF2x2, &[1.5])]);
    assert_eq!(ran, [Im2colGemm, WinogradF2x2, Im2colGemm]);
    assert_eq!(pick, Im2colGemm);
    // a first candidate that leads runs again only beside close ones
    let (ran, pick) = ranked(&[(Im2colGemm, &[1.0]), (WinogradF2x2, &[2.0])]);
    assert_eq!(ran, [Im2colGemm, WinogradF2x2]);
    assert_eq!(pick, Im2colGemm);
}

#[test]
fn the_algorithm_cache_round_trips_through_memory_and_disk() {
    let dir = std::env::temp_dir().join(format!("kiln-conv-select-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // only this test reads the cache dir in this binary
    std::env::set_var("KILN_CACHE_DIR", &dir);
    select::forget_in_memory();
    let g = geometry(&[1, 16, 30, 29], &[24, 16, 3, 3], (1, vec![1], 1, 1));
    let key = select::key(&g, "f32");
    assert!(key.contains("avx2") || key.contains("scalar") || key.contains("avx512"));
    assert_eq!(
        select::describe(&g, "f32"),
        select::Chosen::Heuristic(ConvAlgo::Im2colGemm)
    );
    let mut r = Lcg(9);
    let x: Vec<f32> = r.vec(16 * 30 * 29);
    let w: Vec<f32> = r.vec(24 * 16 * 9);
    let mut out = vec![0.0f32; 24 * 30 * 29];
    let timed = {
        let _scope = select::compiled_scope();
        assert!(select::benchmark_enabled());
        conv2d_call(&g, &x, &w, None, &mut out, ConvCall::default()).unwrap()
    };
    assert!(!select::benchmark_enabled(), "the scope ended");
    assert_eq!(select::describe(&g, "f32"), select::Chosen::Timed(timed));
    // the timed call's output is the conv's, whether the chosen algorithm
    // ran once more or its last timed run (the whole batch here) stood
    let mut want = vec![0.0f32; out.len()];
    select::with_algorithm(ConvAlgo::Im2colGemm, || {
        conv2d_call(&g, &x, &w, None, &mut want, ConvCall::default()).unwrap()
    });
    assert_close(&out, &want, 1e-5, "the timed call");
    // timed on two of three samples: the chosen algorithm runs on the batch
    let g3 = geometry(&[3, 2, 48, 48], &[4, 2, 3, 3], (1, vec![0], 1, 1));
    let x3: Vec<f32> = r.vec(3 * 2 * 48 * 48);
    let w3: Vec<f32> = r.vec(4 * 2 * 9);
    let (mut got3, mut want3) = (
        vec![f32::NAN; 3 * 4 * 46 * 46],
        vec![0.0f32; 3 * 4 * 46 * 46],
    );
    {
        let _scope = select::compiled_scope();
        conv2d_call(&g3, &x3, &w3, None, &mut got3, ConvCall::default()).unwrap();
    }
    select::with_algorithm(ConvAlgo::Im2colGemm, || {
        conv2d_call(&g3, &x3, &w3, None, &mut want3, ConvCall::default()).unwrap()
    });
    assert_close(&got3, &want3, 1e-5, "a conv timed on a sub-batch");
    // the file holds it; a fresh process (memory forgotten) reads it back
    let path = disk::path().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(disk::parse(&text).unwrap().get(&key), Some(&timed));
    select::forget_in_memory();
    assert_eq!(select::describe(&g, "f32"), select::Chosen::Timed(timed));
    // an older kiln's file is not used: its rankings are stale
    std::fs::write(
        &path,
        format!("kiln conv algorithms v8\n{key}\tdirect-packed\n"),
    )
    .unwrap();
    select::forget_in_memory();
    assert_eq!(
        select::describe(&g, "f32"),
        select::Chosen::Heuristic(ConvAlgo::Im2colGemm)
    );
    // a corrupt file: a warning, the heuristic, and a re-timed valid file
    std::fs::write(&path, format!("{}\nno tab here\n", disk::HEADER)).unwrap();
    select::forget_in_memory();
    assert_eq!(
        select::describe(&g, "f32"),
        select::Chosen::Heuristic(ConvAlgo::Im2colGemm)
    );
    let again = {
        let _scope = select::compiled_scope();
        conv2d_call(&g, &x, &w, None, &mut out, ConvCall::default()).unwrap()
    };
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(disk::parse(&text).unwrap().get(&key), Some(&again));
    assert!(disk::parse("garbage").is_err());
    assert!(disk::parse(&format!("{}\nk\tno-such-algo\n", disk::HEADER)).is_err());
    select::forget_in_memory();
    std::env::remove_var("KILN_CACHE_DIR");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn packed_weights_follow_the_version_and_the_storage() {
    let st = Arc::new(crate::Storage::zeros(kiln_ir::DType::F32, 8));
    let packs = std::cell::Cell::new(0);
    let pack = || {
        packs.set(packs.get() + 1);
        vec![packs.get() as f32]
    };
    let key = |v| WeightKey {
        storage: &st,
        offset: 0,
        dims: &[8],
        version: v,
    };
    let a = packed_or_insert(Some(key(0)), "test", pack);
    let b = packed_or_insert(Some(key(0)), "test", pack);
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(packs.get(), 1);
    // an in-place change bumps the version: packed again
    let c = packed_or_insert(Some(key(1)), "test", pack);
    assert_eq!((packs.get(), c[0]), (2, 2.0));
    // another view of the same storage is another weight
    let other = WeightKey {
        dims: &[2, 4],
        ..key(1)
    };
    packed_or_insert(Some(other), "test", pack);
    assert_eq!(packs.get(), 3);
    // without a key nothing is remembered
    packed_or_insert::<f32>(None, "test", pack);
    packed_or_insert::<f32>(None, "test", pack);
    assert_eq!(packs.get(), 5);
}
