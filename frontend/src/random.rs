//! Seeded random numbers: [`Generator`], the process-wide default generator
//! ([`manual_seed`]) and the tensor factories that draw from them.
//!
//! A [`Generator`] is ChaCha20 (crate `rand_chacha`) keyed from a seed. It can be
//! split into independent streams ([`Generator::split`], [`Generator::derive`]),
//! and its full state saved and restored ([`Generator::state`]) for checkpoints.
//!
//! **Values are reproducible for a seed, on every platform, but are not PyTorch's
//! bit for bit** (PyTorch uses a Mersenne Twister / Philox): `kiln::manual_seed(0)`
//! gives the same numbers run after run, not the numbers `torch.manual_seed(0)` gives.
//!
//! How values are drawn (part of the reproducibility contract): elements are
//! filled in row-major order; `f64` draws take one 64-bit word (53 bits), other
//! floating dtypes one 32-bit word (24 bits) and are rounded to the dtype;
//! normals use Box-Muller on pairs of f64 uniforms; integers in a range use
//! unbiased rejection on 64-bit words.
//!
//! Functions taking `gen: Option<&mut Generator>` use the default generator for `None`.
//!
//! ```
//! use kiln_frontend::random::{self, Generator};
//! random::manual_seed(7);
//! let a = random::randn(&[2, 3], None);
//! random::manual_seed(7);
//! assert_eq!(a.to_f64_vec(), random::randn(&[2, 3], None).to_f64_vec());
//! let mut g = Generator::new(1);
//! let p = random::randperm(5, Some(&mut g));
//! assert_eq!(p.dims(), &[5]);
//! ```

use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// PyTorch's default seed, used until [`manual_seed`] is called.
pub const DEFAULT_SEED: u64 = 67280421310721;

/// The ChaCha stream reserved for deriving child keys (the main stream is 0).
const DERIVE_STREAM: u64 = 1;

/// A seeded, splittable random generator (`torch.Generator`).
#[derive(Clone, Debug)]
pub struct Generator {
    seed: u64,
    rng: ChaCha20Rng,
}

/// Everything needed to resume a [`Generator`] exactly where it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratorState {
    pub seed: u64,
    pub key: [u8; 32],
    pub stream: u64,
    pub word_pos: u128,
}

/// Bytes in [`GeneratorState::to_bytes`].
pub const STATE_BYTES: usize = 8 + 32 + 8 + 16;

impl GeneratorState {
    /// Little-endian `seed | key | stream | word_pos` (64 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(STATE_BYTES);
        b.extend_from_slice(&self.seed.to_le_bytes());
        b.extend_from_slice(&self.key);
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.extend_from_slice(&self.word_pos.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<GeneratorState> {
        if b.len() != STATE_BYTES {
            bail!(
                "set_rng_state",
                "a generator state has {STATE_BYTES} bytes, got {}",
                b.len()
            );
        }
        Ok(GeneratorState {
            seed: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            key: b[8..40].try_into().expect("32 bytes"),
            stream: u64::from_le_bytes(b[40..48].try_into().expect("8 bytes")),
            word_pos: u128::from_le_bytes(b[48..64].try_into().expect("16 bytes")),
        })
    }

    /// The state as a `u8` tensor of shape `[64]` (like `torch.get_rng_state()`),
    /// ready to go into a checkpoint.
    pub fn to_tensor(&self) -> Tensor {
        Tensor::from_bytes(DType::U8, &[STATE_BYTES], &self.to_bytes())
    }

    pub fn from_tensor(t: &Tensor) -> Result<GeneratorState> {
        if t.dtype() != DType::U8 || t.dims() != [STATE_BYTES] {
            bail!(
                "set_rng_state",
                "expected a u8 tensor of shape [{STATE_BYTES}], got {} {}",
                t.dtype(),
                fmt_dims(t.dims())
            );
        }
        GeneratorState::from_bytes(&t.to_bytes())
    }
}

impl Generator {
    /// A generator seeded with `seed` (`torch.Generator().manual_seed(seed)`).
    pub fn new(seed: u64) -> Generator {
        Generator {
            seed,
            rng: ChaCha20Rng::seed_from_u64(seed),
        }
    }

    fn from_key(key: [u8; 32]) -> Generator {
        Generator {
            seed: u64::from_le_bytes(key[..8].try_into().expect("8 bytes")),
            rng: ChaCha20Rng::from_seed(key),
        }
    }

    /// Reseeds in place.
    pub fn manual_seed(&mut self, seed: u64) {
        *self = Generator::new(seed);
    }

    /// The seed this generator started from (for split/derived ones: a digest of their key).
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }

    /// A random 64-bit seed drawn from `self` (advances `self`), e.g. to seed a
    /// `DataLoader` or another [`Generator::new`].
    pub fn fork_seed(&mut self) -> u64 {
        self.next_u64()
    }

    /// An independent generator whose key is drawn from `self` (advances `self`):
    /// splitting the same state twice gives the same child.
    pub fn split(&mut self) -> Generator {
        let mut key = [0u8; 32];
        self.rng.fill_bytes(&mut key);
        Generator::from_key(key)
    }

    /// An independent generator that depends only on this generator's key and
    /// `tags` (not on how much has been drawn): `g.derive(&[epoch])`,
    /// `g.derive(&[epoch, worker])`. Different tags give unrelated streams.
    pub fn derive(&self, tags: &[u64]) -> Generator {
        let mut key = self.rng.get_seed();
        for &tag in tags {
            let mut r = ChaCha20Rng::from_seed(key);
            r.set_stream(DERIVE_STREAM);
            // 8 words (32 bytes) per tag: distinct tags read disjoint key material.
            r.set_word_pos(u128::from(tag) * 8);
            r.fill_bytes(&mut key);
        }
        Generator::from_key(key)
    }

    /// The full state (seed, key, stream and position).
    pub fn state(&self) -> GeneratorState {
        GeneratorState {
            seed: self.seed,
            key: self.rng.get_seed(),
            stream: self.rng.get_stream(),
            word_pos: self.rng.get_word_pos(),
        }
    }

    /// Restores a state from [`Generator::state`]: later draws repeat exactly.
    pub fn set_state(&mut self, s: &GeneratorState) {
        let mut rng = ChaCha20Rng::from_seed(s.key);
        rng.set_stream(s.stream);
        rng.set_word_pos(s.word_pos);
        *self = Generator { seed: s.seed, rng };
    }

    pub fn from_state(s: &GeneratorState) -> Generator {
        let mut g = Generator::new(0);
        g.set_state(s);
        g
    }

    pub fn next_u32(&mut self) -> u32 {
        self.rng.next_u32()
    }

    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, 1)` with 24 random bits.
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// A pair of independent standard normals (Box-Muller).
    pub fn normal_pair(&mut self) -> (f64, f64) {
        let u1 = 1.0 - self.uniform_f64(); // (0, 1]: ln is finite
        let u2 = self.uniform_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        (r * c, r * s)
    }

    /// One standard normal (draws a pair and drops the second).
    pub fn normal_f64(&mut self) -> f64 {
        self.normal_pair().0
    }

    /// Uniform integer in `[0, n)`, unbiased; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Generator::below: empty range");
        let zone = u64::MAX - (u64::MAX % n + 1) % n; // largest multiple of n, minus 1
        loop {
            let x = self.next_u64();
            if x <= zone {
                return x % n;
            }
        }
    }

    /// A uniformly random permutation of `0..n` (Fisher-Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i as u64 + 1) as usize;
            p.swap(i, j);
        }
        p
    }
}

impl Default for Generator {
    fn default() -> Self {
        Generator::new(DEFAULT_SEED)
    }
}

fn default_cell() -> &'static Mutex<Generator> {
    static DEFAULT: OnceLock<Mutex<Generator>> = OnceLock::new();
    DEFAULT.get_or_init(|| Mutex::new(Generator::default()))
}

/// The process-wide default generator (locked while the guard lives: do not
/// hold it across a call that draws from the default generator).
pub fn default_generator() -> MutexGuard<'static, Generator> {
    default_cell().lock().unwrap_or_else(|p| p.into_inner())
}

/// `torch.manual_seed`: reseeds the default generator, which parameter init,
/// dropout, `DataLoader` shuffling seeds and worker seeds all draw from.
pub fn manual_seed(seed: u64) {
    default_generator().manual_seed(seed);
}

/// The seed of the default generator.
pub fn initial_seed() -> u64 {
    default_generator().initial_seed()
}

/// `torch.get_rng_state()`.
pub fn get_rng_state() -> GeneratorState {
    default_generator().state()
}

/// `torch.set_rng_state()`.
pub fn set_rng_state(s: &GeneratorState) {
    default_generator().set_state(s);
}

/// Runs `f` with `gen`, or with the default generator when `gen` is `None`.
pub fn with_generator<R>(gen: Option<&mut Generator>, f: impl FnOnce(&mut Generator) -> R) -> R {
    match gen {
        Some(g) => f(g),
        None => f(&mut default_generator()),
    }
}

fn float_tensor(vals: Vec<f64>, dims: &[usize], dtype: DType, op: &str) -> Result<Tensor> {
    if !dtype.is_float() {
        bail!(op, "expected a floating dtype, got {dtype}");
    }
    let t = if dtype == DType::F64 {
        Tensor::from_vec(vals, dims)?
    } else {
        Tensor::from_vec(vals.into_iter().map(|v| v as f32).collect(), dims)?
    };
    t.to_dtype(dtype)
}

fn uniform_vals(n: usize, low: f64, high: f64, dtype: DType, g: &mut Generator) -> Vec<f64> {
    let wide = dtype == DType::F64;
    (0..n)
        .map(|_| {
            let u = if wide {
                g.uniform_f64()
            } else {
                g.uniform_f32() as f64
            };
            low + (high - low) * u
        })
        .collect()
}

fn normal_vals(n: usize, mean: f64, std: f64, g: &mut Generator) -> Vec<f64> {
    let mut v = Vec::with_capacity(n + 1);
    while v.len() < n {
        let (a, b) = g.normal_pair();
        v.push(mean + std * a);
        v.push(mean + std * b);
    }
    v.truncate(n);
    v
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Random numbers have no graph op yet: while tracing they are a graph break.
fn refuse_while_tracing(op: &str) -> Result<()> {
    crate::compile::trace::unsupported(
        op,
        "draws random numbers, which a traced graph cannot express yet",
    )
}

/// `torch.rand(dims)`: f32 uniform in `[0, 1)`.
/// (It cannot fail: while tracing, the graph break is reported when tracing ends.)
pub fn rand(dims: &[usize], gen: Option<&mut Generator>) -> Tensor {
    let _ = refuse_while_tracing("rand");
    uniform_impl(dims, 0.0, 1.0, DType::F32, gen).expect("f32 is floating")
}

/// `torch.randn(dims)`: f32 standard normal.
pub fn randn(dims: &[usize], gen: Option<&mut Generator>) -> Tensor {
    let _ = refuse_while_tracing("randn");
    normal_impl(dims, 0.0, 1.0, DType::F32, gen).expect("f32 is floating")
}

/// Uniform in `[low, high)` as a floating `dtype`.
pub fn uniform(
    dims: &[usize],
    low: f64,
    high: f64,
    dtype: DType,
    gen: Option<&mut Generator>,
) -> Result<Tensor> {
    refuse_while_tracing("uniform")?;
    uniform_impl(dims, low, high, dtype, gen)
}

fn uniform_impl(
    dims: &[usize],
    low: f64,
    high: f64,
    dtype: DType,
    gen: Option<&mut Generator>,
) -> Result<Tensor> {
    if !dtype.is_float() {
        bail!("uniform", "expected a floating dtype, got {dtype}");
    }
    let v = with_generator(gen, |g| uniform_vals(numel(dims), low, high, dtype, g));
    float_tensor(v, dims, dtype, "uniform")
}

/// Normal with `mean` and `std` as a floating `dtype`.
pub fn normal(
    dims: &[usize],
    mean: f64,
    std: f64,
    dtype: DType,
    gen: Option<&mut Generator>,
) -> Result<Tensor> {
    refuse_while_tracing("normal")?;
    normal_impl(dims, mean, std, dtype, gen)
}

fn normal_impl(
    dims: &[usize],
    mean: f64,
    std: f64,
    dtype: DType,
    gen: Option<&mut Generator>,
) -> Result<Tensor> {
    if !dtype.is_float() {
        bail!("normal", "expected a floating dtype, got {dtype}");
    }
    if std.is_nan() || std < 0.0 {
        bail!("normal", "std must be non-negative, got {std}");
    }
    let v = with_generator(gen, |g| normal_vals(numel(dims), mean, std, g));
    float_tensor(v, dims, dtype, "normal")
}

/// `torch.randint(low, high, dims)`: i64 uniform in `[low, high)`.
pub fn randint(low: i64, high: i64, dims: &[usize], gen: Option<&mut Generator>) -> Result<Tensor> {
    refuse_while_tracing("randint")?;
    if high <= low {
        bail!("randint", "empty range [{low}, {high})");
    }
    let span = high.wrapping_sub(low) as u64;
    let v: Vec<i64> = with_generator(gen, |g| {
        (0..numel(dims))
            .map(|_| low.wrapping_add(g.below(span) as i64))
            .collect()
    });
    Tensor::from_vec(v, dims)
}

/// `torch.randperm(n)`: an i64 permutation of `0..n`.
pub fn randperm(n: usize, gen: Option<&mut Generator>) -> Tensor {
    let _ = refuse_while_tracing("randperm");
    let p = with_generator(gen, |g| g.permutation(n));
    Tensor::from_vec(p.into_iter().map(|i| i as i64).collect(), &[n]).expect("sized")
}

/// A mask that is 1 with probability `p` and 0 otherwise, as `dtype`
/// (dropout keeps with `p = 1 - drop`).
pub fn bernoulli_mask(
    dims: &[usize],
    p: f64,
    dtype: DType,
    gen: Option<&mut Generator>,
) -> Result<Tensor> {
    refuse_while_tracing("bernoulli")?;
    if !(0.0..=1.0).contains(&p) {
        bail!("bernoulli", "probability must be in [0, 1], got {p}");
    }
    let v: Vec<u8> = with_generator(gen, |g| {
        (0..numel(dims))
            .map(|_| u8::from(g.uniform_f64() < p))
            .collect()
    });
    Tensor::from_vec(v, dims)?.to_dtype(dtype)
}

/// `torch.bernoulli(probs)`: each element is 1 with the probability in `probs`
/// (which must lie in `[0, 1]`); same dtype and shape as `probs`.
pub fn bernoulli(probs: &Tensor, gen: Option<&mut Generator>) -> Result<Tensor> {
    refuse_while_tracing("bernoulli")?;
    let ps = probs.to_f64_vec();
    if let Some(bad) = ps.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        bail!("bernoulli", "probabilities must be in [0, 1], got {bad}");
    }
    let v: Vec<u8> = with_generator(gen, |g| {
        ps.iter().map(|&p| u8::from(g.uniform_f64() < p)).collect()
    });
    Tensor::from_vec(v, probs.dims())?.to_dtype(probs.dtype())
}

impl Tensor {
    /// `tensor.uniform_(low, high)`: fills in place (floating tensors).
    pub fn uniform_(&self, low: f64, high: f64, gen: Option<&mut Generator>) -> Result<&Tensor> {
        refuse_while_tracing("uniform_")?;
        self.copy_(&uniform(self.dims(), low, high, self.dtype(), gen)?)?;
        Ok(self)
    }

    /// `tensor.normal_(mean, std)`: fills in place (floating tensors).
    pub fn normal_(&self, mean: f64, std: f64, gen: Option<&mut Generator>) -> Result<&Tensor> {
        refuse_while_tracing("normal_")?;
        self.copy_(&normal(self.dims(), mean, std, self.dtype(), gen)?)?;
        Ok(self)
    }

    /// `tensor.random_(low, high)` for integer or floating tensors.
    pub fn randint_(&self, low: i64, high: i64, gen: Option<&mut Generator>) -> Result<&Tensor> {
        refuse_while_tracing("randint_")?;
        self.copy_(&randint(low, high, self.dims(), gen)?.to_dtype(self.dtype())?)?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_values_different_seed_different() {
        let a = randn(&[100], Some(&mut Generator::new(3))).to_f64_vec();
        let b = randn(&[100], Some(&mut Generator::new(3))).to_f64_vec();
        let c = randn(&[100], Some(&mut Generator::new(4))).to_f64_vec();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn moments_are_right() {
        let mut g = Generator::new(0);
        let u = rand(&[20000], Some(&mut g)).to_f64_vec();
        let m = u.iter().sum::<f64>() / u.len() as f64;
        assert!((m - 0.5).abs() < 0.01, "{m}");
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let n = normal(&[20000], 2.0, 3.0, DType::F64, Some(&mut g))
            .unwrap()
            .to_f64_vec();
        let m = n.iter().sum::<f64>() / n.len() as f64;
        let v = n.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n.len() as f64;
        assert!(
            (m - 2.0).abs() < 0.1 && (v.sqrt() - 3.0).abs() < 0.1,
            "{m} {v}"
        );
        let b = bernoulli_mask(&[20000], 0.3, DType::F32, Some(&mut g)).unwrap();
        let s = b.to_f64_vec().iter().sum::<f64>() / 20000.0;
        assert!((s - 0.3).abs() < 0.02, "{s}");
    }

    #[test]
    fn randint_and_randperm() {
        let mut g = Generator::new(9);
        let r = randint(-3, 4, &[1000], Some(&mut g)).unwrap();
        assert_eq!(r.dtype(), DType::I64);
        let v = r.to_vec::<i64>().unwrap();
        assert!(v.iter().all(|x| (-3..4).contains(x)));
        assert!((-3..4).all(|k| v.contains(&k)));
        let mut p = randperm(50, Some(&mut g)).to_vec::<i64>().unwrap();
        assert_ne!(p, (0..50).collect::<Vec<_>>());
        p.sort();
        assert_eq!(p, (0..50).collect::<Vec<_>>());
        assert!(randint(2, 2, &[1], None).is_err());
    }

    #[test]
    fn state_round_trip_resumes_exactly() {
        let mut g = Generator::new(11);
        let _ = g.next_u32(); // odd word position
        let st = g.state();
        let a: Vec<u64> = (0..7).map(|_| g.next_u64()).collect();
        let st2 = GeneratorState::from_tensor(&st.to_tensor()).unwrap();
        assert_eq!(st, st2);
        let mut h = Generator::from_state(&st2);
        let b: Vec<u64> = (0..7).map(|_| h.next_u64()).collect();
        assert_eq!(a, b);
        assert_eq!(h.initial_seed(), 11);
        assert!(GeneratorState::from_bytes(&[0; 3]).is_err());
    }

    #[test]
    fn split_and_derive_are_independent_and_reproducible() {
        let g = Generator::new(5);
        let mut d1 = g.derive(&[1, 0]);
        let mut d2 = g.derive(&[1, 1]);
        let mut d1b = g.derive(&[1, 0]);
        let x: Vec<u64> = (0..4).map(|_| d1.next_u64()).collect();
        let y: Vec<u64> = (0..4).map(|_| d2.next_u64()).collect();
        let z: Vec<u64> = (0..4).map(|_| d1b.next_u64()).collect();
        assert_eq!(x, z);
        assert_ne!(x, y);
        // derive does not depend on the parent's position
        let mut g2 = g.clone();
        g2.next_u64();
        assert_eq!(g2.derive(&[1, 0]).next_u64(), x[0]);
        let mut a = Generator::new(5);
        let mut b = Generator::new(5);
        assert_eq!(a.split().next_u64(), b.split().next_u64());
        assert_ne!(a.split().next_u64(), a.next_u64());
    }

    #[test]
    fn in_place_fills_and_dtypes() {
        let t = Tensor::zeros(&[3, 4], DType::BF16);
        t.uniform_(-1.0, 1.0, Some(&mut Generator::new(1))).unwrap();
        let v = t.to_f64_vec();
        assert!(v.iter().all(|x| (-1.0..=1.0).contains(x)) && v.iter().any(|&x| x != 0.0));
        let t = Tensor::zeros(&[5], DType::F64);
        t.normal_(0.0, 1.0, Some(&mut Generator::new(1))).unwrap();
        assert!(t.to_f64_vec().iter().any(|&x| x != 0.0));
        assert!(uniform(&[2], 0.0, 1.0, DType::I64, None).is_err());
        assert!(bernoulli_mask(&[2], 1.5, DType::F32, None).is_err());
        let p = Tensor::from_vec(vec![0.0f32, 1.0, 1.0, 0.0], &[4]).unwrap();
        let b = bernoulli(&p, Some(&mut Generator::new(2))).unwrap();
        assert_eq!(b.to_f64_vec(), vec![0.0, 1.0, 1.0, 0.0]);
    }
}
