//! TensorBoard event files: write scalar curves a `tensorboard --logdir`
//! reads, and read them back (the `kiln plot` input and the tests' oracle).
//!
//! A file is a stream of records in TensorFlow's `TFRecord` framing, each
//! holding one `Event` protobuf:
//!
//! | bytes | holds |
//! |---|---|
//! | 8 | payload length `n`, u64 little-endian |
//! | 4 | masked CRC-32C of those 8 bytes |
//! | n | the `Event` message |
//! | 4 | masked CRC-32C of the payload |
//!
//! The mask is TensorFlow's `((crc >> 15) | (crc << 17)) + 0xa282ead8`. The
//! first event carries `file_version = "brain.Event:2"`; each later one a
//! `wall_time`, a `step` and a `Summary` with one scalar (`simple_value`).
//! The protobuf is hand-encoded ([`proto`]): five fields of two messages do
//! not earn a code generator.
//!
//! ```
//! use kiln::tensorboard::{read_scalars, SummaryWriter};
//! let dir = std::env::temp_dir().join(format!("kiln-tb-doc-{}", std::process::id()));
//! let mut w = SummaryWriter::new(&dir).unwrap();
//! w.add_scalar("train/loss", 2.5, 1).unwrap();
//! w.flush().unwrap();
//! let curves = read_scalars(&dir).unwrap();
//! assert_eq!(curves["train/loss"][0].value, 2.5);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

pub mod proto;
mod reader;
mod record;
mod writer;

pub use reader::{event_files, read_events, read_scalars, Scalar};
pub use record::{masked_crc32c, read_record, write_record};
pub use writer::SummaryWriter;
