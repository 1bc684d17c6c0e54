//! [`Constant`]: a literal tensor in a graph — one value broadcast to the
//! whole shape (`full`), or every element of a small tensor.

use super::AttrValue;
use crate::op::Meta;
use crate::shape::fmt_dims;
use crate::{bail, DType, Float, Result};

/// A literal: `values` holds one value (every element equals it) or one per
/// element, row-major. Integer and bool values are whole numbers (bool: 0 or 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Constant {
    pub meta: Meta,
    pub values: Vec<Float>,
}

impl Constant {
    /// A 0-dim tensor holding `value`.
    pub fn scalar(value: f64, dtype: DType) -> Constant {
        Constant::full(value, Meta::new(dtype, &[]))
    }

    /// A tensor of type `meta` with every element `value`.
    pub fn full(value: f64, meta: Meta) -> Constant {
        Constant {
            meta,
            values: vec![Float(value)],
        }
    }

    /// Every element of a tensor of type `meta`, row-major.
    pub fn literal(values: &[f64], meta: Meta) -> Result<Constant> {
        let c = Constant {
            meta,
            values: values.iter().map(|&v| Float(v)).collect(),
        };
        c.check()?;
        Ok(c)
    }

    /// Whether all elements are equal (a single stored value).
    pub fn is_splat(&self) -> bool {
        self.values.len() == 1
    }

    /// Element `i` (row-major) as `f64`.
    pub fn value(&self, i: usize) -> f64 {
        if self.is_splat() {
            self.values[0].0
        } else {
            self.values[i].0
        }
    }

    /// The values fit the dtype and their count is 1 or the element count.
    pub fn check(&self) -> Result<()> {
        let numel: usize = self.meta.dims.iter().product();
        let (dt, dims) = (self.meta.dtype, fmt_dims(&self.meta.dims));
        if self.values.len() != 1 && self.values.len() != numel {
            bail!(
                "constant",
                "{} values for a {dt}{dims} tensor (expected 1 or {numel})",
                self.values.len()
            );
        }
        for v in &self.values {
            let v = v.0;
            let ok = match dt {
                DType::Bool => v == 0.0 || v == 1.0,
                _ if dt.is_float() => true,
                _ => v.is_finite() && v.fract() == 0.0,
            };
            if !ok {
                bail!(
                    "constant",
                    "value {} does not fit a {dt}{dims} tensor",
                    Float(v)
                );
            }
        }
        Ok(())
    }

    /// The `value=` attribute of the text form: floats for float dtypes,
    /// whole numbers otherwise; a list unless it is a splat.
    pub(crate) fn attr(&self) -> AttrValue {
        let as_int = !self.meta.dtype.is_float();
        match (self.values.as_slice(), as_int) {
            ([v], false) => AttrValue::Float(*v),
            ([v], true) => AttrValue::Int(v.0 as i64),
            (vs, false) => AttrValue::Floats(vs.to_vec()),
            (vs, true) => AttrValue::Ints(vs.iter().map(|v| v.0 as i64).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_count_and_dtype() {
        assert!(Constant::literal(&[1.0, 2.0], Meta::new(DType::F32, &[3])).is_err());
        assert!(Constant::literal(&[1.5], Meta::new(DType::I64, &[1])).is_err());
        assert!(Constant::literal(&[2.0], Meta::new(DType::Bool, &[])).is_err());
        let c = Constant::literal(&[1.0, 2.0, 3.0], Meta::new(DType::I32, &[3])).unwrap();
        assert_eq!(c.attr().to_string(), "[1,2,3]");
        assert_eq!(Constant::scalar(0.5, DType::F32).attr().to_string(), "0.5");
        assert_eq!(
            Constant::scalar(1e-5, DType::F64).attr().to_string(),
            "1e-5"
        );
    }
}
