//! `torch.utils.tensorboard.SummaryWriter`'s scalar half.

use super::proto::Event;
use super::record::write_record;
use crate::{Error, Result};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Appends scalar events to a new `events.out.tfevents.*` file in a log
/// folder (created if missing), as `SummaryWriter(log_dir)` does.
///
/// Event files are append-only streams that TensorBoard reads while they
/// grow, so they are not written atomically: a record is whole once
/// [`SummaryWriter::flush`] returns, and a reader stops cleanly before a
/// half-written one.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("kiln-tb-writer-{}", std::process::id()));
/// let mut w = kiln::tensorboard::SummaryWriter::new(&dir).unwrap();
/// w.add_scalar("lr", 0.1, 0).unwrap();
/// assert!(w.path().file_name().unwrap().to_str().unwrap().starts_with("events.out.tfevents."));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub struct SummaryWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl SummaryWriter {
    /// Creates `logdir` and a fresh event file in it (named after the time,
    /// the host and the process, so runs writing the same folder never
    /// share a file).
    pub fn new(logdir: &Path) -> Result<SummaryWriter> {
        fs::create_dir_all(logdir).map_err(|e| io_err(logdir, e))?;
        let host = fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty() && !h.contains('/'))
            .unwrap_or_else(|| "localhost".into());
        let t = now();
        let mut n = 0;
        let path = loop {
            let p = logdir.join(format!(
                "events.out.tfevents.{}.{host}.{}.{n}",
                t as u64,
                std::process::id()
            ));
            if !p.exists() {
                break p;
            }
            n += 1;
        };
        let file = File::create(&path).map_err(|e| io_err(&path, e))?;
        let mut w = SummaryWriter {
            path,
            out: BufWriter::new(file),
        };
        w.write(&Event {
            wall_time: t,
            file_version: Some("brain.Event:2".into()),
            ..Event::default()
        })?;
        w.flush()?;
        Ok(w)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `add_scalar(tag, value, global_step)`.
    pub fn add_scalar(&mut self, tag: &str, value: f64, step: i64) -> Result<()> {
        self.write(&Event {
            wall_time: now(),
            step,
            file_version: None,
            scalars: vec![(tag.to_string(), value as f32)],
        })
    }

    /// Writes buffered records to the file.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| io_err(&self.path, e))
    }

    fn write(&mut self, e: &Event) -> Result<()> {
        write_record(&mut self.out, &e.encode()).map_err(|err| io_err(&self.path, err))
    }
}

impl Drop for SummaryWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}
