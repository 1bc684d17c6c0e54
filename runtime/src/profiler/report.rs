//! What a profiling session produced: the events, `key_averages`-style
//! tables and Chrome trace export.

use super::{Category, Event};
use kiln_ir::{Error, Result};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// The events of one session, with their nesting.
#[derive(Debug, Clone)]
pub struct Profile {
    events: Vec<Event>,
    /// Index of each event's parent (the enclosing event on its thread).
    parents: Vec<Option<usize>>,
    /// Each event's self time: its duration minus its children's.
    self_ns: Vec<u64>,
    threads: Vec<(u64, String)>,
    wall_ns: u64,
}

/// One row of [`Profile::key_averages`]: all events with the same name and
/// category (and input shapes, when grouped by them).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyAverage {
    pub name: String,
    pub category: Category,
    /// Set when grouping by input shapes.
    pub shapes: Option<Vec<Vec<usize>>>,
    pub calls: usize,
    /// Inclusive time: the events' durations, children included.
    pub total_ns: u64,
    /// Exclusive time: the durations minus those of child events.
    pub self_ns: u64,
    pub bytes: u64,
}

impl KeyAverage {
    pub fn mean_ns(&self) -> u64 {
        self.total_ns / self.calls.max(1) as u64
    }
}

impl Profile {
    /// `events` sorted by (tid, seq); `threads` the (tid, name) of the threads that recorded.
    pub(super) fn new(events: Vec<Event>, threads: Vec<(u64, String)>, wall_ns: u64) -> Profile {
        let mut parents = vec![None; events.len()];
        let mut self_ns: Vec<u64> = events.iter().map(|e| e.dur_ns).collect();
        // per thread, in opening order: the open event at each depth (None:
        // an ancestor opened before the session started, so not recorded)
        let mut stack: Vec<Option<usize>> = vec![];
        let mut tid = None;
        for (i, e) in events.iter().enumerate() {
            if tid != Some(e.tid) {
                stack.clear();
                tid = Some(e.tid);
            }
            let d = e.depth as usize;
            stack.truncate(d);
            stack.resize(d, None);
            let parent = stack.last().copied().flatten().filter(|&p| {
                let q = &events[p];
                q.start_ns <= e.start_ns && e.end_ns() <= q.end_ns()
            });
            if let Some(p) = parent {
                parents[i] = Some(p);
                self_ns[p] = self_ns[p].saturating_sub(e.dur_ns);
            }
            stack.push(Some(i));
        }
        Profile {
            events,
            parents,
            self_ns,
            threads,
            wall_ns,
        }
    }

    /// Every recorded event, grouped by thread, in the order they were opened.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The enclosing event of `events()[i]` on its thread, if recorded.
    pub fn parent(&self, i: usize) -> Option<usize> {
        self.parents[i]
    }

    /// Self time of `events()[i]`: its duration minus its children's.
    pub fn self_ns(&self, i: usize) -> u64 {
        self.self_ns[i]
    }

    /// (profiler thread id, thread name) of every thread that recorded.
    pub fn threads(&self) -> &[(u64, String)] {
        &self.threads
    }

    /// Wall time of the session.
    pub fn wall_ns(&self) -> u64 {
        self.wall_ns
    }

    /// Sum of self times: the time covered by outermost events, all threads.
    pub fn self_total_ns(&self) -> u64 {
        self.self_ns.iter().sum()
    }

    /// `prof.key_averages(group_by_input_shape=...)`: one row per name and
    /// category (and shapes), sorted by total time, longest first.
    pub fn key_averages(&self, group_by_shapes: bool) -> Vec<KeyAverage> {
        type Key<'a> = (&'a str, Category, Option<&'a [Vec<usize>]>);
        let mut rows: HashMap<Key, KeyAverage> = HashMap::new();
        for (i, e) in self.events.iter().enumerate() {
            let shapes = group_by_shapes.then_some(e.shapes.as_slice());
            let r = rows
                .entry((&e.name, e.category, shapes))
                .or_insert_with(|| KeyAverage {
                    name: e.name.to_string(),
                    category: e.category,
                    shapes: shapes.map(<[_]>::to_vec),
                    calls: 0,
                    total_ns: 0,
                    self_ns: 0,
                    bytes: 0,
                });
            r.calls += 1;
            r.total_ns += e.dur_ns;
            r.self_ns += self.self_ns[i];
            r.bytes += e.bytes;
        }
        let mut v: Vec<KeyAverage> = rows.into_values().collect();
        v.sort_by(|a, b| {
            (b.total_ns, b.self_ns)
                .cmp(&(a.total_ns, a.self_ns))
                .then_with(|| {
                    (&a.name, a.category, &a.shapes).cmp(&(&b.name, b.category, &b.shapes))
                })
        });
        v
    }

    /// `prof.key_averages().table(sort_by="cpu_time_total")`: every row.
    /// See [`Profile::table_top`].
    pub fn table(&self, group_by_shapes: bool) -> String {
        self.table_top(group_by_shapes, usize::MAX)
    }

    /// The table of [`key_averages`](Profile::key_averages), at most
    /// `row_limit` rows, sorted by total time. Columns: name, category, calls,
    /// total (inclusive: children included), self (exclusive), self % (of the
    /// sum of all self times, so the column adds up to 100 over all rows),
    /// mean (total / calls), bytes moved, and with `group_by_shapes` the input
    /// shapes. Nested events of one name (an op calling itself) count twice in
    /// total, as in PyTorch; self time never double-counts.
    pub fn table_top(&self, group_by_shapes: bool, row_limit: usize) -> String {
        let rows = self.key_averages(group_by_shapes);
        let all_self = self.self_total_ns().max(1) as f64;
        let shown = &rows[..rows.len().min(row_limit)];
        let w = shown
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(4, 48);
        let mut s = String::new();
        let _ = write!(
            s,
            "{:<w$}  {:<8} {:>7} {:>11} {:>11} {:>7} {:>11} {:>10}",
            "Name", "Category", "Calls", "Total", "Self", "Self %", "Mean", "Bytes"
        );
        if group_by_shapes {
            s += "  Input shapes";
        }
        let line = "-".repeat(s.len());
        s = format!("{line}\n{s}\n{line}\n");
        for r in shown {
            let _ = write!(
                s,
                "{:<w$}  {:<8} {:>7} {:>11} {:>11} {:>6.2}% {:>11} {:>10}",
                truncate(&r.name, w),
                r.category.as_str(),
                r.calls,
                fmt_ns(r.total_ns),
                fmt_ns(r.self_ns),
                100.0 * r.self_ns as f64 / all_self,
                fmt_ns(r.mean_ns()),
                fmt_bytes(r.bytes),
            );
            if let Some(sh) = &r.shapes {
                let _ = write!(s, "  {}", fmt_shapes(sh));
            }
            s.truncate(s.trim_end().len());
            s += "\n";
        }
        let _ = writeln!(
            s,
            "{line}\nSelf time total: {} over {} events on {} thread(s); {} rows{}; session wall time {}",
            fmt_ns(self.self_total_ns()),
            self.events.len(),
            self.threads.len(),
            rows.len(),
            if shown.len() < rows.len() {
                format!(" ({} shown)", shown.len())
            } else {
                String::new()
            },
            fmt_ns(self.wall_ns),
        );
        s
    }

    /// The Chrome trace JSON (`chrome://tracing`, <https://ui.perfetto.dev>):
    /// one complete event (`"ph":"X"`, `ts`/`dur` in microseconds) per
    /// recorded event, ordered by thread then start time, plus process and
    /// thread name metadata (`"ph":"M"`). `args` carry the input shapes and bytes.
    pub fn chrome_trace_json(&self) -> String {
        let pid = std::process::id();
        let mut s = String::from("{\"traceEvents\":[\n");
        let _ = write!(
            s,
            "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"kiln\"}}}}"
        );
        for (tid, name) in &self.threads {
            let _ = write!(
                s,
                ",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                json_str(name)
            );
            let _ = write!(
                s,
                ",\n{{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}}}"
            );
        }
        for (i, e) in self.events.iter().enumerate() {
            let _ = write!(
                s,
                ",\n{{\"ph\":\"X\",\"cat\":\"{}\",\"name\":{},\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{},\"args\":{{\"shapes\":{},\"bytes\":{},\"self_us\":{}}}}}",
                e.category.as_str(),
                json_str(&e.name),
                e.tid,
                fmt_us(e.start_ns),
                fmt_us(e.dur_ns),
                json_shapes(&e.shapes),
                e.bytes,
                fmt_us(self.self_ns[i]),
            );
        }
        s += "\n],\"displayTimeUnit\":\"ms\"}\n";
        s
    }

    /// `prof.export_chrome_trace(path)`: writes [`chrome_trace_json`](Profile::chrome_trace_json)
    /// atomically (a temporary file in the same folder, then a rename), creating
    /// the folder if needed.
    pub fn export_chrome_trace(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |e: std::io::Error| Error::Io {
            path: path.display().to_string(),
            msg: format!("cannot write the chrome trace: {e}"),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        crate::atomic_file::write(path, self.chrome_trace_json().as_bytes()).map_err(io)
    }
}

fn truncate(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(w - 3).collect();
        t += "...";
        t
    }
}

/// `1.234s`, `12.345ms`, `123.456us`.
pub(crate) fn fmt_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns >= 1e9 {
        format!("{:.3}s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3}ms", ns / 1e6)
    } else {
        format!("{:.3}us", ns / 1e3)
    }
}

fn fmt_bytes(b: u64) -> String {
    let b = b as f64;
    if b == 0.0 {
        String::new()
    } else if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// `[[32, 1, 8, 8], [16, 1, 3, 3]]`, as PyTorch prints input shapes.
fn fmt_shapes(sh: &[Vec<usize>]) -> String {
    let parts: Vec<String> = sh
        .iter()
        .map(|d| {
            let d: Vec<String> = d.iter().map(usize::to_string).collect();
            format!("[{}]", d.join(", "))
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Nanoseconds as exact decimal microseconds (`1234.567`).
fn fmt_us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn json_shapes(sh: &[Vec<usize>]) -> String {
    fmt_shapes(sh).replace(' ', "")
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o += "\\\"",
            '\\' => o += "\\\\",
            '\n' => o += "\\n",
            '\t' => o += "\\t",
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}
