//! The WebDataset layout, its index files, and its reader.
//!
//! This file holds the layout and [`WebDataset`], the reader. Each index format has a file of
//! its own beside it — `index.rs` ([`IndexHeader`], [`IndexEntry`]), `dali.rs`
//! ([`parse_dali_index`]) and `wids.rs` ([`WidsIndex`]) — as do shard naming (`shard.rs`) and the
//! tar member parser (`tar.rs`, [`parse_member`]). All of them are re-exported here:
//! `imgpack_reader::webdataset::NAME` is the one path to each.
//!
//! # Layout
//!
//! A dataset is a directory:
//!
//! | file | what |
//! |---|---|
//! | `{prefix}-000000.tar`, `-000001.tar`, ... | shards: plain ustar archives of regular files named `{key}.{ext}` ([`crate::key`]), all fields of a sample adjacent and sorted by extension, headers deterministic (mtime 0, uid/gid 0, mode 0644, no user or group names) |
//! | `{prefix}-000000.idx`, ... | one NVIDIA DALI index per shard, text format `v1.2` ([`dali_index_header`], [`dali_index_line`]) |
//! | `shardindex.json` | the `wids` shard index ([`WidsIndex`]) |
//! | `imgpack.json` | the dataset [`Meta`], with the shard list; written last |
//! | `imgpack.index` | this crate's binary sample index ([`IndexEntry`]): random access without parsing text |
//!
//! Shards never exceed the requested shard size (tar headers and the two end blocks included)
//! unless one sample alone is larger, and no shard is empty. Member names are at most 100 bytes,
//! so no PAX or GNU long-name records are ever needed, and keys hold no dot, so every reader
//! splits `{key}.{ext}` the same way.
//!
//! # Binary sample index
//!
//! `imgpack.index` is a 24-byte header — the magic `IMGPKIDX`, the version as `u32` LE (2), the
//! CRC-32 of `imgpack.json`'s bytes as `u32` LE, the sample count as `u64` LE — followed by one
//! 24-byte entry per sample in key order: the byte offset of the sample's first tar header in
//! its shard (`u64` LE), the length of the byte range holding all its members (`u64` LE), the
//! shard number (`u32` LE), and the CRC-32 of that byte range (`u32` LE; see
//! [`crate::checksum`]). Opening a dataset maps it; finding sample `i` is arithmetic. Version 1
//! (format version 1) had zeros where the CRCs are.

mod dali;
mod index;
#[cfg(feature = "s3")]
mod remote;
mod shard;
mod tar;
mod wids;

use std::borrow::Cow;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::key::{format_key, is_valid_extension, split_field_name};
use crate::{Error, Field, Meta, Result, Sample};

pub use dali::{
    dali_index_file_name, dali_index_header, dali_index_line, parse_dali_index, DaliComponent,
    DALI_INDEX_VERSION,
};
pub use index::{
    IndexEntry, IndexHeader, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, INDEX_MAGIC, INDEX_VERSION, SAMPLE_INDEX_FILE,
};
#[cfg(feature = "s3")]
pub use remote::{not_a_dataset as not_a_stored_dataset, RemoteSamples, RemoteWebDataset};
pub use shard::{is_shard_name, shard_file_name};
pub use tar::{member_len, parse_member, Member, BLOCK, END_OF_ARCHIVE, MAX_NAME};
pub use wids::{WidsIndex, WidsShard, WIDS_INDEX_FILE};

/// The `format` value in the metadata of a WebDataset output.
pub const FORMAT_NAME: &str = "imgpack-webdataset";
/// The dataset metadata file.
pub const META_FILE: &str = "imgpack.json";

/// A WebDataset output of `pack`, open for reading: shards and index memory-mapped, so
/// [`WebDataset::get`] is one index lookup and a parse of the sample's tar headers, and the
/// returned bytes point into the map. `Send + Sync`.
pub struct WebDataset {
    path: Arc<Path>,
    meta: Meta,
    index: Mmap,
    shards: Vec<Mmap>,
    verify: bool,
}

impl std::fmt::Debug for WebDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebDataset").field("path", &self.path).field("samples", &self.meta.samples).finish()
    }
}

impl WebDataset {
    /// Opens the WebDataset output in directory `path`.
    ///
    /// Everything read here is checked before it is used, so a damaged or hostile directory gives
    /// an [`Error`], never a panic: the metadata must parse (with a sane `key_width`, see
    /// [`Meta::key_width`]); `imgpack.index` must hold exactly one entry per sample (its sample
    /// count sizes nothing until the file's length agrees with it) and, in a version-2 dataset,
    /// the CRC of the metadata; every shard must be a plain file name inside `path`, or inside
    /// one part directory of it ([`is_shard_name`]: no `..`, absolute path or NUL), and a
    /// regular file of the length the metadata records. Every file is opened without blocking and refused unless it is a
    /// regular file, so a FIFO or a device planted under a dataset name cannot hang or flood the
    /// reader. The index entries themselves are checked when read, by [`WebDataset::get`], so
    /// opening stays as cheap as reading the metadata.
    pub fn open(path: impl AsRef<Path>) -> Result<WebDataset> {
        let path: Arc<Path> = Arc::from(path.as_ref());
        crate::unfinished::refuse(&path)?;
        let not_dataset = |reason: String| Error::NotADataset { path: path.to_path_buf(), reason };
        // A missing file is reported as what it means for the dataset, not as a bare I/O error.
        let missing = |e: Error, what: &str| match e {
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                not_dataset(what.into())
            }
            e => e,
        };
        let meta_path = path.join(META_FILE);
        let mut raw = Vec::new();
        open_regular(&path, &meta_path)
            .and_then(|mut file| {
                file.read_to_end(&mut raw).map_err(|source| Error::Io { path: meta_path.clone(), source })
            })
            .map_err(|e| missing(e, &format!("no {META_FILE}; a finished `pack --to webdataset` run writes it last, so the run did not finish or this is not its output")))?;
        let meta = parse_meta(&path, &raw)?;
        let index = map(&path, &path.join(SAMPLE_INDEX_FILE)).map_err(|e| {
            missing(e, &format!("no {SAMPLE_INDEX_FILE}; copy the whole dataset directory, or re-run `pack`"))
        })?;
        check_index(&path, &meta, &raw, &index)?;
        let mut shards = Vec::with_capacity(meta.shards.len());
        for shard in &meta.shards {
            check_shard_name(&path, &shard.name)?;
            let mapped = map(&path, &path.join(&shard.name)).map_err(|e| {
                let what = format!(
                    "shard {} listed in {META_FILE} is missing; copy the whole dataset directory, or re-run `pack`",
                    shard.name
                );
                missing(e, &what)
            })?;
            check_shard_len(&path, shard, mapped.len() as u64)?;
            shards.push(mapped);
        }
        Ok(WebDataset { path, meta, index, shards, verify: false })
    }

    /// Makes [`WebDataset::get`] check each sample's CRC-32 against the index
    /// ([`crate::checksum`]) and fail with [`Error::Checksum`] on a mismatch. It costs one pass
    /// over the sample's bytes at memory speed. Fails with [`Error::NoChecksums`] for a dataset
    /// written before checksums existed.
    pub fn verify_checksums(mut self, on: bool) -> Result<WebDataset> {
        if on && self.meta.checksum.is_none() {
            return Err(Error::NoChecksums { path: self.path.to_path_buf() });
        }
        self.verify = on;
        Ok(self)
    }

    /// The dataset directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The dataset metadata.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The number of samples.
    pub fn len(&self) -> u64 {
        self.meta.samples
    }

    /// Whether the dataset holds no sample.
    pub fn is_empty(&self) -> bool {
        self.meta.samples == 0
    }

    /// Class names in class-index order.
    pub fn classes(&self) -> &[String] {
        &self.meta.classes
    }

    /// Where sample `index` lives, as the index says: [`WebDataset::get`] checks it against the
    /// shard before trusting it.
    pub fn entry(&self, index: u64) -> Result<IndexEntry> {
        index_entry(&self.path, &self.index, self.meta.samples, index)
    }

    /// Sample `index`; its fields point into the shard's memory map (no copy).
    ///
    /// The index entry is not trusted: its shard must exist and its byte range lie inside it
    /// (checked arithmetic, so offsets and lengths near `u64::MAX` are refused, not wrapped), and
    /// every tar member in the range must parse ([`parse_member`]), be named `{key}.{ext}` with
    /// this sample's key (so a member named `../x`, `/etc/passwd` or another sample's key is
    /// refused) and a valid extension ([`crate::key::is_valid_extension`]), in strictly increasing
    /// extension order (no field twice). An empty range holds no member and is refused too.
    /// Anything else is [`Error::BadSample`] naming the key; no check allocates or calls the
    /// system, so reads stay as fast as before they were made.
    pub fn get(&self, index: u64) -> Result<Sample<'_>> {
        let entry = self.entry(index)?;
        let key = format_key(index, self.meta.key_width);
        let damaged =
            |reason: String| Error::BadSample { path: self.path.to_path_buf(), key: key.clone(), reason };
        let shard = self
            .shards
            .get(entry.shard as usize)
            .ok_or_else(|| damaged(format!("index names shard {} of {}", entry.shard, self.shards.len())))?;
        let range = usize::try_from(entry.offset)
            .ok()
            .zip(usize::try_from(entry.len).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?))
            .filter(|r| r.end <= shard.len())
            .ok_or_else(|| {
                damaged(format!("index range {}+{} lies outside the shard", entry.offset, entry.len))
            })?;
        let buf = &shard[range];
        if self.verify {
            let actual = crate::checksum::crc32(buf);
            if actual != entry.crc32 {
                return Err(Error::Checksum {
                    path: self.path.to_path_buf(),
                    key,
                    expected: entry.crc32,
                    actual,
                });
            }
        }
        let fields = sample_fields(buf, &key).map_err(damaged)?;
        Ok(Sample { index, key, fields, dataset: self.path.clone() })
    }

    /// Every sample in order, shard after shard, borrowed from the maps.
    pub fn iter(&self) -> impl Iterator<Item = Result<Sample<'_>>> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }
}

/// Entry `index` of `imgpack.index` (bytes `index_bytes`, checked to hold `samples` entries)
/// of the dataset at `path`.
pub(crate) fn index_entry(path: &Path, index_bytes: &[u8], samples: u64, index: u64) -> Result<IndexEntry> {
    let out_of_range = || Error::OutOfRange { path: path.to_path_buf(), index, len: samples };
    if index >= samples {
        return Err(out_of_range());
    }
    // `open` checked that the index holds exactly `samples` entries, so this finds one; it is
    // still looked up without indexing, so no arithmetic on `index` can panic.
    let bytes = usize::try_from(index)
        .ok()
        .and_then(|i| i.checked_mul(INDEX_ENTRY_LEN)?.checked_add(INDEX_HEADER_LEN))
        .and_then(|at| index_bytes.get(at..at.checked_add(INDEX_ENTRY_LEN)?))
        .and_then(|bytes| <&[u8; INDEX_ENTRY_LEN]>::try_from(bytes).ok())
        .ok_or_else(out_of_range)?;
    Ok(IndexEntry::decode(bytes))
}

/// Parses the metadata `raw` of the dataset at `path` and checks that this reader can read it.
pub fn parse_meta(path: &Path, raw: &[u8]) -> Result<Meta> {
    let meta: Meta = serde_json::from_slice(raw)
        .map_err(|source| Error::BadMeta { path: path.join(META_FILE), source })?;
    if let Some(reason) = meta.unreadable(FORMAT_NAME) {
        return Err(Error::NotADataset { path: path.to_path_buf(), reason });
    }
    Ok(meta)
}

/// Checks `index`, the bytes of `imgpack.index`, against `meta` and its bytes `raw_meta`: one
/// entry per sample (its sample count sizes nothing until the length agrees with it) and, in
/// a version-2 dataset, the CRC of the metadata.
pub(crate) fn check_index(path: &Path, meta: &Meta, raw_meta: &[u8], index: &[u8]) -> Result<()> {
    let not_dataset = |reason: String| Error::NotADataset { path: path.to_path_buf(), reason };
    // Checked arithmetic: a `samples` near `u64::MAX` must not wrap to a length that fits.
    let expected_len = (meta.samples.checked_mul(INDEX_ENTRY_LEN as u64))
        .and_then(|n| n.checked_add(INDEX_HEADER_LEN as u64));
    let header = IndexHeader::decode(index);
    if header.map(|h| h.samples) != Some(meta.samples) || Some(index.len() as u64) != expected_len {
        return Err(not_dataset(format!(
            "{SAMPLE_INDEX_FILE} ({} bytes, {}) does not match the {} samples of {META_FILE}: it was truncated, damaged or belongs to another run; re-run `pack`",
            index.len(),
            header.map_or("no valid header".into(), |h| format!("header for {} samples", h.samples)),
            meta.samples
        )));
    }
    if meta.checksum.is_some() && header.map(|h| h.meta_crc32) != Some(crate::checksum::crc32(raw_meta)) {
        return Err(not_dataset(format!(
            "{META_FILE} does not have the CRC-32 that {SAMPLE_INDEX_FILE} records: one of them is damaged; restore the dataset from a good copy or re-run `pack`"
        )));
    }
    Ok(())
}

/// Refuses a shard name from the metadata that is not a plain name inside the dataset.
pub(crate) fn check_shard_name(path: &Path, name: &str) -> Result<()> {
    if is_shard_name(name) {
        return Ok(());
    }
    Err(Error::NotADataset {
        path: path.to_path_buf(),
        reason: format!(
            "{META_FILE} lists the shard {name:?}, which is not a file name inside the dataset directory; it is damaged or was not written by `pack`, which only reads shards it lists by plain name"
        ),
    })
}

/// Refuses a shard whose length is not the one the metadata records.
pub(crate) fn check_shard_len(path: &Path, shard: &crate::ShardInfo, len: u64) -> Result<()> {
    if len == shard.bytes {
        return Ok(());
    }
    Err(Error::NotADataset {
        path: path.to_path_buf(),
        reason: format!(
            "shard {} is {len} bytes, the metadata says {}; it was truncated or replaced",
            shard.name, shard.bytes
        ),
    })
}

/// The fields of the sample keyed `key` whose members fill `buf` exactly: every member must
/// parse ([`parse_member`]), be named `{key}.{ext}` with this key and a valid extension, in
/// strictly increasing extension order, and there must be at least one. The error says what is
/// wrong, for [`Error::BadSample`].
pub(crate) fn sample_fields<'b>(buf: &'b [u8], key: &str) -> std::result::Result<Vec<Field<'b>>, String> {
    let mut fields = Vec::with_capacity(3);
    let mut pos = 0;
    while pos < buf.len() {
        let member = parse_member(buf, pos)?;
        let (member_key, ext) = split_field_name(member.name)
            .filter(|(_, ext)| is_valid_extension(ext))
            .ok_or_else(|| format!("member {:?} is not {{key}}.{{ext}}", member.name))?;
        if member_key != key {
            return Err(format!("index points at member {:?}, which is not this sample's", member.name));
        }
        if fields.last().is_some_and(|last: &Field<'_>| last.ext.as_str() >= ext) {
            return Err(format!(
                "member {:?} repeats a field or is out of order; a sample's fields are unique and sorted by extension",
                member.name
            ));
        }
        fields.push(Field { ext: ext.to_string(), data: Cow::Borrowed(member.data) });
        pos = member.next;
    }
    if fields.is_empty() {
        return Err("no member stored for this key".into());
    }
    Ok(fields)
}

/// Opens `file` (inside the dataset at `dataset`) for reading, if it is a regular file.
///
/// It opens without blocking and checks the open file, not the name, so nothing can swap the
/// file in between: a FIFO would otherwise block the open forever, and a device such as
/// `/dev/zero` would read without end. `O_NONBLOCK` changes nothing for a regular file.
fn open_regular(dataset: &Path, file: &Path) -> Result<File> {
    let io = |source| Error::Io { path: file.to_path_buf(), source };
    let opened =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(file).map_err(io)?;
    if !opened.metadata().map_err(io)?.is_file() {
        return Err(Error::NotADataset {
            path: dataset.to_path_buf(),
            reason: format!("{} is not a regular file; a dataset holds only regular files", file.display()),
        });
    }
    Ok(opened)
}

/// Maps `file`, a regular file inside the dataset at `dataset`, read-only.
fn map(dataset: &Path, file: &Path) -> Result<Mmap> {
    let opened = open_regular(dataset, file)?;
    // SAFETY: a published dataset is never written again; the maps are read-only, and every
    // offset taken from the index is bounds-checked against the map's length before use. A
    // file truncated by someone else while mapped is the remaining hazard, as with any map.
    unsafe { Mmap::map(&opened) }.map_err(|source| Error::Io { path: file.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn datasets_are_send_and_sync() {
        assert_send_sync::<WebDataset>();
        assert_send_sync::<crate::Dataset>();
    }
}
