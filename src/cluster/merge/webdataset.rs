//! `pack merge` of WebDataset parts: the shards stay where the parts wrote them; samples after a
//! skipped file are renumbered in place (same-length tar headers, CRC-32s, shard checksums and
//! DALI indexes recomputed), and the dataset-level index, `shardindex.json` and metadata are written.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use imgpack_reader::checksum::crc32;
use imgpack_reader::key::{format_key, split_field_name};
use imgpack_reader::webdataset::{
    dali_index_header, dali_index_line, parse_member, DaliComponent, IndexEntry, IndexHeader, WidsIndex,
    BLOCK, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, INDEX_VERSION, META_FILE, SAMPLE_INDEX_FILE, WIDS_INDEX_FILE,
};
use imgpack_reader::{Meta, ShardInfo};
use md5::{Digest, Md5};
use rayon::prelude::*;

use crate::encoding::{hex, json_bytes};
use crate::fs::replace_file;
use crate::progress::Progress;
use crate::sink::webdataset::ustar_header;
use crate::{Error, Result};

use super::{dataset_bytes, stop_requested, FoundPart, MergeOptions};

/// Where a WebDataset merge reads the parts' files and writes the merged dataset's: a local
/// directory ([`Local`]) or a store prefix ([`super::stored`]). The merge itself — which keys
/// move, what every checksum becomes, what the dataset-level files hold — is the same code for
/// both, so a merge in a store leaves the objects a local merge leaves as files.
pub(super) trait Files: Sync {
    /// The sample index (`imgpack.index`) of `part`, to read from its start.
    fn index(&self, part: &FoundPart) -> Result<Box<dyn Read + '_>>;
    /// Opens shard `shard` of `part` to be renumbered ([`renumber_shard`]).
    fn shard(&self, part: &FoundPart, shard: &ShardInfo) -> Result<Box<dyn Shard + '_>>;
    /// Where the merged index is written before [`Files::publish_file`] publishes it.
    fn index_temp(&self) -> PathBuf;
    /// Publishes the file at `temp` as the dataset's file `name`.
    fn publish_file(&self, temp: &Path, name: &str) -> Result<()>;
    /// Writes `bytes` as file `name` (relative to the output: `part-.../x.idx`, `imgpack.json`).
    fn publish(&self, name: &str, bytes: &[u8]) -> Result<()>;
    /// The bytes the merged dataset `meta` occupies.
    fn dataset_bytes(&self, meta: &Meta) -> Result<u64>;
    /// The output, as messages name it (a directory, or the `s3://` prefix).
    fn output(&self) -> PathBuf;
}

/// One shard being renumbered: read sample by sample, in order, and written back.
pub(super) trait Shard {
    /// How messages name it.
    fn path(&self) -> &Path;
    /// Reads the sample at `entry` into `buf` (entries come in order, contiguous from offset 0).
    fn read(&mut self, entry: &IndexEntry, buf: &mut [u8]) -> Result<()>;
    /// Writes back the sample read at `entry`, now `buf`: only the tar headers at the offsets
    /// `changed` (of `buf`) differ from what was read.
    fn write(&mut self, entry: &IndexEntry, buf: &[u8], changed: &[usize]) -> Result<()>;
    /// Reads the bytes from `pos` to the end of the shard (the end-of-archive blocks) and
    /// writes them back as they are.
    fn tail(&mut self, pos: u64) -> Result<Vec<u8>>;
    /// Makes what was written durable; the shard holds its new names when this returns.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// A merge in a local directory: shards are rewritten in place, a header at a time.
pub(super) struct Local<'a> {
    /// The output directory.
    pub out: &'a Path,
}

impl Files for Local<'_> {
    fn index(&self, part: &FoundPart) -> Result<Box<dyn Read + '_>> {
        let path = part.dir.join(SAMPLE_INDEX_FILE);
        Ok(Box::new(BufReader::new(File::open(&path).map_err(Error::io(&path))?)))
    }

    fn shard(&self, part: &FoundPart, shard: &ShardInfo) -> Result<Box<dyn Shard + '_>> {
        let path = part.dir.join(&shard.name);
        let file = fs::OpenOptions::new().read(true).write(true).open(&path).map_err(Error::io(&path))?;
        let len = file.metadata().map_err(Error::io(&path))?.len();
        if len != shard.bytes {
            return Err(damaged(&path, format!("{len} bytes, the part's metadata says {}", shard.bytes)));
        }
        Ok(Box::new(LocalShard { file, path, len }))
    }

    fn index_temp(&self) -> PathBuf {
        crate::fs::temp_path(&self.out.join(SAMPLE_INDEX_FILE))
    }

    fn publish_file(&self, temp: &Path, name: &str) -> Result<()> {
        let path = self.out.join(name);
        fs::rename(temp, &path).map_err(Error::io(&path))
    }

    fn publish(&self, name: &str, bytes: &[u8]) -> Result<()> {
        replace_file(&self.out.join(name), bytes)
    }

    fn dataset_bytes(&self, meta: &Meta) -> Result<u64> {
        Ok(dataset_bytes(self.out, meta))
    }

    fn output(&self) -> PathBuf {
        self.out.to_path_buf()
    }
}

/// A shard file rewritten in place: only the headers that change are written.
struct LocalShard {
    file: File,
    path: PathBuf,
    len: u64,
}

impl Shard for LocalShard {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read(&mut self, entry: &IndexEntry, buf: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(buf, entry.offset).map_err(Error::io(&self.path))
    }

    fn write(&mut self, entry: &IndexEntry, buf: &[u8], changed: &[usize]) -> Result<()> {
        for &at in changed {
            self.file
                .write_all_at(&buf[at..at + BLOCK as usize], entry.offset + at as u64)
                .map_err(Error::io(&self.path))?;
        }
        Ok(())
    }

    fn tail(&mut self, pos: u64) -> Result<Vec<u8>> {
        let mut tail = vec![0u8; self.len.saturating_sub(pos) as usize];
        self.file.read_exact_at(&mut tail, pos).map_err(Error::io(&self.path))?;
        Ok(tail)
    }

    fn finish(self: Box<Self>) -> Result<()> {
        self.file.sync_data().map_err(Error::io(&self.path))
    }
}

/// The error for a damaged shard or index at `path`.
pub(super) fn damaged(path: &Path, reason: String) -> Error {
    Error::Merge {
        path: path.to_path_buf(),
        reason: format!("{reason}; the part is damaged: re-pack it with --overwrite"),
    }
}

/// Writes the dataset-level files of a WebDataset merged from `parts` into `files` (renumbering
/// the parts that need it first); `meta` gets the shard list. Returns the dataset's size.
pub(super) fn merge(
    files: &dyn Files,
    parts: &[FoundPart],
    meta: &mut Meta,
    options: &MergeOptions,
    bar: &dyn Progress,
) -> Result<u64> {
    let moved = parts.iter().filter(|p| p.renumbered()).flat_map(|p| &p.meta.shards).map(|s| s.bytes).sum();
    bar.length(moved);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.get())
        .build()
        .map_err(|e| Error::Threads { threads: options.threads.get(), reason: e.to_string() })?;
    let index_temp = files.index_temp();
    let written = write_merged(files, parts, meta, &pool, &index_temp, bar);
    if written.is_err() {
        // Stopped or failed before publishing: leave the output as it was found.
        let _ = fs::remove_file(&index_temp);
    }
    written
}

/// [`merge`] with its thread pool, writing the merged index at `index_temp` and publishing it.
fn write_merged(
    files: &dyn Files,
    parts: &[FoundPart],
    meta: &mut Meta,
    pool: &rayon::ThreadPool,
    index_temp: &Path,
    bar: &dyn Progress,
) -> Result<u64> {
    let io = Error::io(index_temp);
    let mut index = BufWriter::new(File::create(index_temp).map_err(io)?);
    index.write_all(&[0; INDEX_HEADER_LEN]).map_err(Error::io(index_temp))?;
    let mut shards: Vec<ShardInfo> = Vec::new();
    for part in parts {
        let mut entries = read_index(part, files.index(part)?)?;
        let mut part_shards = part.meta.shards.clone();
        if part.renumbered() {
            let results: Vec<Result<Renumbered>> = pool.install(|| {
                part_shards
                    .par_iter()
                    .map(|shard| {
                        stop_requested(&files.output())?;
                        let range = shard.first as usize..(shard.first + shard.samples) as usize;
                        let renumbered = renumber_shard(files, part, shard, &entries[range]);
                        bar.advance(shard.bytes);
                        renumbered
                    })
                    .collect()
            });
            for (shard, result) in part_shards.iter_mut().zip(results) {
                let renumbered = result?;
                shard.crc32 = Some(renumbered.crc32);
                shard.md5 = renumbered.md5;
                for (entry, crc) in entries[shard.first as usize..].iter_mut().zip(renumbered.crcs) {
                    entry.crc32 = crc;
                }
            }
        }
        let shard_base = shards.len() as u32;
        for mut entry in entries {
            entry.shard += shard_base;
            index.write_all(&entry.encode()).map_err(Error::io(index_temp))?;
        }
        shards.extend(part_shards.into_iter().map(|s| ShardInfo {
            name: format!("{}/{}", part.name, s.name),
            first: part.new_first + s.first,
            ..s
        }));
    }
    meta.shards = shards;
    let meta_json = json_bytes(meta);
    let header = IndexHeader { version: INDEX_VERSION, meta_crc32: crc32(&meta_json), samples: meta.samples };
    let mut index = index.into_inner().map_err(|e| Error::io(index_temp)(e.into_error()))?;
    index.seek(SeekFrom::Start(0)).map_err(Error::io(index_temp))?;
    index.write_all(&header.encode()).and_then(|()| index.sync_all()).map_err(Error::io(index_temp))?;
    drop(index);
    stop_requested(&files.output())?;
    files.publish_file(index_temp, SAMPLE_INDEX_FILE)?;
    files.publish(WIDS_INDEX_FILE, &json_bytes(&WidsIndex::of(&meta.shards)))?;
    // Last: a directory with imgpack.json is a finished dataset.
    files.publish(META_FILE, &meta_json)?;
    bar.finish();
    files.dataset_bytes(meta)
}

/// The index entries of a WebDataset part, read from `file`, checked against its metadata.
fn read_index(part: &FoundPart, file: impl Read) -> Result<Vec<IndexEntry>> {
    let path = part.dir.join(SAMPLE_INDEX_FILE);
    let damaged = |reason: String| Error::Merge {
        path: part.dir.clone(),
        reason: format!("{SAMPLE_INDEX_FILE}: {reason}; the part is damaged: re-pack it with --overwrite"),
    };
    let mut file = BufReader::new(file);
    let mut header = [0u8; INDEX_HEADER_LEN];
    file.read_exact(&mut header).map_err(Error::io(&path))?;
    let header = IndexHeader::decode(&header).ok_or_else(|| damaged("no valid header".into()))?;
    if header.samples != part.meta.samples {
        return Err(damaged(format!("{} entries for {} samples", header.samples, part.meta.samples)));
    }
    let mut entries = Vec::with_capacity(part.meta.samples as usize);
    let mut raw = [0u8; INDEX_ENTRY_LEN];
    for _ in 0..part.meta.samples {
        file.read_exact(&mut raw).map_err(Error::io(&path))?;
        entries.push(IndexEntry::decode(&raw));
    }
    let shards_cover = part.meta.shards.iter().map(|s| s.samples).sum::<u64>() == part.meta.samples
        && part.meta.shards.iter().enumerate().all(|(n, s)| {
            entries[s.first as usize..(s.first + s.samples) as usize].iter().all(|e| e.shard as usize == n)
        });
    if !shards_cover {
        return Err(damaged("entries do not match the shards the metadata lists".into()));
    }
    Ok(entries)
}

/// A shard after renumbering.
pub(super) struct Renumbered {
    /// The whole shard's CRC-32.
    crc32: u32,
    /// Its MD5, if the part's shards have one (packed with `--md5`).
    md5: Option<String>,
    /// Each sample's CRC-32.
    crcs: Vec<u32>,
}

/// Gives the samples of one shard of a part their merged keys: rewrites each member's tar
/// header (only if it still carries the part's key), checks the sample against its recorded
/// CRC-32 under its old key, and returns the new CRC-32s and the shard's new MD5; rewrites the
/// shard's DALI index. Running it twice gives the same result.
fn renumber_shard(
    files: &dyn Files,
    part: &FoundPart,
    shard: &ShardInfo,
    entries: &[IndexEntry],
) -> Result<Renumbered> {
    let mut file = files.shard(part, shard)?;
    let path = file.path().to_path_buf();
    let damaged = |reason: String| damaged(&path, reason);
    let width = part.meta.key_width;
    let mut md5 = shard.md5.is_some().then(Md5::new);
    let mut shard_crc = crc32fast::Hasher::new();
    let mut crcs = Vec::with_capacity(entries.len());
    let mut dali = dali_index_header(entries.len() as u64);
    let mut buf = Vec::new();
    let mut changed = Vec::new();
    let mut pos = 0u64;
    for (j, entry) in entries.iter().enumerate() {
        if entry.offset != pos {
            return Err(damaged(format!("sample {j} starts at {}, not at {pos}", entry.offset)));
        }
        buf.resize(entry.len as usize, 0);
        file.read(entry, &mut buf)?;
        let old_key = format_key(part.info.first + shard.first + j as u64, width);
        let new_key = format_key(part.new_first + shard.first + j as u64, width);
        // Each member: where its header is, its extension and size.
        let mut members = Vec::new();
        let mut at = 0;
        while at < buf.len() {
            let member = parse_member(&buf, at).map_err(|r| damaged(format!("sample {old_key}: {r}")))?;
            let (key, ext) = split_field_name(member.name)
                .filter(|(key, _)| *key == old_key || *key == new_key)
                .ok_or_else(|| damaged(format!("member {:?} is not sample {old_key}'s", member.name)))?;
            members.push((at, ext.to_string(), member.data.len() as u64, key == new_key));
            at = member.next;
        }
        let set_headers = |buf: &mut [u8], key: &str| -> Result<()> {
            for (at, ext, size, _) in &members {
                let header = ustar_header(&format!("{key}.{ext}"), *size).map_err(damaged)?;
                buf[*at..*at + BLOCK as usize].copy_from_slice(&header);
            }
            Ok(())
        };
        set_headers(&mut buf, &old_key)?;
        if crc32(&buf) != entry.crc32 {
            return Err(damaged(format!("sample {old_key} does not match its CRC-32")));
        }
        set_headers(&mut buf, &new_key)?;
        changed.clear();
        changed.extend(members.iter().filter(|m| !m.3).map(|m| m.0));
        file.write(entry, &buf, &changed)?;
        let components = members.iter().map(|(at, ext, size, _)| DaliComponent {
            ext: ext.clone(),
            offset: entry.offset + *at as u64 + BLOCK,
            size: *size,
            name: format!("{new_key}.{ext}"),
        });
        dali.push_str(&dali_index_line(&components.collect::<Vec<_>>()));
        let crc = crc32(&buf);
        crcs.push(crc);
        shard_crc.combine(&crc32fast::Hasher::new_with_initial_len(crc, buf.len() as u64));
        if let Some(md5) = &mut md5 {
            md5.update(&buf);
        }
        pos += entry.len;
    }
    let tail = file.tail(pos)?;
    shard_crc.update(&tail);
    if let Some(md5) = &mut md5 {
        md5.update(&tail);
    }
    file.finish()?;
    let idx = format!("{}/{}.idx", part.name, shard.name.strip_suffix(".tar").unwrap_or(&shard.name));
    files.publish(&idx, dali.as_bytes())?;
    Ok(Renumbered { crc32: shard_crc.finalize(), md5: md5.map(|m| hex(&m.finalize())), crcs })
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use imgpack_reader::webdataset::{parse_member, BLOCK, END_OF_ARCHIVE};
    use md5::{Digest, Md5};

    use super::super::testing::parts;
    use super::super::{find_parts, merge, MergeOptions};
    use super::*;
    use crate::OutputFormat;

    fn limits() -> OutputFormat {
        let limits = crate::sink::webdataset::ShardLimits { max_bytes: 1 << 20, max_samples: Some(5) };
        OutputFormat::WebDataset { prefix: "s".into(), limits, md5: true }
    }

    #[test]
    fn renumbering_a_shard_rewrites_its_names_crcs_md5_and_dali_index() {
        let dir = tempfile::tempdir().unwrap();
        let (_, out) = parts(dir.path(), limits(), 2);
        let found = find_parts(&out).unwrap();
        let part = &found[1];
        assert_eq!(part.new_first + 1, part.info.first, "one sample skipped before it");
        let entries = read_index(part, Local { out: &out }.index(part).unwrap()).unwrap();
        let shard = &part.meta.shards[0];
        let run =
            || renumber_shard(&Local { out: &out }, part, shard, &entries[..shard.samples as usize]).unwrap();
        let first = run();
        let bytes = fs::read(part.dir.join(&shard.name)).unwrap();
        assert_eq!(first.md5, Some(hex(&Md5::digest(&bytes))), "MD5 of the rewritten shard");
        assert_eq!(first.crc32, crc32(&bytes), "CRC-32 of the rewritten shard, combined from its samples'");
        let mut pos = 0;
        let mut dali_names = Vec::new();
        for (j, entry) in entries[..shard.samples as usize].iter().enumerate() {
            let sample = &bytes[entry.offset as usize..(entry.offset + entry.len) as usize];
            assert_eq!(first.crcs[j], crc32(sample), "CRC-32 of sample {j} as it now is");
            let key = format_key(part.new_first + j as u64, part.meta.key_width);
            let mut at = 0;
            while at < sample.len() {
                let member = parse_member(sample, at).unwrap();
                assert_eq!(split_field_name(member.name).unwrap().0, key, "member of sample {j}");
                dali_names.push(member.name.to_string());
                at = member.next;
            }
            pos = entry.offset + entry.len;
        }
        assert!(bytes.len() as u64 >= pos + END_OF_ARCHIVE, "the end-of-archive blocks follow");
        assert!(bytes[pos as usize..].iter().all(|&b| b == 0));
        let idx = fs::read_to_string(part.dir.join(shard.name.replace(".tar", ".idx"))).unwrap();
        for name in &dali_names {
            assert!(idx.contains(&format!(" {name}")), "DALI index names {name}:\n{idx}");
        }
        // Again: nothing changes (an interrupted merge is run again).
        let second = run();
        assert_eq!((second.crc32, second.md5, second.crcs), (first.crc32, first.md5, first.crcs));
        assert_eq!(fs::read(part.dir.join(&shard.name)).unwrap(), bytes);
    }

    #[test]
    fn a_damaged_sample_is_refused_naming_its_shard() {
        let dir = tempfile::tempdir().unwrap();
        let (_, out) = parts(dir.path(), limits(), 2);
        let found = find_parts(&out).unwrap();
        let part = &found[1];
        let entries = read_index(part, Local { out: &out }.index(part).unwrap()).unwrap();
        let shard = &part.meta.shards[0];
        let path = part.dir.join(&shard.name);
        let mut bytes = fs::read(&path).unwrap();
        let at = (entries[1].offset + BLOCK + 7) as usize;
        bytes[at] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let Err(Error::Merge { path: named, reason }) =
            renumber_shard(&Local { out: &out }, part, shard, &entries[..shard.samples as usize])
        else {
            panic!("a damaged sample was renumbered");
        };
        assert_eq!(named, path);
        assert!(reason.contains("CRC-32") && reason.contains("--overwrite"), "{reason}");
    }

    #[test]
    fn merged_shards_read_as_one_dataset_with_keys_without_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, out) = parts(dir.path(), limits(), 3);
        let options = MergeOptions { keep_parts: false, threads: NonZeroUsize::MIN, endpoint: None };
        let merged = merge(&out, &options, &crate::progress::Silent).unwrap();
        let dataset = imgpack_reader::open(&out).unwrap().verify_checksums(true).unwrap();
        assert_eq!((dataset.len(), merged.skipped.len()), (merged.packed, 1));
        for i in 0..dataset.len() {
            let sample = dataset.get(i).unwrap();
            assert_eq!(sample.key, format_key(i, dataset.meta().key_width));
            let path = sample.info().unwrap().path;
            assert_eq!(sample.payload().unwrap().1, fs::read(tree.join(&path)).unwrap(), "{path}");
        }
        // wids' shardindex.json lists each shard's MD5 of the bytes as merged.
        let wids: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join(WIDS_INDEX_FILE)).unwrap()).unwrap();
        for shard in wids["shardlist"].as_array().unwrap() {
            let bytes = fs::read(out.join(shard["url"].as_str().unwrap())).unwrap();
            assert_eq!(shard["md5sum"].as_str().unwrap(), hex(&Md5::digest(&bytes)));
        }
    }
}
