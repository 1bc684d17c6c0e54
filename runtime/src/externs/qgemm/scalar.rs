//! The scalar reference kernel: plain int32 sums, then the same epilogue.

use super::Epilogue;

/// `out[i, j] = epilogue(sum_k xq[i, k] * w[j, k])` for all rows and columns.
pub(super) fn qgemm(
    xq: &[u8],
    m: usize,
    lda: usize,
    w: &[i8],
    n: usize,
    k: usize,
    ep: &Epilogue,
    out: &mut [f32],
) {
    for i in 0..m {
        let a = &xq[i * lda..i * lda + k];
        for j in 0..n {
            let acc: i32 = a
                .iter()
                .zip(&w[j * k..(j + 1) * k])
                .map(|(&x, &v)| x as i32 * v as i32)
                .sum();
            out[i * n + j] = ep.apply(acc, j);
        }
    }
}
