//! `kiln doctor`: the CPU backend passes its real checks, CUDA says why it
//! is unavailable on a machine without a driver, and `--require` turns an
//! unusable backend into a non-zero exit.

use kiln::doctor::{self, Verdict};
use std::process::Command;

#[test]
fn the_cpu_checks_pass_and_each_backend_gets_a_verdict_line() {
    let r = doctor::run();
    print!("{}", r.text);
    assert!(r.cpu.is_ok(), "{}", r.cpu.line());
    assert!(
        r.text.contains("cpu matmul 1000x1000: correct"),
        "{}",
        r.text
    );
    assert!(
        r.text.contains("cpu fused kernel: correct, one kernel"),
        "{}",
        r.text
    );
    let lines: Vec<&str> = r.text.lines().collect();
    let n = lines.len();
    assert!(lines[n - 2].starts_with("cpu: ok ("), "{}", lines[n - 2]);
    assert!(lines[n - 1].starts_with("cuda: "), "{}", lines[n - 1]);
    if !kiln::cuda::driver_present() && std::env::var("KILN_CUDA").is_err() {
        assert_eq!(r.cuda, Verdict::Unavailable("no libcuda.so.1 found".into()));
        assert_eq!(lines[n - 1], "cuda: unavailable (no libcuda.so.1 found)");
    }
}

#[test]
fn require_exits_non_zero_when_the_backend_is_unusable() {
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let ok = Command::new(kiln)
        .args(["doctor", "--require", "cpu"])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let cuda = Command::new(kiln)
        .args(["doctor", "--require", "cuda"])
        .env_remove("KILN_CUDA")
        .output()
        .unwrap();
    let usable = String::from_utf8_lossy(&cuda.stdout).contains("\ncuda: ok (");
    assert_eq!(
        cuda.status.success(),
        usable,
        "{}",
        String::from_utf8_lossy(&cuda.stderr)
    );
    if !usable {
        let err = String::from_utf8_lossy(&cuda.stderr);
        assert!(
            err.contains("--require cuda: cuda is unavailable ("),
            "{err}"
        );
    }
}

#[test]
fn the_cuda_checks_run_on_the_emulator() {
    if Command::new("c++").arg("--version").output().is_err() {
        eprintln!("skipped: no c++ compiler for the CUDA emulator");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["doctor", "--require", "cuda"])
        .env("KILN_CUDA", "emulator")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("cuda:0 matmul 96x96: correct"), "{text}");
    assert!(
        text.contains("cuda:0 fused kernel: correct, one kernel"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("cuda: ok (emulator)"), "{text}");
}
