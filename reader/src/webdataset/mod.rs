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
//! `imgpack.index` is a 24-byte header — the magic `IMGPKIDX`, the version as `u32` LE (2), the
//! CRC-32 of `imgpack.json`'s bytes as `u32` LE, the sample count as `u64` LE — followed by one
//! 24-byte entry per sample in key order: the byte offset of the sample's first tar header in
//! its shard (`u64` LE), the length of the byte range holding all its members (`u64` LE), the
//! shard number (`u32` LE), and the CRC-32 of that byte range (`u32` LE; see
//! [`crate::checksum`]). Opening a dataset maps it; finding sample `i` is arithmetic. Version 1
//! (format version 1) had zeros where the CRCs are.

use std::borrow::Cow;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::key::{format_key, is_valid_extension, split_field_name};
use crate::{Error, Field, Meta, Result, Sample, ShardInfo};

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

/// The `imgpack.index` version this crate writes.
pub const INDEX_VERSION: u32 = 2;

/// The header of `imgpack.index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexHeader {
    /// 1 (no CRCs) or [`INDEX_VERSION`].
    pub version: u32,
    /// CRC-32 of `imgpack.json` (0 in version 1).
    pub meta_crc32: u32,
    /// The number of entries that follow.
    pub samples: u64,
}

impl IndexHeader {
    /// The header's 24 bytes.
    pub fn encode(&self) -> [u8; INDEX_HEADER_LEN] {
        let mut out = [0u8; INDEX_HEADER_LEN];
        out[..8].copy_from_slice(&INDEX_MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.meta_crc32.to_le_bytes());
        out[16..24].copy_from_slice(&self.samples.to_le_bytes());
        out
    }

    /// Decodes the header at the start of `bytes`, if it is a valid one.
    pub fn decode(bytes: &[u8]) -> Option<IndexHeader> {
        let header = bytes.get(..INDEX_HEADER_LEN)?;
        let version = u32::from_le_bytes(header[8..12].try_into().ok()?);
        if header[..8] != INDEX_MAGIC || !(1..=INDEX_VERSION).contains(&version) {
            return None;
        }
        Some(IndexHeader {
            version,
            meta_crc32: u32::from_le_bytes(header[12..16].try_into().ok()?),
            samples: u64::from_le_bytes(header[16..24].try_into().ok()?),
        })
    }
}

/// Where one sample lives: shard, offset of its first header, length of its members, and the
/// CRC-32 of those bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Byte offset of the sample's first tar header in its shard.
    pub offset: u64,
    /// Bytes from that header to the end of the sample's last member's data.
    pub len: u64,
    /// The shard number.
    pub shard: u32,
    /// CRC-32 of the `len` bytes at `offset` (0 in a version 1 index).
    pub crc32: u32,
}

impl IndexEntry {
    /// The entry's 24 bytes.
    pub fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut out = [0u8; INDEX_ENTRY_LEN];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..20].copy_from_slice(&self.shard.to_le_bytes());
        out[20..24].copy_from_slice(&self.crc32.to_le_bytes());
        out
    }

    /// Decodes 24 bytes.
    pub fn decode(bytes: &[u8; INDEX_ENTRY_LEN]) -> IndexEntry {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        IndexEntry { offset: u64_at(0), len: u64_at(8), shard: u32_at(16), crc32: u32_at(20) }
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
///
/// The sample count in the first line is checked against the lines that follow, never trusted
/// to size anything: `v1.2 99999999999999` reserves no more than the text could hold.
pub fn parse_dali_index(text: &str) -> std::result::Result<Vec<Vec<DaliComponent>>, String> {
    let mut lines = text.lines();
    let header = lines.next().ok_or("empty index")?;
    let count: usize = match header.split_whitespace().collect::<Vec<_>>()[..] {
        [version, n] if version == DALI_INDEX_VERSION => n.parse().map_err(|_| format!("bad count {n:?}"))?,
        _ => return Err(format!("first line {header:?} is not `{DALI_INDEX_VERSION} <samples>`")),
    };
    // A sample line is at least `e 0 0 n\n`, 8 bytes.
    let mut samples = Vec::with_capacity(count.min(text.len() / 8));
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

impl WidsIndex {
    /// The index of these shards, as `pack` writes it.
    pub fn of(shards: &[ShardInfo]) -> WidsIndex {
        WidsIndex {
            kind: "wids-shard-index-v1".into(),
            wids_version: 1,
            shardlist: shards
                .iter()
                .map(|s| WidsShard {
                    url: s.name.clone(),
                    nsamples: s.samples,
                    filesize: s.bytes,
                    md5sum: s.md5.clone(),
                })
                .collect(),
        }
    }
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
///
/// Every position and size here comes from the bytes being parsed, so all arithmetic on them is
/// checked: any `pos` and any header give a `Member` whose data lies inside `buf` and whose
/// `next` is past `pos` (so a loop over members always ends), or an error, never a panic.
/// The name is returned as stored; callers check it (see [`WebDataset::get`]).
pub fn parse_member(buf: &[u8], pos: usize) -> std::result::Result<Member<'_>, String> {
    let start = pos.checked_add(BLOCK as usize).ok_or("tar header offset is past the end")?;
    let header = buf.get(pos..start).ok_or("tar header runs past the end")?;
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
    let end = usize::try_from(size).ok().and_then(|s| start.checked_add(s)).filter(|&e| e <= buf.len());
    let end = end.ok_or_else(|| format!("tar member {name:?} of {size} bytes runs past the end"))?;
    // The data is padded to whole blocks, counted from the member's own header. `end` lies in
    // the buffer, so the padded end is at most 511 bytes further; checked all the same.
    let next = (end - start)
        .checked_next_multiple_of(BLOCK as usize)
        .and_then(|padded| start.checked_add(padded))
        .ok_or("tar member padding overflows")?;
    Ok(Member { name, data: &buf[start..end], next })
}

/// The value of a numeric tar header field: octal digits, padded with spaces or NULs. GNU's
/// base-256 form for huge values (high bit set) is refused; imgpack never writes it. A 12-byte
/// field holds at most 12 digits, so the value cannot overflow a `u64`.
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
        if crate::is_unfinished(&path) {
            return Err(crate::dataset::unfinished(&path));
        }
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
        let meta: Meta =
            serde_json::from_slice(&raw).map_err(|source| Error::BadMeta { path: meta_path, source })?;
        if let Some(reason) = meta.unreadable(FORMAT_NAME) {
            return Err(not_dataset(reason));
        }
        let index = map(&path, &path.join(SAMPLE_INDEX_FILE)).map_err(|e| {
            missing(e, &format!("no {SAMPLE_INDEX_FILE}; copy the whole dataset directory, or re-run `pack`"))
        })?;
        // Checked arithmetic: a `samples` near `u64::MAX` must not wrap to a length that fits.
        let expected_len = (meta.samples.checked_mul(INDEX_ENTRY_LEN as u64))
            .and_then(|n| n.checked_add(INDEX_HEADER_LEN as u64));
        let header = IndexHeader::decode(&index);
        if header.map(|h| h.samples) != Some(meta.samples) || Some(index.len() as u64) != expected_len {
            return Err(not_dataset(format!(
                "{SAMPLE_INDEX_FILE} ({} bytes, {}) does not match the {} samples of {META_FILE}: it was truncated, damaged or belongs to another run; re-run `pack`",
                index.len(),
                header.map_or("no valid header".into(), |h| format!("header for {} samples", h.samples)),
                meta.samples
            )));
        }
        if meta.checksum.is_some() && header.map(|h| h.meta_crc32) != Some(crate::checksum::crc32(&raw)) {
            return Err(not_dataset(format!(
                "{META_FILE} does not have the CRC-32 that {SAMPLE_INDEX_FILE} records: one of them is damaged; restore the dataset from a good copy or re-run `pack`"
            )));
        }
        let mut shards = Vec::with_capacity(meta.shards.len());
        for shard in &meta.shards {
            if !is_shard_name(&shard.name) {
                return Err(not_dataset(format!(
                    "{META_FILE} lists the shard {:?}, which is not a file name inside the dataset directory; it is damaged or was not written by `pack`, which only reads shards it lists by plain name",
                    shard.name
                )));
            }
            let mapped = map(&path, &path.join(&shard.name)).map_err(|e| {
                let what = format!(
                    "shard {} listed in {META_FILE} is missing; copy the whole dataset directory, or re-run `pack`",
                    shard.name
                );
                missing(e, &what)
            })?;
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
        let out_of_range =
            || Error::OutOfRange { path: self.path.to_path_buf(), index, len: self.meta.samples };
        if index >= self.meta.samples {
            return Err(out_of_range());
        }
        // `open` checked that the index holds exactly `samples` entries, so this finds one; it is
        // still looked up without indexing, so no arithmetic on `index` can panic.
        let bytes = usize::try_from(index)
            .ok()
            .and_then(|i| i.checked_mul(INDEX_ENTRY_LEN)?.checked_add(INDEX_HEADER_LEN))
            .and_then(|at| self.index.get(at..at.checked_add(INDEX_ENTRY_LEN)?))
            .and_then(|bytes| <&[u8; INDEX_ENTRY_LEN]>::try_from(bytes).ok())
            .ok_or_else(out_of_range)?;
        Ok(IndexEntry::decode(bytes))
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
        let mut fields = Vec::with_capacity(3);
        let mut pos = 0;
        while pos < buf.len() {
            let member = parse_member(buf, pos).map_err(&damaged)?;
            let (member_key, ext) = split_field_name(member.name)
                .filter(|(_, ext)| is_valid_extension(ext))
                .ok_or_else(|| damaged(format!("member {:?} is not {{key}}.{{ext}}", member.name)))?;
            if member_key != key {
                return Err(damaged(format!(
                    "index points at member {:?}, which is not this sample's",
                    member.name
                )));
            }
            if fields.last().is_some_and(|last: &Field<'_>| last.ext.as_str() >= ext) {
                return Err(damaged(format!(
                    "member {:?} repeats a field or is out of order; a sample's fields are unique and sorted by extension",
                    member.name
                )));
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

/// Whether `name`, as listed in the metadata's shard list, names a file inside the dataset
/// directory: a plain file name — not empty, no `/` or `\\` (so not absolute and not in a
/// subdirectory), no NUL, and not starting with `.` (so neither `.` nor `..`, nor a hidden file
/// `pack` never writes) — or, in a dataset merged from parts ([`crate::part`]), such a name
/// inside exactly one part directory (`part-0002-of-0004/shard-p0002-000000.tar`). Readers open only
/// shards whose names pass, so a damaged or hostile `imgpack.json` cannot make them read
/// outside the dataset. A shard that is a symbolic link is followed, as the dataset directory
/// itself would be: links are the file system owner's choice, not bytes read from the dataset.
pub fn is_shard_name(name: &str) -> bool {
    let plain = |name: &str| !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0']);
    match name.split_once('/') {
        None => plain(name),
        Some((dir, file)) => crate::part::parse_dir_name(dir).is_some() && plain(file),
    }
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

    #[test]
    fn shard_names_stay_inside_the_dataset_and_one_part_directory() {
        for good in ["shard-000000.tar", "x", "part-0002-of-0004/shard-p0002-000000.tar"] {
            assert!(is_shard_name(good), "{good}");
        }
        for bad in [
            "",
            ".hidden.tar",
            "..",
            "../x.tar",
            "/etc/passwd",
            "a/b.tar",
            "part-0002-of-0004/../x.tar",
            "part-0002-of-0004/a/b.tar",
            "part-0002-of-0004/",
            "part-4-of-4/x.tar",
            "part-0002-of-0004\\x.tar",
            "x\0.tar",
        ] {
            assert!(!is_shard_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn index_entries_round_trip() {
        let e = IndexEntry { offset: 1 << 40, len: 123_456, shard: 7, crc32: 0xDEAD_BEEF };
        assert_eq!(IndexEntry::decode(&e.encode()), e);
        let h = IndexHeader { version: INDEX_VERSION, meta_crc32: 99, samples: 42 };
        assert_eq!(IndexHeader::decode(&h.encode()), Some(h));
        assert_eq!(IndexHeader::decode(b"IMGPKIDX"), None);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(IndexHeader::decode(&bad), None);
        let future = IndexHeader { version: INDEX_VERSION + 1, ..h };
        assert_eq!(IndexHeader::decode(&future.encode()), None);
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
    fn a_dali_count_sizes_nothing() {
        // Before the count was capped, these reserved up to 2^64 sample slots and aborted; the
        // fuzz target `index_parsers` found `v1.2 1000000000` (a 24 GB reservation) in a second.
        for count in ["18446744073709551615", "100000000000", "1000000000"] {
            let err = parse_dali_index(&format!("v1.2 {count}\ncls 512 1 00000000.cls\n")).unwrap_err();
            assert!(err.contains(&format!("header says {count} samples, 1 lines follow")), "{err}");
        }
        assert!(
            parse_dali_index("v1.2 1000000000").unwrap_err().contains("0 lines follow"),
            "the fuzzer's input"
        );
        assert!(parse_dali_index("v1.2 18446744073709551616\n").unwrap_err().contains("bad count"));
        assert!(parse_dali_index("v1.2 1\ncls 512 99999999999999999999 a.cls\n")
            .unwrap_err()
            .contains("not a number"));
        assert_eq!(parse_dali_index("v1.2 0\n").unwrap(), Vec::<Vec<DaliComponent>>::new());
    }

    #[test]
    fn member_positions_near_the_end_of_memory_are_errors_not_overflows() {
        // `pos + 512` overflowed for these; the fuzz target `tar_member` found `usize::MAX`.
        let mut buf = vec![0u8; 2048];
        buf[..5].copy_from_slice(b"a.cls");
        for pos in [usize::MAX, usize::MAX - 511, usize::MAX - 512, 2048, 1537] {
            assert!(parse_member(&buf, pos).unwrap_err().contains("past the end"), "{pos}");
        }
    }

    #[test]
    fn a_corrupt_header_is_an_error_not_a_panic() {
        let mut buf = vec![0u8; 1024];
        buf[..5].copy_from_slice(b"a.cls");
        assert!(parse_member(&buf, 0).unwrap_err().contains("checksum"));
        assert!(parse_member(&buf, 900).is_err());
    }
}
