//! Fetching a row kernel's next input row while the current one is
//! finished.
//!
//! A normalisation or softmax makes three passes over each row: the first
//! reads it from memory, the others from L1. The hardware's L2 streamer
//! does not run far enough ahead to hide the next row's misses behind the
//! later passes, so the row helpers ask for it themselves. A C layer_norm
//! over 4M floats on 2 threads (Xeon, 48 KiB L1, plain stores) ran
//! 0.72-0.83 -> 0.61 ms with rows of 1024 floats, 0.85 -> 0.61 with 512,
//! 0.83 -> 0.74 with 2048, and 0.96 -> 1.09 with 4096, where the rows no
//! longer fit in L1 together: hence the L1 rule of [`next_row`]. Chain
//! rows (`chain.rs`) fetch their operands a fixed distance ahead with
//! [`line`] instead.

/// Fetches the `n` f32 at `next` into L1 when `rows` rows of `n` f32 (the
/// ones the current pass touches, and `next`) fit in the L1 data cache. A
/// null `next` (no next row) fetches nothing. `next` need not be mapped: a
/// prefetch never faults.
#[inline(always)]
pub(crate) fn next_row(next: *const f32, n: usize, rows: usize) {
    let bytes = n * std::mem::size_of::<f32>();
    if next.is_null() || rows * bytes > super::l1_data_cache() || !enabled() {
        return;
    }
    for at in (0..n).step_by(LINE_F32) {
        line(next.wrapping_add(at));
    }
}

/// f32 per 64-byte cache line.
pub(crate) const LINE_F32: usize = 64 / std::mem::size_of::<f32>();

/// Whether the helpers prefetch at all: `KILN_PREFETCH=0` turns every
/// software prefetch off (for A/B timing).
#[inline(always)]
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !std::env::var("KILN_PREFETCH").is_ok_and(|v| v == "0"))
}

/// Fetches the line holding `p` into L1 (a hint: it never faults).
#[inline(always)]
pub(crate) fn line(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint and never faults; SSE is baseline on x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::next_row;

    /// The row after a tensor's last row lies past its buffer, and a
    /// kernel asks for it all the same: that must never fault.
    #[test]
    fn fetching_past_any_buffer_never_faults() {
        let row = vec![1.0f32; 64];
        next_row(row.as_ptr().wrapping_add(1 << 40), 64, 1);
        next_row(usize::MAX as *const f32, 64, 1);
        next_row(std::ptr::null(), 64, 1);
        assert_eq!(row.iter().sum::<f32>(), 64.0);
    }
}
