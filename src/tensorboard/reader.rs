//! Reads event files back: every event of one file, or the scalar curves of
//! a whole log folder.

use super::proto::Event;
use super::record::read_record;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// One point of a scalar curve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scalar {
    pub step: i64,
    pub wall_time: f64,
    pub value: f32,
}

fn io_err(path: &Path, msg: impl ToString) -> Error {
    Error::Io {
        path: path.display().to_string(),
        msg: msg.to_string(),
    }
}

/// The event files in `logdir` (names containing `tfevents`), oldest name first.
pub fn event_files(logdir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(logdir)
        .map_err(|e| io_err(logdir, e))?
        .filter_map(|d| d.ok().map(|d| d.path()))
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.contains("tfevents"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Every event in one file, in order; a bad CRC or a malformed message is
/// an error naming the file and the record.
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let mut r = BufReader::new(File::open(path).map_err(|e| io_err(path, e))?);
    let mut out = vec![];
    while let Some(payload) =
        read_record(&mut r).map_err(|e| io_err(path, format!("record {}: {e}", out.len())))?
    {
        let ev = Event::decode(&payload)
            .map_err(|e| io_err(path, format!("record {}: Event: {e}", out.len())))?;
        out.push(ev);
    }
    Ok(out)
}

/// The scalar curves of every event file in `logdir`, by tag, in file and
/// record order.
pub fn read_scalars(logdir: &Path) -> Result<BTreeMap<String, Vec<Scalar>>> {
    let files = event_files(logdir)?;
    if files.is_empty() {
        return Err(io_err(
            logdir,
            "no events.out.tfevents.* file in this folder",
        ));
    }
    let mut curves: BTreeMap<String, Vec<Scalar>> = BTreeMap::new();
    for f in files {
        for e in read_events(&f)? {
            for (tag, value) in e.scalars {
                curves.entry(tag).or_default().push(Scalar {
                    step: e.step,
                    wall_time: e.wall_time,
                    value,
                });
            }
        }
    }
    Ok(curves)
}
