//! `embedding` forward on the CPU: gathers rows of a contiguous
//! `[num_embeddings, dim]` table by integer indices.

use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `out[i, :] = weight[indices[i], :]` for `weight` `[num_embeddings, dim]`
/// and `out` `[indices.len(), dim]`, all contiguous. Indices may be `i64` or
/// `i32`; a negative or too-large index is an error naming it and the table
/// size. (`padding_idx` only matters for backward and is not taken here.)
pub fn embedding<T, I>(
    weight: &[T],
    num_embeddings: usize,
    dim: usize,
    indices: &[I],
    out: &mut [T],
) -> Result<()>
where
    T: Copy + Send + Sync,
    I: Copy + Into<i64> + Sync,
{
    assert_eq!(
        weight.len(),
        num_embeddings * dim,
        "embedding: weight length does not match [{num_embeddings},{dim}]"
    );
    assert_eq!(
        out.len(),
        indices.len() * dim,
        "embedding: out length does not match indices x dim"
    );
    if let Some((pos, bad)) = indices
        .iter()
        .map(|&i| i.into())
        .enumerate()
        .find(|&(_, i)| i < 0 || i as u64 >= num_embeddings as u64)
    {
        bail!(
            "embedding",
            "index {bad} (at position {pos}) is out of range for weight {} with {num_embeddings} rows",
            fmt_dims(&[num_embeddings, dim])
        );
    }
    if dim == 0 {
        return Ok(());
    }
    let copy_row = |(row, &i): (&mut [T], &I)| {
        let i = i.into() as usize;
        row.copy_from_slice(&weight[i * dim..(i + 1) * dim]);
    };
    if out.len() >= 1 << 18 && rayon::current_num_threads() > 1 {
        crate::par::for_each_piece(out, dim, || (), |_, i, row| copy_row((row, &indices[i])));
    } else {
        out.chunks_mut(dim).zip(indices.iter()).for_each(copy_row);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_rows_and_names_bad_index() {
        let w: Vec<f32> = (0..12).map(|x| x as f32).collect(); // [4, 3]
        let mut out = vec![0f32; 9];
        embedding(&w, 4, 3, &[3i64, 0, 3], &mut out).unwrap();
        assert_eq!(out, [9., 10., 11., 0., 1., 2., 9., 10., 11.]);
        embedding(&w, 4, 3, &[1i32, 2, 1], &mut out).unwrap();
        assert_eq!(&out[..3], &[3., 4., 5.]);
        let e = embedding(&w, 4, 3, &[1i64, 4, 0], &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "embedding: index 4 (at position 1) is out of range for weight [4,3] with 4 rows"
        );
        let e = embedding(&w, 4, 3, &[-1i64, 0, 0], &mut out).unwrap_err();
        assert!(e.to_string().contains("index -1"));
        let big: Vec<f64> = (0..1000 * 64).map(|x| x as f64).collect();
        let idx: Vec<i64> = (0..5000).map(|i| (i * 7919) % 1000).collect();
        let mut o = vec![0f64; 5000 * 64];
        embedding(&big, 1000, 64, &idx, &mut o).unwrap();
        for (r, &i) in idx.iter().enumerate() {
            assert_eq!(o[r * 64 + 5], (i * 64 + 5) as f64);
        }
    }
}
