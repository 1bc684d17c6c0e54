use super::*;
use crate::externs::testutil::Lcg;

fn random_case(rng: &mut Lcg, m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = rng
        .vec::<f32>(m * k)
        .iter()
        .map(|v| v * 3.0 + 0.5)
        .collect();
    let w = rng.vec::<f32>(n * k);
    let b = rng.vec::<f32>(n);
    (x, w, b)
}

/// Every SIMD kernel the CPU has gives the scalar reference's bits.
fn check_isa_matches_scalar(isa: Isa) {
    let mut rng = Lcg(7);
    for &(m, n, k) in &[
        (1, 1, 1),
        (3, 17, 5),
        (4, 16, 8),
        (5, 33, 70),
        (9, 40, 64),
        (2, 3, 129),
    ] {
        for per_channel in [false, true] {
            for relu in [false, true] {
                let (x, w, b) = random_case(&mut rng, m, n, k);
                let (wq, s) = quantize_weight_symmetric(&w, n, k, per_channel);
                let p = PackedWeights::pack(&wq, n, k);
                let want = qlinear(&x, m, &p, &s, Some(&b), relu, Isa::Scalar);
                let got = qlinear(&x, m, &p, &s, Some(&b), relu, isa);
                let (wb, gb): (Vec<u32>, Vec<u32>) = (
                    want.iter().map(|v| v.to_bits()).collect(),
                    got.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(
                    gb,
                    wb,
                    "{} vs scalar at m{m} n{n} k{k} per_channel {per_channel} relu {relu}",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn avx2_matches_scalar_bit_for_bit() {
    if !Isa::Avx2.is_available() {
        eprintln!("qgemm avx2: skipped (this CPU has no AVX2)");
        return;
    }
    check_isa_matches_scalar(Isa::Avx2);
}

#[test]
fn vnni_matches_scalar_bit_for_bit() {
    if !Isa::Avx512Vnni.is_available() {
        eprintln!("qgemm avx512-vnni: skipped (this CPU has no AVX-512-VNNI; the kernel is compiled, not run)");
        return;
    }
    check_isa_matches_scalar(Isa::Avx512Vnni);
}

#[test]
fn scalar_kernel_is_the_integer_product() {
    // x = [0, 1.27] -> scale 0.01, zero point 0: xq = [0, 127]
    let q = choose_activation_qparams(0.0, 1.27, true);
    assert_eq!(q.zero_point, 0);
    assert!((q.scale - 0.01).abs() < 1e-9);
    let w = [2i8, -3, 5, 7];
    let p = PackedWeights::pack(&w, 2, 2);
    let out = qlinear(&[0.0, 1.27], 1, &p, &[0.5], None, false, Isa::Scalar);
    // acc = [127 * -3, 127 * 7], times 0.01 * 0.5
    assert_eq!(
        out,
        vec![(-381.0f32) * (q.scale * 0.5), 889.0 * (q.scale * 0.5)]
    );
}

#[test]
fn activation_params_follow_fbgemm() {
    // all non-negative: zero point 0, scale max/127
    let q = choose_activation_qparams(0.5, 2.54, true);
    assert_eq!((q.zero_point, q.scale), (0, (2.54f64 / 127.0) as f32));
    // all non-positive: zero point 127
    assert_eq!(choose_activation_qparams(-3.0, -1.0, true).zero_point, 127);
    // a constant zero input: scale 0.1 (fbgemm's fallback), zero point 0
    assert_eq!(
        choose_activation_qparams(0.0, 0.0, true),
        QParams {
            scale: 0.1,
            zero_point: 0
        }
    );
    // tiny ranges are widened to the smallest scale
    let tiny = choose_activation_qparams(-1e-7, 1e-7, true);
    assert_eq!(tiny.scale, 6.1e-5f32);
    // 8 bits without reduce_range
    assert_eq!(choose_activation_qparams(-1.0, 1.0, false).zero_point, 128);
}

#[test]
fn quantize_rounds_half_to_even_and_clamps() {
    let q = QParams {
        scale: 1.0,
        zero_point: 10,
    };
    let xq = quantize_activations(&[0.5, 1.5, -2.5, -20.0, 300.0], 5, 8, q);
    assert_eq!(xq, vec![10, 12, 8, 0, 255, 0, 0, 0]);
}

#[test]
fn simd_activation_quantization_matches_the_scalar_loop() {
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
    {
        eprintln!("qgemm quantize avx2: skipped (no AVX2+FMA)");
        return;
    }
    let mut rng = Lcg(11);
    // halves land exactly on ties: 0.5 steps with scale 1
    let mut x: Vec<f32> = (0..203).map(|i| i as f32 * 0.5 - 40.0).collect();
    x.extend(rng.vec::<f32>(301).iter().map(|v| v * 70.0));
    x.extend([1e12, -1e12, 300.0, -300.0]);
    for (inv, zp) in [(1.0f32, 10.0f32), (1.7, 3.0), (127.0 / 3.1, 0.0)] {
        let (mut a, mut b) = (vec![0u8; x.len()], vec![0u8; x.len()]);
        super::params::quantize_row_scalar(&x, &mut a, inv, zp);
        unsafe { super::simd::quantize_row_avx2(&x, &mut b, inv, zp) };
        assert_eq!(a, b, "inv {inv} zp {zp}");
    }
    assert_eq!(
        unsafe { super::simd::min_max_avx2(&x) },
        x.iter()
            .fold((x[0], x[0]), |(l, h), &v| (l.min(v), h.max(v)))
    );
}

/// The tiled call gives the untiled product's bits (one quantization of the
/// whole input, then the GEMM over all rows at once) and hands every row
/// to the tile callback exactly once.
#[test]
fn tiles_cover_every_row_once_and_change_no_bit() {
    let mut rng = Lcg(21);
    let (m, n, k) = (2 * TILE_ROWS + 22, 80, 300);
    let (x, w, b) = random_case(&mut rng, m, n, k);
    let (wq, s) = quantize_weight_symmetric(&w, n, k, true);
    let p = PackedWeights::pack(&wq, n, k);
    let (lo, hi) = find_min_max(&x);
    let a = choose_activation_qparams(lo, hi, true);
    let xq = quantize_activations(&x, k, p.k_padded(), a);
    let mut want = vec![0f32; m * n];
    qgemm_dequant(&xq, m, a, &p, &s, Some(&b), true, &mut want, Isa::detect());
    let seen = std::sync::Mutex::new(vec![0usize; m]);
    let mark = |r0: usize, rows: usize| {
        let mut seen = seen.lock().unwrap();
        for r in r0..r0 + rows {
            seen[r] += 1;
        }
    };
    let call = QLinearCall {
        packed: &p,
        w_scale: &s,
        bias: Some(&b),
        relu: true,
        isa: Isa::detect(),
    };
    let mut got = vec![0f32; m * n];
    qlinear_into(&x, m, &call, &mut got, Some(&mark));
    assert!(seen.into_inner().unwrap().iter().all(|&c| c == 1));
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
}

/// A cached packed weight is reused while its key holds, and packed anew
/// when the version moves.
#[test]
fn packed_weights_follow_the_version() {
    use crate::externs::packed::WeightKey;
    let st = std::sync::Arc::new(crate::Storage::zeros(kiln_ir::DType::I8, 6));
    let key = |version| WeightKey {
        storage: &st,
        offset: 0,
        dims: &[2, 3],
        version,
    };
    let w = [1i8, 2, 3, 4, 5, 6];
    let a = packed_weights(Some(key(0)), &w, 2, 3);
    let b = packed_weights(Some(key(0)), &[0; 6], 2, 3);
    assert_eq!(
        b.colsum()[..2],
        a.colsum()[..2],
        "same key: the cached pack"
    );
    let c = packed_weights(Some(key(1)), &[0; 6], 2, 3);
    assert_eq!(c.colsum()[..2], [0, 0], "a new version repacks");
}
