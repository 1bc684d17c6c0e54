//! Int8 weights packed once for the SIMD kernels.
//!
//! Layout: the `[n, k]` weight (a Linear's `[out, in]`) is cut into panels of
//! [`NR`] = 16 output columns; within a panel, `k` is cut into groups of 4.
//! Each group is 64 bytes: two halves of 8 columns, each column's 4
//! consecutive `k` values side by side. So one 32-bit lane of a 256-bit
//! register holds one column's 4 weights, exactly what `vpmaddubsw` +
//! `vpmaddwd` (AVX2) and `vpdpbusd` (AVX-512-VNNI) multiply with 4
//! broadcast activation bytes. Padding (columns past `n`, `k` past a
//! multiple of 4) is zero, so it adds nothing to any sum.

/// Output columns per packed panel.
pub const NR: usize = 16;

/// A Linear's int8 weight, packed for the kernels, with its column sums
/// (what the activation zero point is subtracted with).
#[derive(Debug, Clone)]
pub struct PackedWeights {
    n: usize,
    k: usize,
    /// `k` rounded up to a multiple of 4: the activation row stride.
    k_padded: usize,
    data: Vec<u8>,
    /// The row-major `[n, k]` int8 weight (the scalar kernel reads it).
    plain: Vec<i8>,
    /// `colsum[j] = sum_k w[j, k]`, padded with zeros to whole panels.
    colsum: Vec<i32>,
}

impl PackedWeights {
    /// Packs the row-major `[n, k]` int8 weight `w`.
    ///
    /// ```
    /// use kiln_runtime::externs::qgemm::PackedWeights;
    /// let p = PackedWeights::pack(&[1, 2, 3, -4, 5, 6], 2, 3);
    /// assert_eq!((p.n(), p.k(), p.k_padded()), (2, 3, 4));
    /// assert_eq!(&p.colsum()[..2], &[6, 7]);
    /// ```
    pub fn pack(w: &[i8], n: usize, k: usize) -> PackedWeights {
        assert_eq!(
            w.len(),
            n * k,
            "qgemm pack: {} weights for [{n}, {k}]",
            w.len()
        );
        let k_padded = k.div_ceil(4) * 4;
        let groups = k_padded / 4;
        let panels = n.div_ceil(NR);
        let mut data = vec![0u8; panels * groups * 64];
        let mut colsum = vec![0i32; panels * NR];
        for j in 0..n {
            let (p, c) = (j / NR, j % NR);
            let (half, lane) = (c / 8, c % 8);
            for kk in 0..k {
                let v = w[j * k + kk];
                let (g, t) = (kk / 4, kk % 4);
                data[(p * groups + g) * 64 + half * 32 + lane * 4 + t] = v as u8;
                colsum[j] += v as i32;
            }
        }
        PackedWeights {
            n,
            k,
            k_padded,
            data,
            plain: w.to_vec(),
            colsum,
        }
    }

    pub fn n(&self) -> usize {
        self.n
    }
    pub fn k(&self) -> usize {
        self.k
    }
    /// The activation row stride the kernels expect.
    pub fn k_padded(&self) -> usize {
        self.k_padded
    }
    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }
    pub fn colsum(&self) -> &[i32] {
        &self.colsum
    }
    pub fn plain(&self) -> &[i8] {
        &self.plain
    }
    /// The packed bytes of panel `p` (`k_padded / 4` groups of 64 bytes).
    pub(super) fn panel(&self, p: usize) -> &[u8] {
        let len = self.k_padded / 4 * 64;
        &self.data[p * len..(p + 1) * len]
    }
}
