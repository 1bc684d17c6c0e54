//! Dynamic dims by tracing more than once.
//!
//! A traced graph is concrete: every shape in it (each value's type, a
//! `view`'s target shape) is a number. To export a graph that runs at any
//! batch size, [`super::export`] traces the model at the example size, once
//! more per dynamic dim with that dim one larger, and once with every dynamic
//! dim three larger. The printed graphs must then be the same text except for
//! some integers; each integer that changes is fitted as `c + k1*d1 + k2*d2 ...`
//! from the first traces, and the last trace checks every fit (a value that
//! depends on a dim in any other way, or a graph whose structure changes with
//! it, is an error rather than a guess). The result is a [`Template`]: the
//! example graph's text plus, for each integer that depends on the dims, its
//! expression, from which the graph at any sizes is printed and parsed again.
//!
//! ```
//! use kiln::export::symbolic::{fit, Samples};
//! let texts = ["view [4,32]", "view [5,32]", "view [7,32]"];
//! let t = fit(&Samples { base: &[4], texts: &texts }).unwrap();
//! assert_eq!(t.instantiate(&[10]).unwrap(), "view [10,32]");
//! ```

use kiln_ir::{bail, Result};

/// An integer as an affine function of the dynamic dims: `constant + Σ coefs[i] * dims[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affine {
    pub constant: i64,
    pub coefs: Vec<i64>,
}

impl Affine {
    /// The value at the given dim sizes.
    pub fn eval(&self, dims: &[usize]) -> i64 {
        self.constant
            + self
                .coefs
                .iter()
                .zip(dims)
                .map(|(k, d)| k * *d as i64)
                .sum::<i64>()
    }

    /// `32*batch`, `batch+1`, `7`: the expression with the dims' names.
    pub fn display(&self, names: &[String]) -> String {
        let mut parts = vec![];
        for (k, n) in self.coefs.iter().zip(names) {
            match *k {
                0 => {}
                1 => parts.push(n.clone()),
                k => parts.push(format!("{k}*{n}")),
            }
        }
        if self.constant != 0 || parts.is_empty() {
            parts.push(self.constant.to_string());
        }
        parts.join("+").replace("+-", "-")
    }
}

/// One integer of the template text that depends on the dims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// Which digit run of the text (counting from 0).
    pub run: usize,
    pub expr: Affine,
}

/// A graph text with its dim-dependent integers marked.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The text at the example sizes.
    pub text: String,
    pub sites: Vec<Site>,
}

/// The traces to fit: `texts[0]` at the sizes `base`, `texts[1 + i]` with dim
/// `i` one larger, and the last one with every dim three larger.
pub struct Samples<'a> {
    pub base: &'a [usize],
    pub texts: &'a [&'a str],
}

/// The sizes each trace of [`Samples`] uses, in order.
pub fn sample_sizes(base: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![base.to_vec()];
    for i in 0..base.len() {
        let mut s = base.to_vec();
        s[i] += 1;
        out.push(s);
    }
    out.push(base.iter().map(|d| d + 3).collect());
    out
}

/// A text cut into digit runs and the text between them.
struct Runs<'a> {
    /// `(start, end)` byte ranges of the digit runs.
    runs: Vec<(usize, usize)>,
    text: &'a str,
}

impl<'a> Runs<'a> {
    fn of(text: &'a str) -> Runs<'a> {
        let b = text.as_bytes();
        let mut runs = vec![];
        let mut i = 0;
        while i < b.len() {
            if b[i].is_ascii_digit() {
                let s = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                runs.push((s, i));
            } else {
                i += 1;
            }
        }
        Runs { runs, text }
    }

    fn digits(&self, k: usize) -> &'a str {
        &self.text[self.runs[k].0..self.runs[k].1]
    }

    /// The text between run `k - 1` and run `k` (k = runs.len(): the tail).
    fn between(&self, k: usize) -> &'a str {
        let s = if k == 0 { 0 } else { self.runs[k - 1].1 };
        let e = self.runs.get(k).map_or(self.text.len(), |r| r.0);
        &self.text[s..e]
    }

    /// True when run `k` is a whole integer (not part of a float's digits).
    fn is_integer(&self, k: usize) -> bool {
        let b = self.text.as_bytes();
        let (s, e) = self.runs[k];
        let before = s.checked_sub(1).map(|i| b[i]);
        let before2 = s.checked_sub(2).map(|i| b[i]);
        let after = b.get(e).copied();
        let digits = &b[s..e];
        !(before == Some(b'.')
            || after == Some(b'.')
            || matches!(after, Some(b'e' | b'E'))
            || matches!(before, Some(b'e' | b'E'))
            || (matches!(before, Some(b'-' | b'+')) && matches!(before2, Some(b'e' | b'E')))
            || (digits.len() > 1 && digits[0] == b'0'))
    }
}

/// Where two texts first differ, for messages.
fn context(text: &str, at: usize) -> String {
    let s = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let e = text[at..].find('\n').map_or(text.len(), |i| at + i);
    text[s..e].trim().to_string()
}

/// Fits the dim-dependent integers of the traces (see the module docs).
pub fn fit(s: &Samples) -> Result<Template> {
    let d = s.base.len();
    if s.texts.len() != d + 2 {
        bail!(
            "export",
            "{} traces for {d} dynamic dims (need {})",
            s.texts.len(),
            d + 2
        );
    }
    let runs: Vec<Runs> = s.texts.iter().map(|t| Runs::of(t)).collect();
    let base = &runs[0];
    for (t, r) in runs.iter().enumerate().skip(1) {
        let n = base.runs.len().min(r.runs.len());
        for k in 0..=n {
            if k == n && base.runs.len() == r.runs.len() && base.between(k) == r.between(k) {
                break;
            }
            if k == n || base.between(k) != r.between(k) {
                let at = base.runs.get(k).map_or(base.text.len(), |x| x.0);
                bail!(
                    "export",
                    "the traced graph's structure changes with the dynamic dims (trace {t} at sizes {:?} differs from the example's near `{}`); it cannot be exported with these dims dynamic",
                    sample_sizes(s.base)[t],
                    context(base.text, at)
                );
            }
        }
    }
    let sizes = sample_sizes(s.base);
    let mut sites = vec![];
    for k in 0..base.runs.len() {
        let vals: Vec<&str> = runs.iter().map(|r| r.digits(k)).collect();
        if vals.iter().all(|v| *v == vals[0]) {
            continue;
        }
        let line = context(base.text, base.runs[k].0);
        if !runs.iter().all(|r| r.is_integer(k)) {
            bail!(
                "export",
                "a non-integer value in `{line}` depends on the dynamic dims; it cannot be exported with these dims dynamic"
            );
        }
        let parse = |v: &str| {
            v.parse::<i64>()
                .map_err(|_| kiln_ir::Error::op("export", format!("integer `{v}` out of range")))
        };
        let v0 = parse(vals[0])?;
        let mut coefs = vec![];
        for i in 0..d {
            coefs.push(parse(vals[1 + i])? - v0);
        }
        let mut expr = Affine { constant: 0, coefs };
        expr.constant = v0 - expr.eval(s.base);
        let check = parse(vals[d + 1])?;
        if expr.eval(&sizes[d + 1]) != check {
            bail!(
                "export",
                "a value in `{line}` depends on the dynamic dims other than linearly ({} at sizes {:?}, {} at {:?}); it cannot be exported with these dims dynamic",
                vals[0],
                s.base,
                check,
                sizes[d + 1]
            );
        }
        sites.push(Site { run: k, expr });
    }
    Ok(Template {
        text: s.texts[0].to_string(),
        sites,
    })
}

impl Template {
    /// Checks that the sites fit the text at the example sizes (a file's consistency check).
    pub fn check(&self, base: &[usize]) -> Result<()> {
        let runs = Runs::of(&self.text);
        for site in &self.sites {
            if site.run >= runs.runs.len() || site.expr.coefs.len() != base.len() {
                bail!(
                    "export",
                    "dynamic-dim site {} does not fit the graph text",
                    site.run
                );
            }
            let want = site.expr.eval(base).to_string();
            if runs.digits(site.run) != want {
                bail!(
                    "export",
                    "dynamic-dim site {} reads `{}` in the graph text, its expression gives {want}",
                    site.run,
                    runs.digits(site.run)
                );
            }
        }
        Ok(())
    }

    /// The text with every site evaluated at `dims`.
    pub fn instantiate(&self, dims: &[usize]) -> Result<String> {
        let runs = Runs::of(&self.text);
        let mut out = String::with_capacity(self.text.len());
        let mut last = 0;
        for site in &self.sites {
            let (s, e) = runs.runs[site.run];
            let v = site.expr.eval(dims);
            if v < 0 {
                bail!(
                    "export",
                    "sizes {dims:?} make a graph value negative ({v}); the dims are too small for this model"
                );
            }
            out.push_str(&self.text[last..s]);
            out.push_str(&v.to_string());
            last = e;
        }
        out.push_str(&self.text[last..]);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_linear_integers_and_keeps_floats() {
        let t = [
            "a [4,32] x=128 f=0.5 e=1e-5",
            "a [5,32] x=160 f=0.5 e=1e-5",
            "a [7,32] x=224 f=0.5 e=1e-5",
        ];
        let tpl = fit(&Samples {
            base: &[4],
            texts: &t,
        })
        .unwrap();
        assert_eq!(tpl.sites.len(), 2);
        assert_eq!(tpl.sites[1].expr.display(&["batch".into()]), "32*batch");
        assert_eq!(tpl.instantiate(&[1]).unwrap(), "a [1,32] x=32 f=0.5 e=1e-5");
        tpl.check(&[4]).unwrap();
    }

    #[test]
    fn refuses_nonlinear_or_structural_changes() {
        let sq = ["n=16", "n=25", "n=49"];
        let e = fit(&Samples {
            base: &[4],
            texts: &sq,
        })
        .unwrap_err();
        assert!(e.to_string().contains("other than linearly"), "{e}");
        let st = ["a b", "a c", "a b"];
        let e = fit(&Samples {
            base: &[4],
            texts: &st,
        })
        .unwrap_err();
        assert!(e.to_string().contains("structure changes"), "{e}");
        let fl = ["m=0.25", "m=0.2", "m=0.14"];
        assert!(fit(&Samples {
            base: &[4],
            texts: &fl
        })
        .is_err());
    }
}
