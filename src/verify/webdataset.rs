//! `pack verify` of a WebDataset: each shard's size, checksums and tar headers, every
//! `imgpack.index` entry and DALI `.idx` line against the tar itself, and `shardindex.json`
//! against the shard list; shards are checked in parallel. In an object store the same checks
//! run on each shard downloaded to a temporary file ([`Files`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use imgpack_reader::checksum::crc32;
use imgpack_reader::key::{format_key, split_field_name};
use imgpack_reader::webdataset::{
    dali_index_header, dali_index_line, is_shard_name, parse_member, DaliComponent, IndexEntry, IndexHeader,
    WidsIndex, BLOCK, END_OF_ARCHIVE, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, META_FILE, SAMPLE_INDEX_FILE,
    WIDS_INDEX_FILE,
};
use imgpack_reader::{Meta, ShardInfo};
use md5::{Digest, Md5};
use rayon::prelude::*;

use crate::progress::Progress;

use super::{check_fields, read_meta, sample_place, Problem, Verified, VerifyOptions};

/// Where a WebDataset's files are read from.
pub(super) enum Files {
    /// A directory.
    Dir(PathBuf),
    /// A prefix in an object store, with what it held when listed (name and size). A shard is
    /// downloaded to a temporary file to be checked, one per worker thread at a time.
    Store { store: imgpack_reader::store::Store, listed: BTreeMap<String, u64> },
}

/// A shard's bytes, mapped: the dataset's file, or a downloaded copy removed when dropped.
struct ShardBytes {
    map: memmap2::Mmap,
    _copy: Option<tempfile::NamedTempFile>,
}

impl Files {
    /// The bytes of file `name`, or why they cannot be read.
    fn read(&self, name: &str) -> std::result::Result<Vec<u8>, String> {
        match self {
            Files::Dir(dir) => std::fs::read(dir.join(name)).map_err(|e| e.to_string()),
            Files::Store { store, listed } => {
                if !listed.contains_key(name) {
                    return Err(format!("it is not stored under {}", store.url()));
                }
                store.get(name).map_err(|e| e.to_string())
            }
        }
    }

    /// Shard `name`, mapped, or why it cannot be read.
    fn shard(&self, name: &str) -> std::result::Result<ShardBytes, String> {
        let map = |file: &std::fs::File| {
            // SAFETY: a read-only map of a file nothing writes while it is checked (the
            // dataset's, or our own download); every offset is bounds-checked against its length.
            unsafe { memmap2::Mmap::map(file) }.map_err(|e| e.to_string())
        };
        match self {
            Files::Dir(dir) => {
                let file = std::fs::File::open(dir.join(name)).map_err(|e| e.to_string())?;
                Ok(ShardBytes { map: map(&file)?, _copy: None })
            }
            Files::Store { store, listed } => {
                let Some(&size) = listed.get(name) else {
                    return Err(format!("it is not stored under {}", store.url()));
                };
                let mut copy = tempfile::Builder::new()
                    .prefix(".imgpack-verify-")
                    .tempfile()
                    .map_err(|e| format!("cannot make a temporary file to download it to: {e}"))?;
                for chunk in store.stream(name, 0..size).map_err(|e| e.to_string())? {
                    let chunk = chunk.map_err(|e| e.to_string())?;
                    copy.write_all(&chunk)
                        .map_err(|e| format!("cannot download it to {}: {e}", copy.path().display()))?;
                }
                Ok(ShardBytes { map: map(copy.as_file())?, _copy: Some(copy) })
            }
        }
    }
}

/// Checks the WebDataset whose files `files` reads.
pub(super) fn check(
    files: &Files,
    options: &VerifyOptions,
    verified: &mut Verified,
    progress: &dyn Progress,
) {
    let raw_meta = match files.read(META_FILE) {
        Ok(raw) => raw,
        Err(e) => return verified.problem(META_FILE, format!("cannot read it: {e}")),
    };
    let Some(meta) = read_meta(&raw_meta, META_FILE, imgpack_reader::webdataset::FORMAT_NAME, verified)
    else {
        return;
    };
    let entries = read_index(files, &meta, crc32(&raw_meta), verified);
    check_shard_list(&meta, verified);
    check_wids(files, &meta, verified);

    let read = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<ShardCheck> = meta
        .shards
        .par_iter()
        .enumerate()
        .map(|(number, shard)| {
            let result = check_shard(files, &meta, number, shard, &entries, options);
            let total = read.fetch_add(result.bytes, std::sync::atomic::Ordering::Relaxed) + result.bytes;
            progress.position(total);
            result
        })
        .collect();
    for result in results {
        verified.checked += result.checked;
        verified.bytes += result.bytes;
        verified.problems.extend(result.problems);
    }
    let listed: u64 = meta.shards.iter().map(|s| s.samples).sum();
    if listed != meta.samples {
        verified.problem(META_FILE, format!("its shards hold {listed} samples, it says {}", meta.samples));
    }
}

/// Reads `imgpack.index`, checks its header, and returns the entries it holds (as many as are
/// whole, even if that is not the count it should have).
fn read_index(files: &Files, meta: &Meta, meta_crc: u32, verified: &mut Verified) -> Vec<IndexEntry> {
    let index = match files.read(SAMPLE_INDEX_FILE) {
        Ok(index) => index,
        Err(e) => {
            verified.problem(SAMPLE_INDEX_FILE, format!("cannot read it: {e}"));
            return Vec::new();
        }
    };
    match IndexHeader::decode(&index) {
        None => verified.problem(SAMPLE_INDEX_FILE, "its header is not an imgpack.index header"),
        Some(header) => {
            if header.samples != meta.samples {
                verified.problem(
                    SAMPLE_INDEX_FILE,
                    format!("its header says {} samples, {META_FILE} says {}", header.samples, meta.samples),
                );
            }
            if meta.checksum.is_some() && header.meta_crc32 != meta_crc {
                verified.problem(
                    META_FILE,
                    format!(
                        "its CRC-32 is {meta_crc:08x}, {SAMPLE_INDEX_FILE} records {:08x}",
                        header.meta_crc32
                    ),
                );
            }
        }
    }
    let body = index.get(INDEX_HEADER_LEN..).unwrap_or_default();
    let expected = meta.samples.saturating_mul(INDEX_ENTRY_LEN as u64);
    if body.len() as u64 != expected {
        verified.problem(
            SAMPLE_INDEX_FILE,
            format!("holds {} bytes of entries, {} samples need {expected}", body.len(), meta.samples),
        );
    }
    body.chunks_exact(INDEX_ENTRY_LEN)
        .map(|chunk| IndexEntry::decode(chunk.try_into().expect("chunks_exact")))
        .collect()
}

/// The shard list must tile the samples in order, with names that stay inside the dataset.
fn check_shard_list(meta: &Meta, verified: &mut Verified) {
    let mut next = 0u64;
    for (n, shard) in meta.shards.iter().enumerate() {
        if !is_shard_name(&shard.name) || !shard.name.ends_with(".tar") {
            verified.problem(
                META_FILE,
                format!("shard {n} is named {:?}, which is not a shard file inside the dataset", shard.name),
            );
        }
        if shard.first != next {
            verified.problem(
                META_FILE,
                format!(
                    "shard {} starts at sample {}, the one before ends at {next}",
                    shard.name, shard.first
                ),
            );
        }
        next = shard.first.saturating_add(shard.samples);
    }
}

/// `shardindex.json` must be exactly what the writer makes of the shard list.
fn check_wids(files: &Files, meta: &Meta, verified: &mut Verified) {
    let expected = WidsIndex::of(&meta.shards);
    match files.read(WIDS_INDEX_FILE) {
        Err(e) => verified.problem(WIDS_INDEX_FILE, format!("cannot read it: {e}")),
        Ok(raw) if raw != crate::encoding::json_bytes(&expected) => {
            let reason = match serde_json::from_slice::<WidsIndex>(&raw) {
                Err(e) => format!("not a wids shard index: {e}"),
                Ok(found) if found == expected => "differs from what pack writes (formatting)".to_string(),
                Ok(found) => {
                    match found.shardlist.iter().zip(&expected.shardlist).position(|(a, b)| a != b) {
                        Some(i) => format!(
                            "entry {i} is {:?}, the shard list says {:?}",
                            found.shardlist[i], expected.shardlist[i]
                        ),
                        None => "does not match the shard list in imgpack.json".to_string(),
                    }
                }
            };
            verified.problem(WIDS_INDEX_FILE, reason);
        }
        Ok(_) => {}
    }
}

#[derive(Default)]
struct ShardCheck {
    checked: u64,
    bytes: u64,
    problems: Vec<Problem>,
}

impl ShardCheck {
    fn problem(&mut self, place: impl Into<String>, reason: impl Into<String>) {
        self.problems.push(Problem { place: place.into(), reason: reason.into() });
    }
}

/// Checks one shard: its size and checksums, then its samples in order, each against the tar headers,
/// its index entry and its checksum; then the end blocks and the DALI index.
fn check_shard(
    files: &Files,
    meta: &Meta,
    number: usize,
    shard: &ShardInfo,
    entries: &[IndexEntry],
    options: &VerifyOptions,
) -> ShardCheck {
    let mut out = ShardCheck::default();
    let name = shard.name.as_str();
    if !is_shard_name(name) {
        return out; // reported by check_shard_list; never read outside the dataset
    }
    let shard_bytes = match files.shard(name) {
        Ok(bytes) => bytes,
        Err(e) => {
            out.problem(name, format!("cannot read it: {e}"));
            return out;
        }
    };
    let buf: &[u8] = &shard_bytes.map;
    out.bytes = buf.len() as u64;
    if buf.len() as u64 != shard.bytes {
        out.problem(name, format!("is {} bytes, {META_FILE} says {}", buf.len(), shard.bytes));
    }
    // Version 3 records a CRC-32 of every shard, and an MD5 with --md5; versions 1 and 2 an
    // MD5 only. Either catches any flipped byte, the tar's end blocks included.
    if let Some(recorded) = shard.crc32 {
        let crc = imgpack_reader::checksum::crc32(buf);
        if crc != recorded {
            out.problem(name, format!("CRC-32 is {crc:08x}, {META_FILE} records {recorded:08x}"));
        }
    }
    if let Some(recorded) = &shard.md5 {
        let md5 = crate::encoding::hex(&Md5::digest(buf));
        if &md5 != recorded {
            out.problem(name, format!("MD5 is {md5}, {META_FILE} records {recorded}"));
        }
    }
    if shard.crc32.is_none() && (meta.version >= 3 || shard.md5.is_none()) {
        out.problem(name, format!("{META_FILE} records no CRC-32 of it"));
    }

    let mut pos = 0usize;
    let mut dali = dali_index_header(shard.samples);
    for index in shard.first..shard.first.saturating_add(shard.samples) {
        let key = format_key(index, meta.key_width);
        let place = sample_place(&key);
        let entry = entries.get(index as usize).copied();
        // The tar's own view of the sample: its members from `pos` while their key is this one.
        let mut members: Vec<(&str, &[u8], usize)> = Vec::new();
        let mut end = pos;
        let mut tar_error = None;
        while end < buf.len() && buf[end..(end + BLOCK as usize).min(buf.len())].iter().any(|&b| b != 0) {
            match parse_member(buf, end) {
                Ok(member) => match split_field_name(member.name) {
                    Some((member_key, ext)) if member_key == key => {
                        members.push((ext, member.data, end));
                        end = member.next.min(buf.len());
                    }
                    Some(_) if !members.is_empty() => break,
                    _ => {
                        tar_error = Some(format!(
                            "the member at offset {end} is {:?}, expected {key}.*",
                            member.name
                        ));
                        break;
                    }
                },
                Err(reason) => {
                    tar_error = Some(format!("tar header at offset {end}: {reason}"));
                    break;
                }
            }
        }
        if let Some(reason) = &tar_error {
            out.problem(&place, reason.clone());
        } else if members.is_empty() {
            out.problem(&place, format!("missing from {name}: no member at offset {pos}"));
        }
        match entry {
            None => out.problem(&place, format!("no {SAMPLE_INDEX_FILE} entry")),
            Some(e) => {
                if e.shard as usize != number {
                    out.problem(
                        &place,
                        format!("{SAMPLE_INDEX_FILE} puts it in shard {}, it is in shard {number}", e.shard),
                    );
                }
                if tar_error.is_none() && (e.offset != pos as u64 || e.len != (end - pos) as u64) {
                    out.problem(
                        &place,
                        format!(
                            "{SAMPLE_INDEX_FILE} says bytes {}+{}, the tar holds it at {pos}+{}",
                            e.offset,
                            e.len,
                            end - pos
                        ),
                    );
                }
                if meta.checksum.is_some() {
                    let actual = crc32(&buf[pos..end]);
                    if actual != e.crc32 {
                        out.problem(
                            &place,
                            format!("CRC-32 is {actual:08x}, {SAMPLE_INDEX_FILE} records {:08x}", e.crc32),
                        );
                    }
                }
            }
        }
        if tar_error.is_none() && !members.is_empty() {
            let fields: Vec<(&str, &[u8])> = members.iter().map(|(ext, data, _)| (*ext, *data)).collect();
            for reason in check_fields(&fields, meta, options.decode) {
                out.problem(&place, reason);
            }
            out.checked += 1;
        }
        let components: Vec<DaliComponent> = members
            .iter()
            .map(|(ext, data, header)| DaliComponent {
                ext: ext.to_string(),
                offset: (*header as u64) + BLOCK,
                size: data.len() as u64,
                name: format!("{key}.{ext}"),
            })
            .collect();
        dali.push_str(&dali_index_line(&components));
        // Go on from where the tar says the sample ends; if its header is unreadable, trust the
        // index entry's length so the samples after it are still checked.
        pos = if tar_error.is_none() {
            end
        } else {
            entry
                .and_then(|e| usize::try_from(e.offset.saturating_add(e.len)).ok())
                .filter(|&p| p > pos && p <= buf.len())
                .unwrap_or(buf.len())
        };
    }
    let tail = buf.get(pos..).unwrap_or_default();
    if tail.len() as u64 != END_OF_ARCHIVE || tail.iter().any(|&b| b != 0) {
        let zeros = tail.iter().take_while(|&&b| b == 0).count();
        out.problem(
            name,
            format!(
                "after its last sample come {} bytes ({zeros} of them zero before anything else); a shard ends with exactly {END_OF_ARCHIVE} zero bytes",
                tail.len()
            ),
        );
    }
    // The writer names it after the shard: `shard-000003.tar` -> `shard-000003.idx`.
    let idx_name = format!("{}.idx", name.strip_suffix(".tar").unwrap_or(name));
    match files.read(&idx_name) {
        Err(e) => out.problem(&idx_name, format!("cannot read it: {e}")),
        Ok(raw) if raw != dali.as_bytes() => {
            let text = String::from_utf8_lossy(&raw);
            let line = text.lines().zip(dali.lines()).position(|(a, b)| a != b);
            let reason = match line {
                Some(i) => format!(
                    "line {} is {:?}, the tar says {:?}",
                    i + 1,
                    text.lines().nth(i).unwrap_or_default(),
                    dali.lines().nth(i).unwrap_or_default()
                ),
                None => format!("has {} lines, the tar needs {}", text.lines().count(), dali.lines().count()),
            };
            out.problem(&idx_name, reason);
        }
        Ok(_) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use super::super::testing::{check, find, flip, packed, places};
    use crate::sink::webdataset::ShardLimits;
    use crate::OutputFormat;

    /// testdata packed into several small shards.
    fn shards(dir: &Path) -> (PathBuf, Vec<String>) {
        let limits = ShardLimits { max_bytes: 1 << 20, max_samples: Some(8) };
        let out = packed(dir, OutputFormat::WebDataset { prefix: "s".into(), limits, md5: true });
        let meta = imgpack_reader::open(&out).unwrap().meta().clone();
        let names = meta.shards.iter().map(|s| s.name.clone()).collect();
        (out, names)
    }

    #[test]
    fn intact_shards_verify_clean() {
        let dir = tempfile::tempdir().unwrap();
        let (out, names) = shards(dir.path());
        assert!(names.len() > 2);
        let verified = check(&out, true);
        assert!(verified.is_ok(), "{:?}", verified.problems);
        assert_eq!(verified.checked, verified.expected);
    }

    #[test]
    fn a_flipped_sample_byte_names_the_sample() {
        let dir = tempfile::tempdir().unwrap();
        let (out, _) = shards(dir.path());
        let dataset = imgpack_reader::open(&out).unwrap();
        let sample = dataset.get(10).unwrap();
        let (key, image) = (sample.key.clone(), sample.payload().unwrap().1.to_vec());
        drop(sample);
        drop(dataset);
        let shard = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.extension().is_some_and(|e| e == "tar")
                    && fs::read(p).unwrap().windows(image.len()).any(|w| w == image)
            })
            .unwrap();
        flip(&shard, find(&shard, &image) + 1);
        let verified = check(&out, false);
        let places = places(&verified);
        assert!(places.iter().any(|p| p.contains(&key)), "{places:?}");
        assert!(
            places.iter().all(|p| p.contains(&key) || p.ends_with(".tar")),
            "only the sample and its shard: {places:?}"
        );
    }

    #[test]
    fn a_truncated_or_missing_shard_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (out, names) = shards(dir.path());
        let (first, second) = (out.join(&names[0]), out.join(&names[1]));
        let len = fs::metadata(&first).unwrap().len();
        fs::OpenOptions::new().write(true).open(&first).unwrap().set_len(len - 700).unwrap();
        fs::remove_file(&second).unwrap();
        let verified = check(&out, false);
        let places = places(&verified);
        assert!(places.iter().any(|p| p == &names[0]), "{places:?}");
        assert!(places.iter().any(|p| p == &names[1]), "{places:?}");
    }

    #[test]
    fn wrong_indexes_are_named_by_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let (out, names) = shards(dir.path());
        // wids: one shard's MD5 changed.
        let wids = out.join(imgpack_reader::webdataset::WIDS_INDEX_FILE);
        let text = fs::read_to_string(&wids).unwrap();
        let md5 = text.split("\"md5sum\": \"").nth(1).unwrap()[..32].to_string();
        fs::write(&wids, text.replacen(&md5, &"0".repeat(32), 1)).unwrap();
        // DALI: one offset changed.
        let idx = out.join(names[0].replace(".tar", ".idx"));
        let dali = fs::read_to_string(&idx).unwrap();
        let line = dali.lines().nth(1).unwrap().to_string();
        let mut fields: Vec<String> = line.split(' ').map(String::from).collect();
        fields[1] = (fields[1].parse::<u64>().unwrap() + 512).to_string();
        fs::write(&idx, dali.replacen(&line, &fields.join(" "), 1)).unwrap();
        let verified = check(&out, false);
        let places = places(&verified);
        assert!(places.iter().any(|p| p.contains("shardindex.json")), "{places:?}");
        assert!(places.iter().any(|p| p.ends_with(".idx")), "{places:?}");
        assert_eq!(verified.checked, verified.expected, "the samples themselves are intact");
    }
}
