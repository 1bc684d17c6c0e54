//! `kiln bench --device cuda --quick` on the CUDA emulator (a real GPU with
//! `KILN_CUDA=driver`): every device workload runs eager and compiled with
//! its tensors on the device, compiled agrees with eager, and the report
//! names the device.

use kiln::bench::{self, Mode, Size, DEVICE_WORKLOADS};
use kiln::Device;
use std::io::Write;
use std::process::Command;

fn emulated() -> bool {
    if std::env::var("KILN_CUDA").as_deref() == Ok("driver") {
        return false;
    }
    Command::new("c++").arg("--version").output().is_ok()
}

#[test]
fn device_bench_runs_every_inference_workload_on_the_device() {
    let real = std::env::var("KILN_CUDA").as_deref() == Ok("driver");
    if !real && !emulated() {
        let _ = writeln!(std::io::stderr(), "cuda_bench: no c++ compiler, skipped");
        return;
    }
    if !real {
        kiln::cuda::use_emulator();
    }
    let dev = bench::parse_device("cuda:0").unwrap();
    assert_eq!(dev, Device::Cuda(0));
    // the CPU run's kernels, compiled for the emulator in one batch (a no-op on a GPU)
    let (cpu, kernels) = kiln::runtime::record_kernels(|| {
        bench::run_on(&[], 1, Mode::Both, Size::Quick, Device::Cpu, None)
    });
    kiln::cuda::gpu(0).unwrap().prepare(&kernels).unwrap();
    let only = vec![
        "W1".into(),
        "w2".into(),
        "W3".into(),
        "W4".into(),
        "W7".into(),
        "W5".into(),
    ];
    let b = bench::run_on(&only, 1, Mode::Both, Size::Quick, dev, None).unwrap();

    let names: Vec<(&str, &str)> = b
        .rows
        .iter()
        .map(|r| (r.workload.as_str(), r.mode.as_str()))
        .collect();
    let want: Vec<(&str, &str)> = DEVICE_WORKLOADS
        .iter()
        .flat_map(|w| [(*w, "eager"), (*w, "compiled")])
        .collect();
    assert_eq!(names, want);
    for r in &b.rows {
        assert_eq!(r.device, dev, "{} {}", r.workload, r.mode);
        assert!(r.median_ms > 0.0, "{} {}", r.workload, r.mode);
        assert!(r.json().contains("\"device\":\"cuda:0\""), "{}", r.json());
        if r.mode == "compiled" {
            let d = r.max_diff.expect("compiled rows compare with eager");
            assert!(d <= bench::device::AGREE_TOL, "{}: {d:e}", r.workload);
        }
    }
    // the device computes what the CPU computes: same sizes, same work
    let cpu = cpu.unwrap();
    for (g, c) in b.rows.iter().zip(&cpu.rows) {
        assert_eq!((&g.what, g.unit), (&c.what, c.unit));
    }

    let report = b.report();
    let _ = writeln!(std::io::stderr(), "{report}");
    assert!(report.starts_with("device: cuda:0 ("), "{report}");
    assert!(report.contains("quick sizes"), "{report}");
    assert!(
        report.contains("compiled vs eager max diff: W1 "),
        "{report}"
    );
    assert!(report.contains("skipped W5: training steps"), "{report}");
    assert!(b.cnn_compile_ms.iter().all(|&t| t > 0.0), "{report}");
    assert!(report.contains("small CNN: "), "{report}");
    if !real {
        assert!(report.contains("emulator"), "{report}");
        // GEMM and conv are generated kernels on the device: nothing ran on the host
        assert!(
            report.contains("ran on the host between copies: none"),
            "{report}"
        );
    }
}

#[test]
fn kiln_bench_cli_names_the_device() {
    if !emulated() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "bench", "--device", "cuda", "--quick", "--iters", "1", "--only", "W1",
        ])
        .env("KILN_CUDA", "emulator")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("device: cuda:0 (CPU emulator"), "{text}");
    assert!(text.contains("W1        compiled"), "{text}");

    let bad = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", "--device", "tpu"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        err.contains("unknown device `tpu`: expected cpu, cuda or cuda:N"),
        "{err}"
    );
}
