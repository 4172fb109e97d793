//! The WebDataset layout, its index files, and its reader.
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
//! `imgpack.index` is a 24-byte header — the magic `IMGPKIDX`, the version as `u32` LE (1), a
//! reserved `u32` (0), the sample count as `u64` LE — followed by one 24-byte entry per sample
//! in key order: the byte offset of the sample's first tar header in its shard (`u64` LE), the
//! length of the byte range holding all its members (`u64` LE), and the shard number (`u32`
//! LE), then a reserved `u32` (0). Opening a dataset maps it; finding sample `i` is arithmetic.

use std::borrow::Cow;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::key::{format_key, split_field_name};
use crate::{Error, Field, Meta, Result, Sample, FORMAT_VERSION};

/// The `format` value in the metadata of a WebDataset output.
pub const FORMAT_NAME: &str = "imgpack-webdataset";
/// The dataset metadata file.
pub const META_FILE: &str = "imgpack.json";
/// The binary sample index file.
pub const SAMPLE_INDEX_FILE: &str = "imgpack.index";
/// The `wids` shard index file.
pub const WIDS_INDEX_FILE: &str = "shardindex.json";
/// The DALI index format version written.
pub const DALI_INDEX_VERSION: &str = "v1.2";
/// The tar block size.
pub const BLOCK: u64 = 512;
/// The two zero blocks that end a tar archive.
pub const END_OF_ARCHIVE: u64 = 2 * BLOCK;
/// The longest member name a plain ustar header holds without a prefix or extension record.
pub const MAX_NAME: usize = 100;

/// The file name of shard `n`: `shard_file_name("shard", 3) == "shard-000003.tar"`.
pub fn shard_file_name(prefix: &str, n: usize) -> String {
    format!("{prefix}-{n:06}.tar")
}

/// The file name of shard `n`'s DALI index: `shard-000003.idx`.
pub fn dali_index_file_name(prefix: &str, n: usize) -> String {
    format!("{prefix}-{n:06}.idx")
}

/// The bytes a member with `size` bytes of data takes in a tar: its header and its data padded
/// to a whole block.
pub fn member_len(size: u64) -> u64 {
    BLOCK + size.div_ceil(BLOCK) * BLOCK
}

/// Magic bytes opening `imgpack.index`.
pub const INDEX_MAGIC: [u8; 8] = *b"IMGPKIDX";
/// Length of the `imgpack.index` header.
pub const INDEX_HEADER_LEN: usize = 24;
/// Length of one `imgpack.index` entry.
pub const INDEX_ENTRY_LEN: usize = 24;

/// The `imgpack.index` header for `count` samples.
pub fn encode_index_header(count: u64) -> [u8; INDEX_HEADER_LEN] {
    let mut out = [0u8; INDEX_HEADER_LEN];
    out[..8].copy_from_slice(&INDEX_MAGIC);
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    out[16..24].copy_from_slice(&count.to_le_bytes());
    out
}

/// The sample count from an `imgpack.index` header, if the header is valid.
pub fn decode_index_header(bytes: &[u8]) -> Option<u64> {
    let header = bytes.get(..INDEX_HEADER_LEN)?;
    if header[..8] != INDEX_MAGIC || header[8..12] != 1u32.to_le_bytes() {
        return None;
    }
    Some(u64::from_le_bytes(header[16..24].try_into().ok()?))
}

/// Where one sample lives: shard, offset of its first header, and length of its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Byte offset of the sample's first tar header in its shard.
    pub offset: u64,
    /// Bytes from that header to the end of the sample's last member's data.
    pub len: u64,
    /// The shard number.
    pub shard: u32,
}

impl IndexEntry {
    /// The entry's 24 bytes.
    pub fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut out = [0u8; INDEX_ENTRY_LEN];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..20].copy_from_slice(&self.shard.to_le_bytes());
        out
    }

    /// Decodes 24 bytes.
    pub fn decode(bytes: &[u8; INDEX_ENTRY_LEN]) -> IndexEntry {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        IndexEntry {
            offset: u64_at(0),
            len: u64_at(8),
            shard: u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")),
        }
    }
}

/// One component of a sample in a DALI index: extension, data offset, size, member name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaliComponent {
    /// The field extension.
    pub ext: String,
    /// Offset of the member's data (its header offset + 512).
    pub offset: u64,
    /// The member's data size.
    pub size: u64,
    /// The member name, `{key}.{ext}`.
    pub name: String,
}

/// The first line of a DALI index: `v1.2 <samples>`.
pub fn dali_index_header(samples: u64) -> String {
    format!("{DALI_INDEX_VERSION} {samples}\n")
}

/// One sample's line of a DALI index: `<ext> <offset> <size> <name>` for each component.
pub fn dali_index_line(components: &[DaliComponent]) -> String {
    let mut line = String::new();
    for (i, c) in components.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&format!("{} {} {} {}", c.ext, c.offset, c.size, c.name));
    }
    line.push('\n');
    line
}

/// Parses a DALI `v1.2` index into its samples' components.
pub fn parse_dali_index(text: &str) -> std::result::Result<Vec<Vec<DaliComponent>>, String> {
    let mut lines = text.lines();
    let header = lines.next().ok_or("empty index")?;
    let count: usize = match header.split_whitespace().collect::<Vec<_>>()[..] {
        [version, n] if version == DALI_INDEX_VERSION => n.parse().map_err(|_| format!("bad count {n:?}"))?,
        _ => return Err(format!("first line {header:?} is not `{DALI_INDEX_VERSION} <samples>`")),
    };
    let mut samples = Vec::with_capacity(count);
    for (n, line) in lines.enumerate() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.is_empty() || !tokens.len().is_multiple_of(4) {
            return Err(format!("line {}: {} tokens, not a multiple of 4", n + 2, tokens.len()));
        }
        let parse = |t: &str| t.parse::<u64>().map_err(|_| format!("line {}: {t:?} is not a number", n + 2));
        samples.push(
            tokens
                .chunks(4)
                .map(|c| {
                    Ok(DaliComponent {
                        ext: c[0].to_string(),
                        offset: parse(c[1])?,
                        size: parse(c[2])?,
                        name: c[3].to_string(),
                    })
                })
                .collect::<std::result::Result<Vec<_>, String>>()?,
        );
    }
    if samples.len() != count {
        return Err(format!("header says {count} samples, {} lines follow", samples.len()));
    }
    Ok(samples)
}

/// The `wids` shard index (`shardindex.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WidsIndex {
    /// Always `wids-shard-index-v1`.
    #[serde(rename = "__kind__")]
    pub kind: String,
    /// Always 1.
    pub wids_version: u32,
    /// The shards in order.
    pub shardlist: Vec<WidsShard>,
}

/// One shard in the `wids` index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WidsShard {
    /// The shard path relative to the JSON file.
    pub url: String,
    /// Samples in the shard.
    pub nsamples: u64,
    /// The shard's size in bytes.
    pub filesize: u64,
    /// MD5 of the shard, lower-case hex.
    pub md5sum: String,
}

/// One tar member parsed from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// The member name.
    pub name: &'a str,
    /// The member's data.
    pub data: &'a [u8],
    /// Offset of the next header, relative to the buffer.
    pub next: usize,
}

/// Parses the regular-file member whose header starts at `pos` in `buf`, checking the header
/// checksum and that the data lies inside the buffer.
pub fn parse_member(buf: &[u8], pos: usize) -> std::result::Result<Member<'_>, String> {
    let header = buf.get(pos..pos + BLOCK as usize).ok_or("tar header runs past the end")?;
    let stored = parse_octal(&header[148..156]).ok_or("tar header checksum field is not octal")?;
    let sum: u64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) })
        .sum();
    if sum != stored {
        return Err(format!("tar header checksum mismatch (stored {stored}, computed {sum})"));
    }
    if !matches!(header[156], b'0' | 0) {
        return Err(format!("tar member is not a regular file (type {:?})", header[156] as char));
    }
    let name_len = header[..MAX_NAME].iter().position(|&b| b == 0).unwrap_or(MAX_NAME);
    let name = std::str::from_utf8(&header[..name_len]).map_err(|_| "tar member name is not UTF-8")?;
    if header[345] != 0 {
        return Err("tar member uses the ustar prefix field, which imgpack never writes".into());
    }
    let size = parse_octal(&header[124..136]).ok_or("tar member size is not octal")?;
    let start = pos + BLOCK as usize;
    let end = usize::try_from(size).ok().and_then(|s| start.checked_add(s)).filter(|&e| e <= buf.len());
    let end = end.ok_or_else(|| format!("tar member {name:?} of {size} bytes runs past the end"))?;
    Ok(Member { name, data: &buf[start..end], next: pos + member_len(size) as usize })
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?.trim_matches(|c: char| c == '\0' || c == ' ');
    u64::from_str_radix(text, 8).ok()
}

/// A WebDataset output of `pack`, open for reading: shards and index memory-mapped, so
/// [`WebDataset::get`] is one index lookup and a parse of the sample's tar headers, and the
/// returned bytes point into the map. `Send + Sync`.
pub struct WebDataset {
    path: Arc<Path>,
    meta: Meta,
    index: Mmap,
    shards: Vec<Mmap>,
}

impl std::fmt::Debug for WebDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebDataset").field("path", &self.path).field("samples", &self.meta.samples).finish()
    }
}

impl WebDataset {
    /// Opens the WebDataset output in directory `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<WebDataset> {
        let path: Arc<Path> = Arc::from(path.as_ref());
        let not_dataset = |reason: String| Error::NotADataset { path: path.to_path_buf(), reason };
        let meta_path = path.join(META_FILE);
        let raw = std::fs::read(&meta_path).map_err(|e| {
            not_dataset(format!(
                "cannot read {META_FILE} ({e}); a finished `pack --to webdataset` run writes it last, so the run did not finish or this is not its output"
            ))
        })?;
        let meta: Meta =
            serde_json::from_slice(&raw).map_err(|source| Error::BadMeta { path: meta_path, source })?;
        if meta.format != FORMAT_NAME || meta.version > FORMAT_VERSION {
            return Err(not_dataset(format!(
                "metadata says format {:?} version {}; this reader reads {FORMAT_NAME} up to version {FORMAT_VERSION}",
                meta.format, meta.version
            )));
        }
        let index = map(&path.join(SAMPLE_INDEX_FILE))?;
        let expected_len = INDEX_HEADER_LEN as u64 + meta.samples * INDEX_ENTRY_LEN as u64;
        if decode_index_header(&index) != Some(meta.samples) || index.len() as u64 != expected_len {
            return Err(not_dataset(format!(
                "{SAMPLE_INDEX_FILE} does not match the metadata ({} samples); re-run `pack`",
                meta.samples
            )));
        }
        let mut shards = Vec::with_capacity(meta.shards.len());
        for shard in &meta.shards {
            if shard.name.contains('/') || shard.name.starts_with('.') {
                return Err(not_dataset(format!("shard name {:?} points outside the dataset", shard.name)));
            }
            let mapped = map(&path.join(&shard.name))?;
            if mapped.len() as u64 != shard.bytes {
                return Err(not_dataset(format!(
                    "shard {} is {} bytes, the metadata says {}; it was truncated or replaced",
                    shard.name,
                    mapped.len(),
                    shard.bytes
                )));
            }
            shards.push(mapped);
        }
        Ok(WebDataset { path, meta, index, shards })
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

    /// Where sample `index` lives.
    pub fn entry(&self, index: u64) -> Result<IndexEntry> {
        if index >= self.meta.samples {
            return Err(Error::OutOfRange { path: self.path.to_path_buf(), index, len: self.meta.samples });
        }
        let at = INDEX_HEADER_LEN + index as usize * INDEX_ENTRY_LEN;
        Ok(IndexEntry::decode(self.index[at..at + INDEX_ENTRY_LEN].try_into().expect("24 bytes")))
    }

    /// Sample `index`; its fields point into the shard's memory map (no copy).
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
        let mut fields = Vec::with_capacity(3);
        let mut pos = 0;
        while pos < buf.len() {
            let member = parse_member(buf, pos).map_err(&damaged)?;
            let (member_key, ext) = split_field_name(member.name)
                .ok_or_else(|| damaged(format!("member {:?} is not {{key}}.{{ext}}", member.name)))?;
            if member_key != key {
                return Err(damaged(format!("index points at member {:?}", member.name)));
            }
            fields.push(Field { ext: ext.to_string(), data: Cow::Borrowed(member.data) });
            pos = member.next;
        }
        if fields.is_empty() {
            return Err(damaged("no member stored for this key".into()));
        }
        Ok(Sample { index, key, fields, dataset: self.path.clone() })
    }

    /// Every sample in order, shard after shard, borrowed from the maps.
    pub fn iter(&self) -> impl Iterator<Item = Result<Sample<'_>>> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }
}

fn map(path: &Path) -> Result<Mmap> {
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io)?;
    // SAFETY: a published dataset is never written again; the maps are read-only, and every
    // offset taken from the index is bounds-checked against the map's length before use. A
    // file truncated by someone else while mapped is the remaining hazard, as with any map.
    unsafe { Mmap::map(&file) }.map_err(io)
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

    #[test]
    fn index_entries_round_trip() {
        let e = IndexEntry { offset: 1 << 40, len: 123_456, shard: 7 };
        assert_eq!(IndexEntry::decode(&e.encode()), e);
        assert_eq!(decode_index_header(&encode_index_header(42)), Some(42));
        assert_eq!(decode_index_header(b"IMGPKIDX"), None);
        let mut bad = encode_index_header(1);
        bad[0] = b'X';
        assert_eq!(decode_index_header(&bad), None);
    }

    #[test]
    fn dali_lines_round_trip() {
        let sample = vec![
            DaliComponent { ext: "cls".into(), offset: 512, size: 1, name: "00000000.cls".into() },
            DaliComponent { ext: "jpg".into(), offset: 1536, size: 9000, name: "00000000.jpg".into() },
        ];
        let text = dali_index_header(1) + &dali_index_line(&sample);
        assert_eq!(text, "v1.2 1\ncls 512 1 00000000.cls jpg 1536 9000 00000000.jpg\n");
        assert_eq!(parse_dali_index(&text).unwrap(), vec![sample]);
        assert!(parse_dali_index("v1.1 1\n").is_err());
        assert!(parse_dali_index("v1.2 2\ncls 512 1 a.cls\n").unwrap_err().contains("header says 2"));
        assert!(parse_dali_index("v1.2 1\ncls 512 1\n").unwrap_err().contains("multiple of 4"));
    }

    #[test]
    fn member_len_pads_to_blocks() {
        assert_eq!(member_len(0), 512);
        assert_eq!(member_len(1), 1024);
        assert_eq!(member_len(512), 1024);
        assert_eq!(member_len(513), 1536);
    }

    #[test]
    fn a_corrupt_header_is_an_error_not_a_panic() {
        let mut buf = vec![0u8; 1024];
        buf[..5].copy_from_slice(b"a.cls");
        assert!(parse_member(&buf, 0).unwrap_err().contains("checksum"));
        assert!(parse_member(&buf, 900).is_err());
    }
}
