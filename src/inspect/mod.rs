//! Looking into a dataset written by `pack` without Python: `pack info` ([`info`]) says what it
//! holds, `pack ls` ([`list`]) lists its samples.
//!
//! Both read through [`imgpack_reader`], as every user of the format does, with checksums off:
//! they look at metadata, labels and field sizes, not at image bytes (`pack verify` checks
//! those), so on a memory-mapped dataset the images' pages are never read.

pub mod info;
pub mod list;

use std::path::Path;

/// Opens `path` for looking at: checksums off, since neither command reads image bytes.
fn open(path: &Path) -> crate::Result<imgpack_reader::Dataset> {
    Ok(imgpack_reader::open(path)?.verify_checksums(false)?)
}
