//! The memory hierarchy as the helpers see it: cache sizes from sysfs,
//! whether a launch streams its output past the caches, and the fence that
//! orders those streaming stores.

/// Whether a launch moving `bytes` (inputs and output) should store its
/// output past the caches: when it moves more than the last-level cache
/// holds, the output is evicted before anything reads it, and a streaming
/// store saves reading each line before writing it (W1's chain row 1.47 ->
/// 1.40 ms, medians of 6 alternating runs, Zen 4 with 32 MiB of L3).
/// The cache counted is at most [`SHARE_CAP`].
/// `KILN_STREAM=0` never streams, `KILN_STREAM=1` always does (for A/B
/// timing and tests).
pub(crate) fn streams(bytes: u64) -> bool {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    bytes
        >= *LIMIT.get_or_init(|| match std::env::var("KILN_STREAM").as_deref() {
            Ok("0") => u64::MAX,
            Ok("1") => 0,
            _ => last_level_cache().map_or(SHARE_CAP, |b| b.min(SHARE_CAP)) as u64,
        })
}

/// The most last-level cache a launch counts on: a small VM shares a big
/// L3 with its neighbours, so the size sysfs reports (260 MiB on a 2-vCPU
/// Xeon model 207) is not what stays its own. There, streaming from 32 MiB
/// ran W3 at 0.58-0.60 ms against 0.64-0.66 and W1 at 1.27-1.33 against
/// 1.34-1.37 (alternating runs); on a Zen 4 with 32 MiB of L3 nothing changes.
/// The cost, there: an intermediate that the next launch reads also streams
/// once its launch moves 32 MiB (ViT-B/16's MLP gelu), so ViT-B/16 compiled
/// ran 1-4% slower (7 alternating pairs) and eager W1, five launches of
/// 48 MiB, 4.4-4.6 -> 4.9 ms; which outputs are read next is the executor's
/// knowledge, not yet passed to the helpers.
const SHARE_CAP: usize = 32 << 20;

/// Orders the streaming stores this thread made before its later stores,
/// so a thread that synchronises with it afterwards (a launch's join) sees
/// them: x86's `sfence`, nothing elsewhere. Once per kernel call, not per
/// row: a fence after each of W3's rows held the next row's loads behind
/// the store drain (0.76-0.89 ms against 0.65-0.77 fenced per call, 6
/// alternating runs, Zen 4).
#[inline]
pub fn fence_streams() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and SSE is baseline on x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

/// The last-level cache's bytes, from Linux's sysfs.
fn last_level_cache() -> Option<usize> {
    caches().into_iter().max().map(|(_, _, bytes)| bytes)
}

/// cpu0's L1 data cache in bytes (32 KiB where sysfs does not say),
/// read once.
pub(crate) fn l1_data_cache() -> usize {
    static L1: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L1.get_or_init(|| {
        caches()
            .into_iter()
            .find(|&(level, data, _)| level == 1 && data)
            .map_or(32 << 10, |(_, _, bytes)| bytes)
    })
}

/// cpu0's caches from Linux's sysfs: level, whether it holds data, bytes.
fn caches() -> Vec<(u32, bool, usize)> {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return vec![];
    };
    let cache = |p: std::path::PathBuf| -> Option<(u32, bool, usize)> {
        let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
        let size = read("size")?;
        let size = size.trim();
        let (n, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
        let unit = match unit {
            "K" => 1 << 10,
            "M" => 1 << 20,
            _ => return None,
        };
        // without a type (some kernels) count it as data, as before
        let data = read("type").is_none_or(|t| t.trim() != "Instruction");
        Some((
            read("level")?.trim().parse().ok()?,
            data,
            n.parse::<usize>().ok()? * unit,
        ))
    };
    dir.filter_map(|e| cache(e.ok()?.path())).collect()
}
