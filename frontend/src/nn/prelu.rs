//! `nn.PReLU`: a ReLU whose negative slope is learned, one per channel or shared.

use super::layers::param;
use super::{Entry, EntryMut, Module};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `nn.PReLU(num_parameters=1, init=0.25)`: `x` where `x > 0`, else `weight * x`,
/// with `weight[c]` for channel `c` (dim 1, or dim 0 of a 1-D input).
///
/// ```
/// use kiln_frontend::nn::{Module, PReLU};
/// use kiln_frontend::Tensor;
/// let p = PReLU::new(1, 0.25).unwrap();
/// let y = p.forward(&Tensor::from_vec(vec![-4.0f32, 2.0], &[2]).unwrap()).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.0, 2.0]);
/// ```
pub struct PReLU {
    pub weight: Tensor,
}

impl PReLU {
    pub fn new(num_parameters: usize, init: f64) -> Result<PReLU> {
        if num_parameters == 0 {
            bail!("PReLU", "num_parameters must be at least 1");
        }
        let weight = param(&[num_parameters]);
        super::init::constant_(&weight, init)?;
        Ok(PReLU { weight })
    }
}

impl Module for PReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            let c = self.weight.dims()[0];
            let w = if c == 1 {
                self.weight.clone()
            } else {
                let ch = usize::from(x.rank() >= 2);
                if x.rank() == 0 || x.dims()[ch] != c {
                    bail!(
                        "PReLU",
                        "num_parameters ({c}) must equal the channel count (dim {ch}) of the input {}",
                        fmt_dims(x.dims())
                    );
                }
                let mut dims = vec![1; x.rank()];
                dims[ch] = c;
                self.weight.reshape_dims(&dims)?
            };
            let positive = x.gt(&Tensor::zeros(&[], x.dtype()))?;
            Tensor::where_(&positive, x, &x.mul(&w)?)
        })
    }
    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        f(Entry::Param("weight", &self.weight))
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        f(EntryMut::Param("weight", &mut self.weight))
    }
    fn describe(&self) -> String {
        format!("PReLU(num_parameters={})", self.weight.dims()[0])
    }
}
