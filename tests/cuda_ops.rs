//! Pooling, embedding, conv_transpose2d and bool gather on a CUDA device
//! (the emulator without a GPU), forward and backward: every one runs as
//! generated device kernels — `kiln::host_fallbacks()` does not grow — and
//! agrees with the CPU: values, max-pool indices (ties and NaN included)
//! and the gradients of the CPU leaves.

use kiln::functional as F;
use kiln::ir::op::conv::ConvTransposeParams;
use kiln::ir::op::pool::Pool2dParams;
use kiln::{DType, Device, Result, Tensor};

fn device() -> Option<Device> {
    if std::env::var("KILN_CUDA").as_deref() != Ok("driver") {
        let cxx = std::process::Command::new("c++").arg("--version").output();
        if cxx.is_err() {
            eprintln!("cuda-shim: no c++ compiler found, skipped");
            return None;
        }
        kiln::cuda::use_emulator();
    }
    Some(Device::cuda(0).unwrap_or_else(|e| panic!("{e}")))
}

/// Deterministic values in [-2, 2] rounded to halves, so windows hold ties.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 33) % 9) as f32 - 4.0) / 2.0
        })
        .collect()
}

fn leaf(dims: &[usize], seed: u64) -> Tensor {
    let v = values(dims.iter().product(), seed);
    Tensor::from_vec(v, dims).unwrap().requires_grad_(true)
}

/// Elements equal within `tol` (relative), NaN matching NaN.
fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * (1.0 + b.abs());
        assert!(same, "{what}: element {i}: device {a} vs cpu {b}");
    }
}

/// Runs `f` on CPU copies of `leaves` and on device copies, and compares the
/// results and the leaves' gradients of `sum(result * weights)`.
fn check(
    what: &str,
    dev: Device,
    leaves: &[&Tensor],
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) {
    let run = |on: Device| -> (Vec<Tensor>, Vec<Option<Tensor>>) {
        for l in leaves {
            l.set_grad(None);
        }
        let ins: Vec<Tensor> = leaves.iter().map(|l| l.to_device(on).unwrap()).collect();
        let outs = f(&ins).unwrap_or_else(|e| panic!("{what} on {on}: {e}"));
        for o in &outs {
            assert_eq!(o.device(), on, "{what}: result on {}", o.device());
        }
        let y = &outs[0];
        let w = Tensor::from_vec(values(y.numel(), 99), y.dims())
            .unwrap()
            .to_device(on)
            .unwrap();
        y.mul(&w)
            .and_then(|l| l.sum(None, false))
            .and_then(|l| l.backward())
            .unwrap_or_else(|e| panic!("{what} backward on {on}: {e}"));
        (outs, leaves.iter().map(|l| l.grad()).collect())
    };
    let (want, want_g) = run(Device::Cpu);
    let (got, got_g) = run(dev);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        if w.dtype() == DType::I64 {
            assert_eq!(
                g.to_vec::<i64>().unwrap(),
                w.to_vec::<i64>().unwrap(),
                "{what}: out{k}"
            );
        } else {
            assert_close(&format!("{what}: out{k}"), g, w, 1e-5);
        }
    }
    for (k, (g, w)) in got_g.iter().zip(&want_g).enumerate() {
        match (g, w) {
            (Some(g), Some(w)) => assert_close(&format!("{what}: grad{k}"), g, w, 1e-5),
            (None, None) => {}
            _ => panic!("{what}: grad{k} present on one device only"),
        }
    }
}

fn pool(k: [usize; 2], s: [usize; 2], p: [usize; 2], d: [usize; 2], ceil: bool) -> Pool2dParams {
    Pool2dParams {
        kernel: k,
        stride: s,
        padding: p,
        dilation: d,
        ceil_mode: ceil,
    }
}

#[test]
fn pooling_embedding_and_conv_transpose_run_on_the_device() {
    let Some(dev) = device() else { return };
    let before = kiln::host_fallbacks();
    let ((), launched) = kiln_runtime::record_kernels(|| run_all(dev));
    assert_eq!(kiln::host_fallbacks(), before, "ops fell back to the host");
    // what the GPU would load: every distinct kernel through real NVRTC
    if kiln::cuda::nvrtc_present() {
        let mut seen = std::collections::HashSet::new();
        for k in launched.iter().filter(|k| seen.insert((*k).clone())) {
            kiln_codegen::cuda::cuda_source(k)
                .and_then(|src| kiln::cuda::compile_cubin(&src, (9, 0)))
                .unwrap_or_else(|e| panic!("nvrtc {}: {e}", k.name));
        }
        eprintln!("nvrtc: {} device kernels compiled for sm_90", seen.len());
    }
}

fn run_all(dev: Device) {
    let x = leaf(&[2, 3, 9, 8], 1);
    for p in [
        Pool2dParams::new([2, 2]),
        pool([3, 2], [2, 1], [1, 1], [2, 1], true),
        pool([3, 3], [2, 2], [1, 0], [1, 1], true),
    ] {
        check(&format!("max_pool2d {p:?}"), dev, &[&x], |i| {
            let (y, idx) = F::max_pool2d(&i[0], &p)?;
            Ok(vec![y, idx])
        });
        let p1 = Pool2dParams {
            dilation: [1, 1],
            ..p
        };
        for (inc, div) in [(true, None), (false, None), (false, Some(5))] {
            check(
                &format!("avg_pool2d {p1:?} {inc} {div:?}"),
                dev,
                &[&x],
                |i| Ok(vec![F::avg_pool2d(&i[0], &p1, inc, div)?]),
            );
        }
    }
    // windows that do not divide the input, that do, and global pooling
    for os in [[4, 3], [3, 4], [1, 1], [12, 5]] {
        check(&format!("adaptive_max_pool2d {os:?}"), dev, &[&x], |i| {
            let (y, idx) = F::adaptive_max_pool2d(&i[0], os)?;
            Ok(vec![y, idx])
        });
        check(&format!("adaptive_avg_pool2d {os:?}"), dev, &[&x], |i| {
            Ok(vec![F::adaptive_avg_pool2d(&i[0], os)?])
        });
    }
    // unbatched input, and NaN: the last NaN of a window is its index
    let mut v = values(2 * 6 * 6, 5);
    for at in [0, 1, 14, 15, 40] {
        v[at] = f32::NAN;
    }
    let xn = Tensor::from_vec(v, &[2, 6, 6])
        .unwrap()
        .requires_grad_(true);
    check("max_pool2d NaN", dev, &[&xn], |i| {
        let (y, idx) = F::max_pool2d(&i[0], &pool([3, 3], [2, 2], [1, 1], [1, 1], false))?;
        Ok(vec![y, idx])
    });
    check("adaptive_max_pool2d NaN", dev, &[&xn], |i| {
        let (y, idx) = F::adaptive_max_pool2d(&i[0], [4, 4])?;
        Ok(vec![y, idx])
    });

    let w = leaf(&[7, 4], 2);
    let ids = Tensor::from_vec(vec![3i64, 0, 6, 3, 3, 1, 6, 2], &[2, 4]).unwrap();
    for pad in [None, Some(3), Some(-1)] {
        check(&format!("embedding padding_idx={pad:?}"), dev, &[&w], |i| {
            let ids = ids.to_device(i[0].device())?;
            Ok(vec![F::embedding(&ids, &i[0], pad)?])
        });
    }

    let xt = leaf(&[2, 4, 5, 6], 3);
    let wt = leaf(&[4, 3, 3, 2], 4);
    let bt = leaf(&[6], 6);
    let p = ConvTransposeParams {
        stride: vec![2, 3],
        padding: vec![1, 0],
        output_padding: vec![1, 2],
        dilation: vec![1, 2],
        groups: 2,
    };
    check("conv_transpose2d", dev, &[&xt, &wt, &bt], |i| {
        Ok(vec![F::conv_transpose2d(&i[0], &i[1], Some(&i[2]), &p)?])
    });
    // padding beyond the kernel's reach crops the spread input
    let w2 = leaf(&[4, 2, 2, 2], 7);
    let p2 = ConvTransposeParams {
        padding: vec![2, 1],
        ..Default::default()
    };
    check("conv_transpose2d cropped", dev, &[&xt, &w2], |i| {
        Ok(vec![F::conv_transpose2d(&i[0], &i[1], None, &p2)?])
    });

    let b = Tensor::from_vec(vec![true, false, false, true, true, true], &[2, 3]).unwrap();
    let bi = Tensor::from_vec(vec![2i64, 1, 0, 0, 2, 2, 1, 1], &[2, 4]).unwrap();
    let want = b.gather(1, &bi).unwrap();
    let got = b
        .to_device(dev)
        .unwrap()
        .gather(1, &bi.to_device(dev).unwrap())
        .unwrap();
    assert_eq!((got.device(), got.dtype()), (dev, DType::Bool));
    assert_eq!(
        got.to_vec::<bool>().unwrap(),
        want.to_vec::<bool>().unwrap()
    );
}

#[test]
fn an_out_of_range_embedding_index_on_the_device_is_named() {
    let Some(dev) = device() else { return };
    let w = Tensor::zeros(&[5, 3], DType::F32).to_device(dev).unwrap();
    let on = |v: Vec<i64>| Tensor::from_vec(v, &[4]).unwrap().to_device(dev).unwrap();
    let e = F::embedding(&on(vec![1, 4, 5, 0]), &w, None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "embedding: index 5 (at position 2) is out of range for weight [5,3] with 5 rows"
    );
    let e = F::embedding(&on(vec![-2, 0, 0, 0]), &w, None)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("embedding: index -2 (at position 0)"), "{e}");
}
