//! Crash safety, concurrency and allocation failure, each in a real
//! process: the test binary re-runs itself as the child (selected by an
//! environment variable), so a writer can be SIGKILLed mid-save and an
//! allocation can fail under `ulimit -v` without taking the test run down.

use kiln::compile::compile_fn;
use kiln::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD: &str = "KILN_RELIABILITY_CHILD";

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-reliab-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// This test binary, running only the test `name` with `role` in the environment.
fn child(name: &str, role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, role);
    c
}

fn temps_in(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

/// A checkpoint of 8 MiB whose every element is `v`.
fn checkpoint(v: f32) -> Vec<(String, Tensor)> {
    vec![("w".into(), Tensor::full(&[2 << 20], v as f64, DType::F32))]
}

fn value_of(path: &Path) -> f32 {
    let t = kiln::serialize::load(path).expect("the checkpoint loads");
    let v = t[0].1.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|&x| x == v[0]), "a torn checkpoint");
    v[0]
}

/// The child side of the crash test: saves new checkpoints to the path in
/// `KILN_RELIABILITY_CHILD=save:PATH` until it is killed.
#[test]
fn crash_child() {
    let Some(path) = std::env::var(CHILD)
        .ok()
        .and_then(|r| r.strip_prefix("save:").map(PathBuf::from))
    else {
        return;
    };
    println!("ready");
    for i in 0.. {
        kiln::serialize::save(&path, &checkpoint(2.0 + i as f32)).unwrap();
    }
}

#[test]
fn a_writer_killed_mid_save_leaves_the_old_file_and_no_temp_after_the_next_save() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let d = dir("crash");
    let path = d.join("ck.safetensors");
    let mut left_behind = 0;
    for (moment, delay_ms) in [0u64, 3, 15, 40, 90].into_iter().enumerate() {
        kiln::serialize::save(&path, &checkpoint(1.0)).unwrap();
        let mut c = child("crash_child", &format!("save:{}", path.display()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // wait for "ready" so the kill lands in the save loop, not in start-up
        let mut out = c.stdout.take().unwrap();
        let mut buf = [0u8; 6];
        std::io::Read::read_exact(&mut out, &mut buf).unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap(); // reaped: its pid is gone
        let v = value_of(&path);
        assert!(v == 1.0 || v >= 2.0, "moment {moment}: value {v}");
        left_behind += temps_in(&d).len();
        kiln::serialize::save(&path, &checkpoint(-1.0)).unwrap();
        assert_eq!(
            temps_in(&d),
            Vec::<String>::new(),
            "moment {moment}: temps after the next save"
        );
        assert_eq!(value_of(&path), -1.0);
    }
    println!("crash safety: 5 kills, {left_behind} temp file(s) left by killed writers, all removed by the next save");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The child side of the allocation test, run under `ulimit -v`.
#[test]
fn alloc_child() {
    if std::env::var(CHILD).as_deref() != Ok("alloc") {
        return;
    }
    // 4 GiB of f32: more than the limit allows
    let e = Tensor::try_zeros(&[1 << 30], DType::F32).unwrap_err();
    println!("zeros: {e}");
    let a = Tensor::zeros(&[1 << 15, 1], DType::F32);
    let b = Tensor::zeros(&[1, 1 << 15], DType::F32);
    let e = (a.add(&b)).unwrap_err();
    println!("add: {e}");
    // 1 GiB of u8 fits: `ones` writes u8 directly (no 8-byte temporary per element)
    let o = Tensor::try_ones(&[1 << 30], DType::U8).unwrap();
    println!("ones: {} elements", o.numel());
    drop(o);
    let s = Tensor::ones(&[1000], DType::F32)
        .sum(None, false)
        .unwrap()
        .item()
        .unwrap();
    println!("still alive: {s}");
}

#[test]
fn allocation_failure_under_ulimit_is_an_error_not_an_abort() {
    if std::env::var(CHILD).is_ok() || !Path::new("/bin/sh").exists() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // 3 GiB of address space (ulimit -v counts KiB)
    let out = Command::new("/bin/sh")
        .args(["-c", "ulimit -v 3145728 && exec \"$0\" \"$@\""])
        .arg(&exe)
        .args(["--exact", "alloc_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "alloc")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child died: {:?}\n{text}",
        out.status
    );
    assert!(
        text.contains(
            "zeros: zeros: cannot allocate 4294967296 bytes for a f32 tensor of shape [1073741824]"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "add: add: cannot allocate 4294967296 bytes for a f32 tensor of shape [32768,32768]"
        ),
        "{text}"
    );
    assert!(text.contains("ones: 1073741824 elements"), "{text}");
    assert!(text.contains("still alive: 1000"), "{text}");
}

#[test]
fn compiled_and_eager_calls_from_8_threads_with_differing_batch_sizes() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let f = compile_fn("mlp", |t: &[Tensor]| {
        let h = kiln::functional::linear(&t[0], &t[1], None)?.relu()?;
        Ok(vec![
            h.softmax(-1)?.sum(Some(&[1]), false)?,
            h.mean(None, false)?,
        ])
    });
    let w = Tensor::from_vec((0..24).map(|i| (i as f32 - 12.0) / 10.0).collect(), &[6, 4]).unwrap();
    let _ng = kiln::autograd::no_grad();
    std::thread::scope(|s| {
        for th in 0..8usize {
            let (f, w) = (&f, &w);
            s.spawn(move || {
                let _ng = kiln::autograd::no_grad();
                for round in 0..4 {
                    let b = 1 + (th + round) % 5;
                    let x: Vec<f32> = (0..b * 4).map(|i| ((i + th) % 7) as f32 - 3.0).collect();
                    let x = Tensor::from_vec(x, &[b, 4]).unwrap();
                    let got = f.call(&[x.clone(), w.clone()]).unwrap();
                    let h = kiln::functional::linear(&x, w, None)
                        .unwrap()
                        .relu()
                        .unwrap();
                    let want = h.softmax(-1).unwrap().sum(Some(&[1]), false).unwrap();
                    assert_eq!(got[0].dims(), &[b]);
                    for (g, e) in got[0].to_f64_vec().iter().zip(want.to_f64_vec()) {
                        assert!((g - e).abs() < 1e-5, "thread {th} batch {b}: {g} vs {e}");
                    }
                    let m = h.mean(None, false).unwrap().item().unwrap();
                    assert!((got[1].item().unwrap() - m).abs() < 1e-5);
                }
            });
        }
    });
}

#[test]
fn concurrent_saves_to_one_path_leave_one_whole_file() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let d = dir("concurrent");
    let path = d.join("shared.safetensors");
    std::thread::scope(|s| {
        for th in 0..8 {
            let path = &path;
            s.spawn(move || {
                for _ in 0..3 {
                    let t = vec![("w".into(), Tensor::full(&[4096], th as f64, DType::F32))];
                    kiln::serialize::save(path, &t).unwrap();
                }
            });
        }
    });
    let v = value_of(&path);
    assert!((0.0..8.0).contains(&v) && v.fract() == 0.0, "{v}");
    assert_eq!(temps_in(&d), Vec::<String>::new());
    std::fs::remove_dir_all(&d).unwrap();
}
