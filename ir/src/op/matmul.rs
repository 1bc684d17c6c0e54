//! Shape inference and argument checks for `matmul`, `bmm` and `linear`
//! (torch.matmul semantics for every rank combination).

use crate::shape::{fmt_dims, Dims};
use crate::{bail, Result};
use smallvec::SmallVec;

/// How a `matmul` of two shapes decomposes into a batch of 2-D products.
///
/// A 1-D left operand is treated as `[1,K]` and a 1-D right operand as `[K,1]`;
/// those unit dims are dropped from `out`. Batch dims broadcast with NumPy rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulPlan {
    /// Broadcast batch dims (empty when both operands have rank <= 2).
    pub batch: Dims,
    /// Batch dims of `a`, right-aligned and padded with 1s to `batch.len()`.
    pub a_batch: Dims,
    /// Batch dims of `b`, right-aligned and padded with 1s to `batch.len()`.
    pub b_batch: Dims,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// `a` was 1-D (its row dim is absent from `out`).
    pub a_vec: bool,
    /// `b` was 1-D (its column dim is absent from `out`).
    pub b_vec: bool,
    /// The result shape.
    pub out: Dims,
}

/// Plans `matmul(a, b)`; see [`matmul_shape`].
pub fn matmul_plan(a: &[usize], b: &[usize]) -> Result<MatmulPlan> {
    let op = "matmul";
    if a.is_empty() || b.is_empty() {
        bail!(
            op,
            "shapes {} and {}: both arguments need at least 1 dimension",
            fmt_dims(a),
            fmt_dims(b)
        );
    }
    let a_vec = a.len() == 1;
    let b_vec = b.len() == 1;
    let (m, ka) = if a_vec {
        (1, a[0])
    } else {
        (a[a.len() - 2], a[a.len() - 1])
    };
    let (kb, n) = if b_vec {
        (b[0], 1)
    } else {
        (b[b.len() - 2], b[b.len() - 1])
    };
    if ka != kb {
        bail!(
            op,
            "shapes {} and {}: inner dims {ka} and {kb} differ",
            fmt_dims(a),
            fmt_dims(b)
        );
    }
    let ab: &[usize] = if a.len() > 2 { &a[..a.len() - 2] } else { &[] };
    let bb: &[usize] = if b.len() > 2 { &b[..b.len() - 2] } else { &[] };
    let nb = ab.len().max(bb.len());
    let pad = |d: &[usize]| -> Dims {
        let mut v: Dims = SmallVec::from_elem(1, nb - d.len());
        v.extend_from_slice(d);
        v
    };
    let a_batch = pad(ab);
    let b_batch = pad(bb);
    let mut batch: Dims = SmallVec::with_capacity(nb);
    for i in 0..nb {
        let (x, y) = (a_batch[i], b_batch[i]);
        batch.push(match (x, y) {
            _ if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => bail!(
                op,
                "shapes {} and {}: batch dims {} and {} cannot broadcast ({x} vs {y})",
                fmt_dims(a),
                fmt_dims(b),
                fmt_dims(ab),
                fmt_dims(bb)
            ),
        });
    }
    let mut out = batch.clone();
    if !a_vec {
        out.push(m);
    }
    if !b_vec {
        out.push(n);
    }
    Ok(MatmulPlan {
        batch,
        a_batch,
        b_batch,
        m,
        k: ka,
        n,
        a_vec,
        b_vec,
        out,
    })
}

/// Result shape of `torch.matmul(a, b)`.
///
/// ```
/// use kiln_ir::op::matmul::matmul_shape;
/// assert_eq!(matmul_shape(&[3], &[3]).unwrap().as_slice(), &[] as &[usize]);
/// assert_eq!(matmul_shape(&[5, 1, 2, 3], &[4, 3, 7]).unwrap().as_slice(), &[5, 4, 2, 7]);
/// let e = matmul_shape(&[2, 3], &[4, 5]).unwrap_err();
/// assert_eq!(e.to_string(), "matmul: shapes [2,3] and [4,5]: inner dims 3 and 4 differ");
/// ```
pub fn matmul_shape(a: &[usize], b: &[usize]) -> Result<Dims> {
    Ok(matmul_plan(a, b)?.out)
}

/// Result shape of `torch.bmm(a, b)`: `[B,M,K] @ [B,K,N] -> [B,M,N]`, no broadcasting.
pub fn bmm_shape(a: &[usize], b: &[usize]) -> Result<Dims> {
    let op = "bmm";
    if a.len() != 3 || b.len() != 3 {
        bail!(
            op,
            "shapes {} and {}: both operands must be 3-D",
            fmt_dims(a),
            fmt_dims(b)
        );
    }
    if a[0] != b[0] {
        bail!(
            op,
            "shapes {} and {}: batch sizes {} and {} differ",
            fmt_dims(a),
            fmt_dims(b),
            a[0],
            b[0]
        );
    }
    if a[2] != b[1] {
        bail!(
            op,
            "shapes {} and {}: inner dims {} and {} differ",
            fmt_dims(a),
            fmt_dims(b),
            a[2],
            b[1]
        );
    }
    Ok(SmallVec::from_slice(&[a[0], a[1], b[2]]))
}

/// Result shape of `F.linear(input, weight, bias)`: `[..., K] x [N, K] (+ [N]) -> [..., N]`.
pub fn linear_shape(input: &[usize], weight: &[usize], bias: Option<&[usize]>) -> Result<Dims> {
    let op = "linear";
    if weight.len() != 2 {
        bail!(
            op,
            "weight {} must be 2-D [out_features, in_features]",
            fmt_dims(weight)
        );
    }
    if input.is_empty() {
        bail!(
            op,
            "input {} must have at least 1 dimension",
            fmt_dims(input)
        );
    }
    let k = input[input.len() - 1];
    if k != weight[1] {
        bail!(
            op,
            "input {} has {k} features but weight {} expects {}",
            fmt_dims(input),
            fmt_dims(weight),
            weight[1]
        );
    }
    if let Some(bs) = bias {
        if bs != [weight[0]] {
            bail!(
                op,
                "bias {} does not match weight {}: expected [{}]",
                fmt_dims(bs),
                fmt_dims(weight),
                weight[0]
            );
        }
    }
    let mut out: Dims = SmallVec::from_slice(&input[..input.len() - 1]);
    out.push(weight[0]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(a: &[usize], b: &[usize]) -> Vec<usize> {
        matmul_shape(a, b).unwrap().to_vec()
    }

    #[test]
    fn every_rank_combination() {
        assert_eq!(s(&[3], &[3]), Vec::<usize>::new());
        assert_eq!(s(&[2, 3], &[3]), vec![2]);
        assert_eq!(s(&[3], &[3, 4]), vec![4]);
        assert_eq!(s(&[2, 3], &[3, 4]), vec![2, 4]);
        assert_eq!(s(&[3], &[5, 3, 4]), vec![5, 4]);
        assert_eq!(s(&[5, 2, 3], &[3]), vec![5, 2]);
        assert_eq!(s(&[5, 2, 3], &[3, 4]), vec![5, 2, 4]);
        assert_eq!(s(&[2, 3], &[5, 3, 4]), vec![5, 2, 4]);
        assert_eq!(s(&[5, 1, 2, 3], &[4, 3, 7]), vec![5, 4, 2, 7]);
        assert_eq!(s(&[0, 3], &[3, 0]), vec![0, 0]);
        let p = matmul_plan(&[2, 1, 4, 3], &[6, 3, 5]).unwrap();
        assert_eq!(p.batch.as_slice(), &[2, 6]);
        assert_eq!(p.a_batch.as_slice(), &[2, 1]);
        assert_eq!(p.b_batch.as_slice(), &[1, 6]);
        assert_eq!((p.m, p.k, p.n), (4, 3, 5));
    }

    #[test]
    fn errors_name_shapes() {
        let e = matmul_shape(&[2, 3], &[4, 5]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: shapes [2,3] and [4,5]: inner dims 3 and 4 differ"
        );
        let e = matmul_shape(&[3], &[4]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: shapes [3] and [4]: inner dims 3 and 4 differ"
        );
        let e = matmul_shape(&[2, 2, 3], &[3, 3, 4]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: shapes [2,2,3] and [3,3,4]: batch dims [2] and [3] cannot broadcast (2 vs 3)"
        );
        assert!(matmul_shape(&[], &[3])
            .unwrap_err()
            .to_string()
            .contains("at least 1 dimension"));
    }

    #[test]
    fn bmm_and_linear() {
        assert_eq!(
            bmm_shape(&[4, 2, 3], &[4, 3, 5]).unwrap().as_slice(),
            &[4, 2, 5]
        );
        let e = bmm_shape(&[4, 2, 3], &[5, 3, 5]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bmm: shapes [4,2,3] and [5,3,5]: batch sizes 4 and 5 differ"
        );
        assert_eq!(
            linear_shape(&[8, 2, 16], &[4, 16], Some(&[4]))
                .unwrap()
                .as_slice(),
            &[8, 2, 4]
        );
        assert_eq!(
            linear_shape(&[16], &[4, 16], None).unwrap().as_slice(),
            &[4]
        );
        let e = linear_shape(&[8, 15], &[4, 16], None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "linear: input [8,15] has 15 features but weight [4,16] expects 16"
        );
        let e = linear_shape(&[8, 16], &[4, 16], Some(&[5])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "linear: bias [5] does not match weight [4,16]: expected [4]"
        );
    }
}
