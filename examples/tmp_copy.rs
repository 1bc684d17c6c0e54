use kiln::Tensor;
fn main() {
    for n in [64 << 10, 4 << 20] {
        let r = |s| kiln::random::randn(&[n], Some(&mut kiln::random::Generator::new(s)));
        let (x, a, b) = (r(1), r(2), r(3));
        let gelu = kiln::compile::compile_fn("w1", |t: &[Tensor]| {
            let y = t[0].mul(&t[1])?.add(&t[2])?.gelu(false)?;
            Ok(vec![&(&y * 0.5) + &t[0]])
        });
        let fma = kiln::compile::compile_fn("w1fma", |t: &[Tensor]| {
            let y = t[0].mul(&t[1])?.add(&t[2])?;
            Ok(vec![&(&y * 0.5) + &t[0]])
        });
        let reps = (64 << 20) / n;
        for (name, f) in [
            ("gelu", &gelu),
            ("fma", &fma),
            ("gelu", &gelu),
            ("fma", &fma),
        ] {
            let ins = [x.clone(), a.clone(), b.clone()];
            for _ in 0..3 {
                f.call(&ins).unwrap();
            }
            let mut best = f64::MAX;
            for _ in 0..10 {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    f.call(&ins).unwrap();
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            let mut one: Vec<f64> = (0..30)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f.call(&ins).unwrap();
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            one.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "n={n} {name}: {:.3} ms, {:.2} ns/elem; single calls min {:.3} med {:.3} max {:.3}",
                best * 1e3,
                best * 1e9 / n as f64,
                one[0],
                one[15],
                one[29]
            );
        }
    }
}
