//! `torch.einsum`: the equation parsed into one label per operand dim
//! (`...` dims get labels of their own, right-aligned so they broadcast),
//! repeated labels within an operand taken as diagonals, labels no one else
//! needs summed away, then the operands contracted left to right, each pair
//! as one batched matmul: `(batch, left, summed) x (batch, summed, right)`.
//! Every step is a view, a sum or a matmul, so gradients and traces are
//! theirs.

use super::bmm;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// A dim's label: a letter's code, or `ELLIPSIS + k` for the k-th of the
/// right-aligned broadcast dims.
type Label = u32;
const ELLIPSIS: Label = 1000;

/// One term of the equation: its letters, with `...` at `ellipsis` if present.
struct Term {
    letters: Vec<Label>,
    ellipsis: Option<usize>,
}

fn parse_term(eq: &str, t: &str) -> Result<Term> {
    let mut letters = vec![];
    let mut ellipsis = None;
    let mut rest = t;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("...") {
            if ellipsis.is_some() {
                bail!("einsum", "more than one ellipsis in term '{t}' of '{eq}'");
            }
            ellipsis = Some(letters.len());
            rest = r;
            continue;
        }
        let ch = rest.chars().next().unwrap_or(' ');
        if !ch.is_ascii_alphabetic() {
            bail!(
                "einsum",
                "invalid subscript '{ch}' in '{eq}': subscripts are letters or '...'"
            );
        }
        letters.push(ch as Label);
        rest = &rest[1..];
    }
    Ok(Term { letters, ellipsis })
}

/// An operand's dim labels, its `...` standing for `rank - letters` dims.
fn labels_of(eq: &str, t: &Term, x: &Tensor, ell: usize) -> Result<Vec<Label>> {
    let n = t.letters.len();
    let e = match t.ellipsis {
        Some(_) if x.rank() >= n => x.rank() - n,
        None if x.rank() == n => 0,
        _ => bail!(
            "einsum",
            "the term for an operand of shape {} in '{eq}' has {n} subscripts",
            fmt_dims(x.dims())
        ),
    };
    let at = t.ellipsis.unwrap_or(n);
    let mut l = t.letters[..at].to_vec();
    l.extend((0..e).map(|k| ELLIPSIS + (ell - e + k) as Label));
    l.extend_from_slice(&t.letters[at..]);
    Ok(l)
}

/// `torch.einsum(equation, *operands)`, explicit (`->`) or implicit output.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// assert_eq!(F::einsum("ii", &[&a]).unwrap().to_f64_vec(), vec![5.0]);
/// assert_eq!(F::einsum("ij->j", &[&a]).unwrap().to_f64_vec(), vec![4.0, 6.0]);
/// ```
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms = lhs
        .split(',')
        .map(|t| parse_term(&eq, t))
        .collect::<Result<Vec<_>>>()?;
    if terms.len() != operands.len() || operands.is_empty() {
        bail!(
            "einsum",
            "'{equation}' has {} operand terms but {} operands were given",
            terms.len(),
            operands.len()
        );
    }
    let ell = terms
        .iter()
        .zip(operands)
        .filter(|(t, _)| t.ellipsis.is_some())
        .map(|(t, x)| x.rank().saturating_sub(t.letters.len()))
        .max()
        .unwrap_or(0);
    let labels = terms
        .iter()
        .zip(operands)
        .map(|(t, x)| labels_of(&eq, t, x, ell))
        .collect::<Result<Vec<_>>>()?;
    let out = output_labels(&eq, rhs, &labels, ell)?;
    let mut ops: Vec<(Tensor, Vec<Label>)> = vec![];
    for (x, l) in operands.iter().zip(labels) {
        ops.push(take_diagonals(&eq, x, l)?);
    }
    // sum each operand's labels that no other operand nor the output has
    for i in 0..ops.len() {
        let others: Vec<Label> = ops
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, (_, l))| l.clone())
            .chain(out.iter().copied())
            .collect();
        let (x, l) = &ops[i];
        ops[i] = sum_labels(x, l, |lb| !others.contains(&lb))?;
    }
    let mut it = ops.into_iter();
    let (mut acc, mut acc_l) = it.next().expect("one operand at least");
    let rest: Vec<_> = it.collect();
    for (i, (x, l)) in rest.iter().enumerate() {
        let needed: Vec<Label> = rest[i + 1..]
            .iter()
            .flat_map(|(_, l)| l.clone())
            .chain(out.iter().copied())
            .collect();
        (acc, acc_l) = contract(&acc, &acc_l, x, l, &needed)?;
    }
    let (acc, acc_l) = sum_labels(&acc, &acc_l, |lb| !out.contains(&lb))?;
    let perm: Vec<i64> = out
        .iter()
        .map(|o| acc_l.iter().position(|l| l == o).unwrap_or(0) as i64)
        .collect();
    if perm.is_empty() {
        return Ok(acc);
    }
    acc.permute(&perm)
}

/// The output's labels: the explicit term, or the ellipsis dims then the
/// letters used once, in alphabetical (ASCII) order.
fn output_labels(
    eq: &str,
    rhs: Option<&str>,
    labels: &[Vec<Label>],
    ell: usize,
) -> Result<Vec<Label>> {
    let ells = (0..ell).map(|k| ELLIPSIS + k as Label);
    let Some(r) = rhs else {
        let all: Vec<Label> = labels.iter().flatten().copied().collect();
        let mut once: Vec<Label> = all
            .iter()
            .copied()
            .filter(|&l| l < ELLIPSIS && all.iter().filter(|&&m| m == l).count() == 1)
            .collect();
        once.sort_unstable();
        return Ok(ells.chain(once).collect());
    };
    let t = parse_term(eq, r)?;
    let at = t.ellipsis.unwrap_or(t.letters.len());
    let mut out = t.letters[..at].to_vec();
    if t.ellipsis.is_some() {
        out.extend(ells);
    }
    out.extend_from_slice(&t.letters[at..]);
    for (i, l) in out.iter().enumerate() {
        if out[..i].contains(l) {
            bail!(
                "einsum",
                "output subscript '{}' appears more than once in '{eq}'",
                *l as u8 as char
            );
        }
        if *l < ELLIPSIS && !labels.iter().flatten().any(|m| m == l) {
            bail!(
                "einsum",
                "output subscript '{}' in '{eq}' does not appear in the operands",
                *l as u8 as char
            );
        }
    }
    Ok(out)
}

/// Replaces each repeated label of one operand by its diagonal (last dim).
fn take_diagonals(eq: &str, x: &Tensor, mut l: Vec<Label>) -> Result<(Tensor, Vec<Label>)> {
    let mut x = x.clone();
    while let Some((i, j)) =
        (0..l.len()).find_map(|i| (i + 1..l.len()).find(|&j| l[j] == l[i]).map(|j| (i, j)))
    {
        if x.dims()[i] != x.dims()[j] {
            bail!(
                "einsum",
                "subscript '{}' is repeated for an operand of shape {} in '{eq}' but the sizes differ",
                l[i] as u8 as char,
                fmt_dims(x.dims())
            );
        }
        x = x.diagonal(0, i as i64, j as i64)?;
        let lb = l[i];
        l.remove(j);
        l.remove(i);
        l.push(lb);
    }
    Ok((x, l))
}

/// Sums the dims whose label `drop` selects.
fn sum_labels(
    x: &Tensor,
    l: &[Label],
    drop: impl Fn(Label) -> bool,
) -> Result<(Tensor, Vec<Label>)> {
    let dims: Vec<i64> = (0..l.len())
        .filter(|&i| drop(l[i]))
        .map(|i| i as i64)
        .collect();
    if dims.is_empty() {
        return Ok((x.clone(), l.to_vec()));
    }
    let kept = l.iter().copied().filter(|&lb| !drop(lb)).collect();
    Ok((x.sum(Some(&dims), false)?, kept))
}

/// `a` permuted to `order` and broadcast to `sizes`, as `[rows, cols]`
/// after grouping the first `split` dims.
fn grouped(
    x: &Tensor,
    l: &[Label],
    order: &[Label],
    sizes: &[usize],
    split: [usize; 2],
) -> Result<Tensor> {
    let perm: Vec<i64> = order
        .iter()
        .map(|o| l.iter().position(|m| m == o).unwrap_or(0) as i64)
        .collect();
    let sz: Vec<i64> = sizes.iter().map(|&s| s as i64).collect();
    let p = if perm.is_empty() {
        x.clone()
    } else {
        x.permute(&perm)?.expand(&sz)?
    };
    let prod = |r: std::ops::Range<usize>| sizes[r].iter().product::<usize>() as i64;
    let (b, m) = (split[0], split[1]);
    p.reshape(&[prod(0..b), prod(b..m), prod(m..sizes.len())])
}

/// One pairwise contraction: labels in both and `needed` stay as batch
/// dims, labels in both and not needed are summed by the matmul.
fn contract(
    a: &Tensor,
    la: &[Label],
    b: &Tensor,
    lb: &[Label],
    needed: &[Label],
) -> Result<(Tensor, Vec<Label>)> {
    let (a, la) = sum_labels(a, la, |x| !lb.contains(&x) && !needed.contains(&x))?;
    let (b, lb) = sum_labels(b, lb, |x| !la.contains(&x) && !needed.contains(&x))?;
    let size = |x: Label| -> Result<usize> {
        let sa = la.iter().position(|&m| m == x).map(|i| a.dims()[i]);
        let sb = lb.iter().position(|&m| m == x).map(|i| b.dims()[i]);
        match (sa, sb) {
            (Some(p), Some(q)) if p != q && p != 1 && q != 1 => bail!(
                "einsum",
                "operands of shapes {} and {} do not broadcast at subscript '{}' ({p} vs {q})",
                fmt_dims(a.dims()),
                fmt_dims(b.dims()),
                if x >= ELLIPSIS { '.' } else { x as u8 as char }
            ),
            (Some(p), Some(q)) => Ok(p.max(q)),
            (p, q) => Ok(p.or(q).unwrap_or(1)),
        }
    };
    let batch: Vec<Label> = la
        .iter()
        .copied()
        .filter(|x| lb.contains(x) && needed.contains(x))
        .collect();
    let summed: Vec<Label> = la
        .iter()
        .copied()
        .filter(|x| lb.contains(x) && !needed.contains(x))
        .collect();
    let left: Vec<Label> = la.iter().copied().filter(|x| !lb.contains(x)).collect();
    let right: Vec<Label> = lb.iter().copied().filter(|x| !la.contains(x)).collect();
    let sizes = |ls: &[&[Label]]| -> Result<Vec<usize>> {
        ls.iter().flat_map(|l| l.iter()).map(|&x| size(x)).collect()
    };
    let (nb, nl, ns) = (batch.len(), left.len(), summed.len());
    let a_order: Vec<Label> = [&batch[..], &left, &summed].concat();
    let b_order: Vec<Label> = [&batch[..], &summed, &right].concat();
    let a3 = grouped(
        &a,
        &la,
        &a_order,
        &sizes(&[&batch, &left, &summed])?,
        [nb, nb + nl],
    )?;
    let b3 = grouped(
        &b,
        &lb,
        &b_order,
        &sizes(&[&batch, &summed, &right])?,
        [nb, nb + ns],
    )?;
    let y = bmm(&a3, &b3)?;
    let out_sizes: Vec<i64> = sizes(&[&batch, &left, &right])?
        .iter()
        .map(|&s| s as i64)
        .collect();
    let y = y.reshape(&out_sizes)?;
    Ok((y, [&batch[..], &left, &right].concat()))
}
