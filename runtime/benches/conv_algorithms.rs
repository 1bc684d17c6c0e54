//! Times every conv algorithm that applies on ResNet-18's and MobileNetV3's (small and large)
//! conv shapes (batch 8, 224x224), forcing each in turn, and prints the
//! fastest run of each (min over the repeats: the machine may be shared)
//! with its GFLOP/s. Each weight is packed once, as a model's parameter is
//! (the packing is not timed). `cargo bench --workspace --bench conv_algorithms [-- REPEATS]`
//! (`-- --depthwise`, `-- --1x1`: the grouped or the 1x1 convs only);
//! `RAYON_NUM_THREADS=1` gives per-core figures, and with `--cpu-time` the
//! process's CPU time is what counts (on a machine busy with other work,
//! wall time measures the scheduler, CPU time still measures the kernel).

use kiln_ir::op::conv::{conv_geometry, ConvGeometry, ConvParams, Padding};
use kiln_runtime::externs::conv::select::{self, ConvAlgo};
use kiln_runtime::externs::conv::{conv2d_call, ConvCall};
use kiln_runtime::externs::packed::WeightKey;
use kiln_runtime::Storage;
use std::sync::Arc;
use std::time::Instant;

/// Seconds of CPU time this process has used (Linux), or `None`.
fn cpu_seconds() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        }
        const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
        let mut t = Timespec { sec: 0, nsec: 0 };
        // SAFETY: a valid out-pointer for the libc call.
        if unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0 {
            return Some(t.sec as f64 + t.nsec as f64 * 1e-9);
        }
    }
    None
}

/// `(input, weight, stride, pad, groups)` of the benchmarked convs.
fn shapes() -> Vec<([usize; 4], [usize; 4], usize, usize, usize)> {
    vec![
        ([8, 3, 224, 224], [64, 3, 7, 7], 2, 3, 1),
        ([8, 64, 56, 56], [64, 64, 3, 3], 1, 1, 1),
        ([8, 64, 56, 56], [128, 64, 3, 3], 2, 1, 1),
        ([8, 64, 56, 56], [128, 64, 1, 1], 2, 0, 1),
        ([8, 128, 28, 28], [128, 128, 3, 3], 1, 1, 1),
        ([8, 128, 28, 28], [256, 128, 3, 3], 2, 1, 1),
        ([8, 256, 14, 14], [256, 256, 3, 3], 1, 1, 1),
        ([8, 256, 14, 14], [512, 256, 3, 3], 2, 1, 1),
        ([8, 512, 7, 7], [512, 512, 3, 3], 1, 1, 1),
        ([8, 16, 56, 56], [72, 16, 1, 1], 1, 0, 1),
        ([8, 96, 7, 7], [576, 96, 1, 1], 1, 0, 1),
        ([8, 288, 14, 14], [288, 1, 5, 5], 2, 2, 288),
        ([8, 3, 224, 224], [16, 3, 3, 3], 2, 1, 1),
        ([8, 16, 112, 112], [16, 1, 3, 3], 2, 1, 16),
        ([8, 72, 56, 56], [72, 1, 3, 3], 2, 1, 72),
        // MobileNetV3-Large
        ([8, 672, 14, 14], [672, 1, 3, 3], 1, 1, 672),
        ([8, 120, 28, 28], [120, 1, 5, 5], 1, 2, 120),
        ([8, 160, 7, 7], [960, 160, 1, 1], 1, 0, 1),
        ([8, 480, 14, 14], [112, 480, 1, 1], 1, 0, 1),
        ([8, 24, 56, 56], [72, 24, 1, 1], 1, 0, 1),
        ([8, 16, 112, 112], [64, 16, 1, 1], 1, 0, 1),
        ([8, 16, 112, 112], [16, 16, 1, 1], 1, 0, 1),
        ([8, 112, 14, 14], [672, 112, 1, 1], 1, 0, 1),
        ([8, 64, 112, 112], [64, 1, 3, 3], 2, 1, 64),
        ([8, 72, 56, 56], [72, 1, 5, 5], 2, 2, 72),
        ([8, 480, 14, 14], [480, 1, 3, 3], 1, 1, 480),
        ([8, 960, 7, 7], [960, 1, 5, 5], 1, 2, 960),
    ]
}

fn geometry(
    x: &[usize; 4],
    w: &[usize; 4],
    stride: usize,
    pad: usize,
    groups: usize,
) -> ConvGeometry {
    let p = ConvParams {
        stride: vec![stride],
        padding: Padding::Explicit(vec![pad]),
        dilation: vec![1],
        groups,
    };
    conv_geometry("conv2d", x, w, None, &p).expect("a valid conv")
}

fn main() {
    let repeats: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    let cpu = std::env::args().any(|a| a == "--cpu-time") && cpu_seconds().is_some();
    let depthwise_only = std::env::args().any(|a| a == "--depthwise");
    let pointwise_only = std::env::args().any(|a| a == "--1x1");
    println!(
        "threads {} isa {} timing {}",
        rayon::current_num_threads(),
        kiln_runtime::externs::cpu_isa::detect().name(),
        if cpu { "cpu time" } else { "wall time" }
    );
    for (x, w, s, p, groups) in shapes() {
        if (depthwise_only && groups == 1) || (pointwise_only && w[2..] != [1, 1]) {
            continue;
        }
        let g = geometry(&x, &w, s, p, groups);
        let input = vec![0.5f32; x.iter().product()];
        let weight: Vec<f32> = (0..w.iter().product::<usize>())
            .map(|i| ((i % 7) as f32 - 3.0) * 0.01)
            .collect();
        let mut out = vec![0.0f32; g.n * g.c_out * g.out_size[0] * g.out_size[1]];
        // only identifies the weight to the packed-weight cache
        let storage = Arc::new(Storage::zeros(kiln_ir::DType::F32, weight.len()));
        let call = || ConvCall {
            weight_key: Some(WeightKey {
                storage: &storage,
                offset: 0,
                dims: &w,
                version: 0,
            }),
            ..ConvCall::default()
        };
        let flops = 2.0 * out.len() as f64 * (g.c_in_per_group() * w[2] * w[3]) as f64;
        let mut row = format!("{x:?} * {w:?} s{s}:");
        for algo in ConvAlgo::ALL.into_iter().filter(|a| a.applies(&g)) {
            let best = (0..=repeats)
                .map(|_| {
                    let (t, c) = (Instant::now(), cpu_seconds().unwrap_or(0.0));
                    select::with_algorithm(algo, || {
                        conv2d_call(&g, &input, &weight, None, &mut out, call()).expect("conv runs")
                    });
                    if cpu {
                        cpu_seconds().unwrap_or(0.0) - c
                    } else {
                        t.elapsed().as_secs_f64()
                    }
                })
                .skip(1) // the call that packs
                .fold(f64::INFINITY, f64::min);
            row += &format!(
                "  {} {:.2} ms ({:.0} GF/s)",
                algo.name(),
                best * 1e3,
                flops / best / 1e9
            );
        }
        println!("{row}");
    }
}
