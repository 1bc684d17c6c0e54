//! One conv call by the algorithm [`select::choose`] picks: timing the
//! candidates on the batch's leading samples when benchmarking is on, then
//! running the choice with the call's epilogue.

use super::*;

/// Output positions (samples x OH x OW) each candidate is timed on, at
/// least: a sub-batch of small planes (ResNet-18's 7x7 at 2 samples) splits
/// into far fewer work items than the batch, and its ranking was wrong
/// there (im2col timed faster, the direct kernel 1.8x faster on the batch).
const TIMING_POSITIONS: usize = 4096;

/// Multiply-adds from which a conv's parallel regions go to the pool whole
/// ([`crate::par::pooled`]).
const POOLED_MACS: usize = 1 << 24;

/// The leading samples of `g`'s batch its candidates are timed on: at
/// least two and [`TIMING_POSITIONS`] output positions, at most the batch.
fn timing_samples(g: &ConvGeometry) -> usize {
    let per = positions(g).max(1);
    TIMING_POSITIONS.div_ceil(per).max(2).min(g.n)
}

/// [`conv2d`] by the algorithm [`select::choose`] picks (timing the
/// candidates on this call when benchmarking is on); returns that algorithm.
pub fn conv2d_call<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    call: ConvCall,
) -> Result<ConvAlgo> {
    check_lengths(g, input, weight, bias, out);
    if out.is_empty() {
        return Ok(select::heuristic(g));
    }
    let dtype = std::any::type_name::<T>();
    let key = call.weight_key;
    let mut failed = None;
    // candidates are timed on the batch's first samples: past a few thousand
    // output positions every algorithm's cost is linear in the batch, so the
    // ranking holds, and compile() to first output does not pay for whole
    // batches of large planes per candidate
    let sub = ConvGeometry {
        n: timing_samples(g),
        ..g.clone()
    };
    let (in_len, out_len) = (input.len() / g.n * sub.n, out.len() / g.n * sub.n);
    // a real model's layer (16M multiply-adds and up: a millisecond or
    // more) hands its regions to the pool whole (see `par::pooled`); its
    // candidates are timed that way too, as the whole batch will run
    let pooled = out.len() * (weight.len() / g.c_out.max(1)) >= POOLED_MACS;
    let mut last_run = None;
    let chosen = select::choose(g, dtype, &mut |trial| {
        let (x, y) = (&input[..in_len], &mut out[..out_len]);
        let Some(a) = trial else {
            touch(x, weight, y);
            for a in select::candidates(g) {
                prepack(a, g, weight, key);
            }
            return;
        };
        let run = || run_algorithm(a, &sub, x, weight, bias, y, None, key);
        if let Err(e) = crate::par::pooled(pooled, run) {
            failed.get_or_insert(e);
        }
        last_run = Some(a);
    });
    if let Some(e) = failed {
        return Err(e);
    }
    // timed on the whole batch with nothing to apply after: the chosen
    // algorithm's run, when it was the last one, left exactly this call's
    // output (the same computation; ResNet-18's 14x14 and 7x7 layers)
    let done = sub.n == g.n && call.epilogue.is_none() && last_run == Some(chosen.algo());
    if !done {
        crate::par::pooled(pooled, || {
            run_algorithm(
                chosen.algo(),
                g,
                input,
                weight,
                bias,
                out,
                call.epilogue,
                key,
            )
        })?;
    }
    select::note_run(chosen.algo());
    Ok(chosen.algo())
}

/// The first touch of a conv's operands before its candidates are timed:
/// the output's fresh pages faulted in, the input and weights read into
/// cache (one element per line), so no candidate pays for them. An untimed
/// run of the first candidate did the same at the cost of a whole conv
/// (about 50 ms of ResNet-18's compile() with an empty cache).
fn touch<T: Elem>(input: &[T], weight: &[T], out: &mut [T]) {
    out.fill(T::zero());
    let line = (64 / std::mem::size_of::<T>()).max(1);
    for x in input.iter().chain(weight).step_by(line) {
        std::hint::black_box(*x);
    }
}

/// Packs `algo`'s form of a parameter's weights into the packed-weight
/// cache before its candidates are timed: packing happens once per
/// parameter version, not per call, and Winograd's first timed run had
/// carried it (16 MiB of transformed weights for a 512-channel 3x3 conv),
/// so a busy minute could keep it out of the re-timed rounds; ResNet-18's
/// 7x7 layers then took im2col at 114 ms a model call against 95-96.
/// Without a key every call packs, and the timing keeps that cost.
fn prepack<T: Elem>(algo: ConvAlgo, g: &ConvGeometry, weight: &[T], key: Option<WeightKey>) {
    if key.is_none() {
        return;
    }
    match algo {
        ConvAlgo::WinogradF2x2 => drop(winograd::packed_weights(g, weight, key)),
        ConvAlgo::Direct => drop(direct::packed_weights(g, weight, key)),
        _ => {}
    }
}

/// Runs `algo` (which must apply to `g`).
#[allow(clippy::too_many_arguments)]
fn run_algorithm<T: Elem>(
    algo: ConvAlgo,
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
    key: Option<WeightKey>,
) -> Result<()> {
    match algo {
        ConvAlgo::Depthwise => depthwise::conv2d(g, input, weight, bias, out, epilogue),
        ConvAlgo::DepthwiseChannels => {
            depthwise_channels::conv2d(g, input, weight, bias, out, epilogue)
        }
        ConvAlgo::WinogradF2x2 => {
            let u = winograd::packed_weights(g, weight, key);
            winograd::conv2d(g, input, &u, bias, out, epilogue)
        }
        ConvAlgo::Im2colBatched => batched::conv2d(g, input, weight, bias, out, epilogue),
        ConvAlgo::Im2colWide => wide::conv2d(g, input, weight, bias, out, epilogue),
        ConvAlgo::Direct => direct::conv2d(g, input, weight, bias, out, epilogue, key),
        ConvAlgo::DirectChannels => direct_channels::conv2d(g, input, weight, bias, out, epilogue),
        ConvAlgo::Im2colGemm | ConvAlgo::Gemm1x1 => {
            im2col_gemm(g, input, weight, bias, out, epilogue)
        }
    }
}

fn check_lengths<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &[T],
) {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let [kh, kw] = g.kernel;
    let cpg = g.c_in_per_group();
    assert_eq!(
        input.len(),
        g.n * g.c_in * h * w,
        "conv2d: input length does not match geometry"
    );
    assert_eq!(
        weight.len(),
        g.c_out * cpg * kh * kw,
        "conv2d: weight length does not match geometry"
    );
    assert_eq!(
        out.len(),
        g.n * g.c_out * oh * ow,
        "conv2d: out length does not match geometry"
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            g.c_out,
            "conv2d: bias length does not match geometry"
        );
    }
}
