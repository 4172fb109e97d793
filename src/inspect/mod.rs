//! Looking into a dataset written by `pack` without Python: `pack info` ([`info`]) says what it
//! holds, `pack ls` ([`list`]) lists its samples.
//!
//! Both read through [`imgpack_reader`], as every user of the format does, with checksums off:
//! they look at metadata, labels and field sizes, not at image bytes (`pack verify` checks
//! those), so on a memory-mapped dataset the images' pages are never read. A dataset in an
//! object store is streamed, one GET per shard.

pub mod info;
pub mod list;

use std::path::Path;

/// Opens `path` (a directory, or an `s3://` prefix at `endpoint`) for looking at: checksums
/// off, since neither command reads image bytes.
fn open(path: &Path, endpoint: Option<&str>) -> crate::Result<imgpack_reader::Dataset> {
    Ok(imgpack_reader::open_with_endpoint(path, endpoint)?.verify_checksums(false)?)
}
