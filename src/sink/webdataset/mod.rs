//! The WebDataset sink: tar shards with their DALI and `wids` indexes, written in one pass.
//! Layout: see [`imgpack_reader::webdataset`].
//!
//! Offsets are known while writing, so every index is produced as the shards are written — no
//! second pass over the data. Each shard is written to its final name inside the staged output
//! directory, around the page cache (module `direct`: filling it was ~40% of packing's CPU
//! time) unless `--md5` needs to read it back. Its CRC-32 costs nothing: each sample's CRC
//! (header, data, padding) is known already, and CRC-32s of consecutive byte ranges combine in
//! a few operations (`crc32fast::Hasher::combine`). Its MD5, written only with `--md5`, is costly (about
//! 600 MB/s, and it cannot be split within a file: measured as about half of packing's CPU time
//! on 2 cores), so it runs on a thread of its own per shard, reading back what has been flushed
//! while it is still in the page cache. When a shard is complete it is also handed to a
//! background thread that `fsync`s it while the next shard is being written, so the final sync
//! before publishing has little left.
//!
//! A shard whose checksums are known and whose file and DALI index are synced is a checkpoint
//! for `--resume` ([`Sink::checkpoint`]); a resumed sink deletes the shards after the last one,
//! cuts `imgpack.index` back to it, and writes on from there.
//!
//! The same sink writes to an object store prefix (`-o s3://bucket/prefix/`): its
//! `destination` module is where the files go, a staged directory or the store, and the bytes
//! do not change. There a shard is a checkpoint once its upload has completed and its DALI
//! index and its piece of `imgpack.index` are stored; a resumed sink checks what it keeps
//! against the journal and the store's listing, as on disk.

mod destination;
mod direct;

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use imgpack_reader::webdataset::{
    dali_index_file_name, dali_index_header, dali_index_line, member_len, shard_file_name, DaliComponent,
    IndexEntry, IndexHeader, WidsIndex, BLOCK, END_OF_ARCHIVE, INDEX_ENTRY_LEN, INDEX_HEADER_LEN,
    INDEX_VERSION, MAX_NAME, META_FILE, SAMPLE_INDEX_FILE, WIDS_INDEX_FILE,
};
use imgpack_reader::{Meta, ShardInfo};
use md5::{Digest, Md5};

use super::{Durable, Finished, PackedSample, Sink};
use crate::encoding::{hex, json_bytes};
use crate::pack::staged::Staged;
use crate::store::lock::StoreLock;
use crate::store::Store;
use crate::{Error, Result};
use destination::{Closed, Destination, ShardOut};

/// When to start a new shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLimits {
    /// No shard file grows past this many bytes, headers and end blocks included, unless a
    /// single sample alone is larger.
    pub max_bytes: u64,
    /// At most this many samples per shard.
    pub max_samples: Option<u64>,
}

impl ShardLimits {
    /// Whether a sample taking `sample_bytes` of tar fits in a shard already holding
    /// `samples` samples in `bytes` bytes (end blocks not counted yet).
    pub fn fits(&self, bytes: u64, samples: u64, sample_bytes: u64) -> bool {
        samples == 0
            || (bytes + sample_bytes + END_OF_ARCHIVE <= self.max_bytes
                && self.max_samples.is_none_or(|max| samples < max))
    }
}

/// Writes a directory of tar shards and their indexes.
pub struct WebDatasetSink {
    dest: Destination,
    prefix: String,
    limits: ShardLimits,
    shard: Option<ShardWriter>,
    shards: Vec<ShardInfo>,
    index: Option<BufWriter<File>>,
    samples: u64,
    warnings: Vec<String>,
    syncer: Syncer,
    /// Whether shards get an MD5 (`--md5`).
    md5: bool,
    /// MD5 threads of closed shards whose MD5 is not collected yet, in shard order.
    hashing: std::collections::VecDeque<ShardHasher>,
    /// Shards (from the first) whose MD5 is collected (all closed shards without `--md5`).
    hashed: usize,
    /// Shards (from the first) reported durable by the last checkpoint.
    durable: usize,
    /// In a store: the ETag of each closed shard, in order.
    etags: Vec<String>,
}

struct ShardWriter {
    number: usize,
    /// Names the shard in errors: its path, or its object's URL.
    path: PathBuf,
    out: ShardOut,
    /// The CRC-32 of the shard so far, combined from its samples'.
    crc: crc32fast::Hasher,
    /// With `--md5`: the thread hashing the shard.
    hasher: Option<ShardHasher>,
    /// Bytes written since the hasher was last told how far the file is flushed.
    unannounced: u64,
    /// Bytes written since the shard's writeback was last started ([`start_writeback`]).
    unflushed: u64,
    bytes: u64,
    first: u64,
    samples: u64,
    dali: String,
}

impl WebDatasetSink {
    /// Starts a WebDataset output in directory `target`.
    pub fn create(
        target: &Path,
        overwrite: bool,
        prefix: &str,
        limits: ShardLimits,
        md5: bool,
    ) -> Result<WebDatasetSink> {
        WebDatasetSink::start(Staged::create_dir(target, overwrite)?, prefix, limits, md5)
    }

    /// Starts a WebDataset output in a fresh staged directory; `md5`: give every shard an MD5
    /// too (`--md5`).
    pub fn start(staged: Staged, prefix: &str, limits: ShardLimits, md5: bool) -> Result<WebDatasetSink> {
        WebDatasetSink::begin(Destination::Dir(staged), prefix, limits, md5)
    }

    /// Starts a WebDataset output under a store prefix that [`crate::pack::resume::stage_store`]
    /// has prepared, streaming each shard up as it is written.
    /// `lock` is the run's lease on the prefix, held until the sink is published or dropped.
    pub fn to_store(
        store: Store,
        lock: StoreLock,
        prefix: &str,
        limits: ShardLimits,
        md5: bool,
    ) -> Result<WebDatasetSink> {
        WebDatasetSink::begin(Destination::store(store, lock, None)?, prefix, limits, md5)
    }

    /// Continues the output an interrupted run left under `store`'s prefix from its checkpoint
    /// `durable`: each shard it lists must be stored with the size and ETag the journal
    /// recorded, with its DALI index and its piece of `imgpack.index` (checked against the
    /// shard's CRC-32); every later shard, index and piece is deleted, and the local spool of
    /// `imgpack.index` is rebuilt from the pieces.
    pub fn resume_in_store(
        store: Store,
        lock: StoreLock,
        prefix: &str,
        limits: ShardLimits,
        md5: bool,
        durable: &Durable,
    ) -> Result<WebDatasetSink> {
        let url = std::path::PathBuf::from(store.url().to_string());
        let stale = |reason: String| Error::Resume {
            path: url.clone(),
            reason: format!("the interrupted run's stored shards do not match its journal ({reason})"),
        };
        let listed = store.read().list_objects(None)?;
        let kept = durable.shards.len();
        let later = |name: &str| {
            let name = name
                .strip_prefix(crate::pack::resume::STORE_SCRATCH)
                .map_or(name, |n| n.strip_prefix('/').and_then(|n| n.strip_suffix(".index")).unwrap_or(n));
            shard_number(name, prefix).is_some_and(|n| n >= kept)
        };
        let stale_names: Vec<String> = listed
            .iter()
            .filter(|o| {
                later(&o.name) || [META_FILE, WIDS_INDEX_FILE, SAMPLE_INDEX_FILE].contains(&o.name.as_str())
            })
            .map(|o| o.name.clone())
            .collect();
        let object = |name: &str| listed.iter().find(|o| o.name == name);
        let dest = Destination::store(store.clone(), lock, Some(Vec::new()))?;
        let index_path = dest.index_path();
        let mut index = BufWriter::new(dest.create_index()?);
        let header = IndexHeader { version: INDEX_VERSION, meta_crc32: 0, samples: 0 };
        index.write_all(&header.encode()).map_err(Error::io(&index_path))?;
        for (i, shard) in durable.shards.iter().enumerate() {
            let stored = object(&shard.name);
            check_kept(shard, stored.map(|o| o.size), md5).map_err(stale)?;
            let e_tag = stored.and_then(|o| o.e_tag.clone()).unwrap_or_default();
            if durable.etags.get(i).is_some_and(|recorded| *recorded != e_tag) {
                return Err(stale(format!(
                    "{} has ETag {e_tag}, the journal says {}: it was replaced",
                    shard.name, durable.etags[i]
                )));
            }
            let dali = dali_index_file_name(prefix, i);
            if object(&dali).is_none() {
                return Err(stale(format!("{dali} is missing")));
            }
            let piece = destination::index_piece(&shard.name);
            let entries = store.read().get(&piece)?;
            check_index_piece(&entries, i, shard).map_err(|reason| stale(format!("{piece}: {reason}")))?;
            index.write_all(&entries).map_err(Error::io(&index_path))?;
        }
        store.delete(&stale_names)?;
        let mut sink = WebDatasetSink::with(dest, prefix, limits, md5, index, durable);
        sink.etags = durable.etags.clone();
        Ok(sink)
    }

    fn begin(dest: Destination, prefix: &str, limits: ShardLimits, md5: bool) -> Result<WebDatasetSink> {
        let index_path = dest.index_path();
        let mut index = BufWriter::new(dest.create_index()?);
        let header = IndexHeader { version: INDEX_VERSION, meta_crc32: 0, samples: 0 };
        index.write_all(&header.encode()).map_err(Error::io(&index_path))?;
        Ok(WebDatasetSink::with(dest, prefix, limits, md5, index, &Durable::default()))
    }

    /// Continues the output an interrupted run left in `staged` from its checkpoint `durable`:
    /// the shards it lists are kept as they are (their sizes are checked), every later shard
    /// and index is deleted, and `imgpack.index` is cut back to the checkpoint's samples.
    pub fn resume(
        staged: Staged,
        prefix: &str,
        limits: ShardLimits,
        md5: bool,
        durable: &Durable,
    ) -> Result<WebDatasetSink> {
        let dir = staged.path().to_path_buf();
        let stale = |reason: String| Error::Resume {
            path: dir.clone(),
            reason: format!("the interrupted run's shards do not match its journal ({reason})"),
        };
        let kept = durable.shards.len();
        for entry in std::fs::read_dir(&dir).map_err(Error::io(&dir))? {
            let path = entry.map_err(Error::io(&dir))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let later = shard_number(&name, prefix).is_some_and(|n| n >= kept);
            if later || name == META_FILE || name == WIDS_INDEX_FILE {
                std::fs::remove_file(&path).map_err(Error::io(&path))?;
            }
        }
        for shard in &durable.shards {
            let len = std::fs::metadata(dir.join(&shard.name)).map(|m| m.len()).ok();
            check_kept(shard, len, md5).map_err(stale)?;
        }
        let index_path = dir.join(SAMPLE_INDEX_FILE);
        let mut file =
            std::fs::OpenOptions::new().write(true).open(&index_path).map_err(Error::io(&index_path))?;
        let len = INDEX_HEADER_LEN as u64 + durable.samples * INDEX_ENTRY_LEN as u64;
        if file.metadata().map_err(Error::io(&index_path))?.len() < len {
            return Err(stale(format!("{SAMPLE_INDEX_FILE} holds fewer than {} entries", durable.samples)));
        }
        file.set_len(len).map_err(Error::io(&index_path))?;
        file.seek(SeekFrom::End(0)).map_err(Error::io(&index_path))?;
        let dest = Destination::Dir(staged);
        Ok(WebDatasetSink::with(dest, prefix, limits, md5, BufWriter::new(file), durable))
    }

    fn with(
        dest: Destination,
        prefix: &str,
        limits: ShardLimits,
        md5: bool,
        index: BufWriter<File>,
        durable: &Durable,
    ) -> WebDatasetSink {
        let syncer = Syncer::start(dest.name(""));
        WebDatasetSink {
            dest,
            prefix: prefix.to_string(),
            limits,
            shard: None,
            shards: durable.shards.clone(),
            index: Some(index),
            samples: durable.samples,
            warnings: Vec::new(),
            syncer,
            md5,
            hashing: Default::default(),
            hashed: durable.shards.len(),
            durable: durable.shards.len(),
            etags: Vec::new(),
        }
    }

    fn write_sample(&mut self, sample: &PackedSample) -> Result<()> {
        let sample_bytes: u64 = sample.fields.iter().map(|(_, data)| member_len(data.len() as u64)).sum();
        let fits = self.shard.as_ref().is_none_or(|s| self.limits.fits(s.bytes, s.samples, sample_bytes));
        if !fits {
            self.close_shard()?;
        }
        if self.shard.is_none() {
            self.open_shard()?;
        }
        if sample_bytes + END_OF_ARCHIVE > self.limits.max_bytes {
            self.warnings.push(format!(
                "sample {} needs {} bytes of tar with the end-of-archive blocks, more than --shard-size {}; it has a shard of its own",
                sample.key,
                sample_bytes + END_OF_ARCHIVE,
                self.limits.max_bytes
            ));
        }
        let shard = self.shard.as_mut().expect("opened above");
        let start = shard.bytes;
        let mut crc = crc32fast::Hasher::new();
        let mut components = Vec::with_capacity(sample.fields.len());
        for (i, (ext, data)) in sample.fields.iter().enumerate() {
            let name = format!("{}.{ext}", sample.key);
            let header = ustar_header(&name, data.len() as u64).map_err(|reason| Error::BadOutput {
                path: self.dest.target(),
                reason: format!("sample {}: {reason}", sample.key),
            })?;
            components.push(DaliComponent {
                ext: ext.clone(),
                offset: shard.bytes + BLOCK,
                size: data.len() as u64,
                name,
            });
            let padding = &[0u8; BLOCK as usize][..((BLOCK - data.len() as u64 % BLOCK) % BLOCK) as usize];
            // The data's CRC was computed by the loader; only the header and padding are
            // summed here.
            crc.update(&header);
            crc.combine(&crc32fast::Hasher::new_with_initial_len(sample.field_crc(i), data.len() as u64));
            crc.update(padding);
            for part in [&header[..], data, padding] {
                shard.write(part)?;
            }
        }
        shard.dali.push_str(&dali_index_line(&components));
        shard.samples += 1;
        let entry = IndexEntry {
            offset: start,
            len: shard.bytes - start,
            shard: shard.number as u32,
            crc32: crc.finalize(),
        };
        shard.crc.combine(&crc32fast::Hasher::new_with_initial_len(entry.crc32, entry.len));
        let index = self.index.as_mut().expect("open until finish");
        index.write_all(&entry.encode()).map_err(|e| Error::io(self.dest.index_path())(e))?;
        self.samples += 1;
        Ok(())
    }

    fn open_shard(&mut self) -> Result<()> {
        let number = self.shards.len();
        let name = shard_file_name(&self.prefix, number);
        let path = self.dest.name(&name);
        let out = self.dest.create_shard(&name, self.limits.max_bytes, self.md5)?;
        // A file's MD5 is read back on a thread of its own; an upload's is summed as it goes.
        let on_disk = self.dest.in_store().is_none();
        let hasher = if self.md5 && on_disk { Some(ShardHasher::start(&path)?) } else { None };
        self.shard = Some(ShardWriter {
            number,
            path,
            crc: crc32fast::Hasher::new(),
            hasher,
            out,
            unannounced: 0,
            unflushed: 0,
            bytes: 0,
            first: self.samples,
            samples: 0,
            dali: dali_index_header(0),
        });
        Ok(())
    }

    /// Ends the current shard: end blocks, DALI index, shard record; hands it to the syncer.
    fn close_shard(&mut self) -> Result<()> {
        let Some(mut shard) = self.shard.take() else { return Ok(()) };
        shard.write(&[0u8; END_OF_ARCHIVE as usize])?;
        shard.crc.update(&[0u8; END_OF_ARCHIVE as usize]);
        let closed = shard.out.close(&shard.path)?;
        // The MD5 is collected later (`checkpoint`, `finish`): waiting here would stall the writer.
        if let Some(mut hasher) = shard.hasher {
            hasher.flushed_to(shard.bytes);
            hasher.close();
            self.hashing.push_back(hasher);
        }
        let name = shard_file_name(&self.prefix, shard.number);
        let dali_name = dali_index_file_name(&self.prefix, shard.number);
        let dali_path = self.dest.name(&dali_name);
        // The header line was written for 0 samples; replace it now that the count is known.
        let lines = shard.dali.split_once('\n').map_or("", |(_, rest)| rest);
        let dali = dali_index_header(shard.samples) + lines;
        let dali_file = self.dest.put(&dali_name, dali.as_bytes())?;
        let md5 = match &closed {
            Closed::Stored { md5, e_tag } => {
                self.etags.push(e_tag.clone());
                self.store_index_piece(&name, shard.first, shard.samples)?;
                md5.clone()
            }
            Closed::File(_) => None,
        };
        let hashed_now = !self.md5 || md5.is_some();
        self.shards.push(ShardInfo {
            name,
            first: shard.first,
            samples: shard.samples,
            bytes: shard.bytes,
            crc32: Some(shard.crc.finalize()),
            md5,
        });
        if hashed_now {
            self.hashed = self.shards.len();
        }
        if let (Closed::File(file), Some(dali_file)) = (closed, dali_file) {
            self.syncer.sync(vec![(file, shard.path), (dali_file, dali_path)]);
        }
        Ok(())
    }

    /// Stores shard `name`'s entries of `imgpack.index` (`samples` from sample `first`) as its
    /// piece, from the local spool: what a resumed run rebuilds the spool from.
    fn store_index_piece(&mut self, name: &str, first: u64, samples: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let Some(store) = self.dest.in_store() else { return Ok(()) };
        let index_path = self.dest.index_path();
        let index = self.index.as_mut().expect("open until finish");
        index.flush().map_err(Error::io(&index_path))?;
        let mut entries = vec![0u8; samples as usize * INDEX_ENTRY_LEN];
        let offset = INDEX_HEADER_LEN as u64 + first * INDEX_ENTRY_LEN as u64;
        index.get_ref().read_exact_at(&mut entries, offset).map_err(Error::io(&index_path))?;
        let piece = destination::index_piece(name);
        store.put(&piece, entries)?;
        self.dest.stored(piece);
        Ok(())
    }

    /// Collects the MD5s of closed shards, in order: those already computed, or (with `wait`)
    /// all of them.
    fn collect_md5s(&mut self, wait: bool) -> Result<()> {
        while self.hashing.front().is_some_and(|h| wait || h.handle.is_finished()) {
            let hasher = self.hashing.pop_front().expect("checked above");
            self.shards[self.hashed].md5 = Some(hasher.finish()?);
            self.hashed += 1;
        }
        Ok(())
    }
}

/// Whether a shard an interrupted run closed can be kept by `--resume`, found `len` bytes long
/// (`None`: missing): it must be as long as the journal says, and have the checksums the run
/// records (its CRC-32, and its MD5 with `--md5`), which shards of an earlier version may lack.
fn check_kept(shard: &ShardInfo, len: Option<u64>, md5: bool) -> std::result::Result<(), String> {
    if shard.crc32.is_none() || (md5 && shard.md5.is_none()) {
        return Err(format!(
            "{} has no {} recorded (an earlier version of pack wrote it)",
            shard.name,
            if shard.crc32.is_none() { "CRC-32" } else { "MD5" }
        ));
    }
    match len {
        Some(len) if len == shard.bytes => Ok(()),
        Some(len) => Err(format!("{} is {len} bytes, the journal says {}", shard.name, shard.bytes)),
        None => Err(format!("{} is missing, the journal lists it with {} bytes", shard.name, shard.bytes)),
    }
}

/// Why `entries`, a stored piece of `imgpack.index`, is not shard `number`'s as `shard`
/// records it: one entry per sample, in this shard, back to back from its start, their CRC-32s
/// combining into the shard's.
fn check_index_piece(entries: &[u8], number: usize, shard: &ShardInfo) -> std::result::Result<(), String> {
    if entries.len() as u64 != shard.samples * INDEX_ENTRY_LEN as u64 {
        return Err(format!(
            "{} bytes, where {} samples take {}",
            entries.len(),
            shard.samples,
            shard.samples * INDEX_ENTRY_LEN as u64
        ));
    }
    let (mut offset, mut crc) = (0u64, crc32fast::Hasher::new());
    for raw in entries.chunks_exact(INDEX_ENTRY_LEN) {
        let entry = IndexEntry::decode(raw.try_into().expect("chunks of the entry length"));
        if entry.shard as usize != number || entry.offset != offset {
            return Err(format!(
                "an entry points at shard {} offset {}, not at offset {offset} of this shard",
                entry.shard, entry.offset
            ));
        }
        offset += entry.len;
        crc.combine(&crc32fast::Hasher::new_with_initial_len(entry.crc32, entry.len));
    }
    crc.update(&[0u8; END_OF_ARCHIVE as usize]);
    if offset + END_OF_ARCHIVE != shard.bytes || Some(crc.finalize()) != shard.crc32 {
        return Err("its entries do not add up to the shard's size and CRC-32".into());
    }
    Ok(())
}

/// The shard number in a shard or DALI index file name of this prefix (`shard-000003.tar` is 3).
fn shard_number(name: &str, prefix: &str) -> Option<usize> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let digits = rest.strip_suffix(".tar").or_else(|| rest.strip_suffix(".idx"))?;
    (digits.len() >= 6 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())?
}

/// Asks the kernel to start writing `file`'s dirty pages out, without waiting: a shard's bytes
/// otherwise sit in the page cache until its background `fsync` (a 1 GB shard: the whole dataset
/// of a small run, all of it left to the final sync while the cores idle), as the LMDB sink's
/// module docs measure. A hint: if it fails, the shard's sync still writes everything.
fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; the call only queues writeback of its pages.
        unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    }
}

impl ShardWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write(bytes, &self.path)?;
        self.bytes += bytes.len() as u64;
        self.unannounced += bytes.len() as u64;
        if self.unannounced >= HASH_STEP {
            if let (Some(hasher), Some(file)) = (&self.hasher, self.out.file()) {
                file.flush().map_err(Error::io(&self.path))?;
                hasher.flushed_to(self.bytes);
            }
            self.unannounced = 0;
        }
        self.unflushed += bytes.len() as u64;
        if self.unflushed >= crate::sink::lmdb::WRITEBACK_BYTES {
            if let Some(file) = self.out.file() {
                start_writeback(file.get_ref());
            }
            self.unflushed = 0;
        }
        Ok(())
    }
}

impl Sink for WebDatasetSink {
    fn write_batch(&mut self, batch: &[PackedSample]) -> Result<()> {
        batch.iter().try_for_each(|sample| self.write_sample(sample))
    }

    fn checkpoint(&mut self, now: bool) -> Result<Option<Durable>> {
        if self.dest.in_store().is_some() {
            // A closed shard is stored, with its DALI index and its piece of imgpack.index.
            let durable = self.shards.len();
            if durable <= self.durable {
                return Ok(None);
            }
            self.durable = durable;
            self.dest.checkpointed();
            let shards = self.shards.clone();
            let samples = shards.iter().map(|s| s.samples).sum();
            return Ok(Some(Durable { samples, shards, etags: self.etags.clone() }));
        }
        self.collect_md5s(now)?;
        let synced = if now { self.syncer.wait()? } else { self.syncer.done() };
        let durable = self.hashed.min(synced);
        if durable <= self.durable {
            return Ok(None);
        }
        // The index entries of the durable shards' samples must be on disk too.
        let index_path = self.dest.index_path();
        let index = self.index.as_mut().expect("open until finish");
        index.flush().and_then(|()| index.get_ref().sync_data()).map_err(Error::io(&index_path))?;
        self.durable = durable;
        let shards = self.shards[..durable].to_vec();
        Ok(Some(Durable { samples: shards.iter().map(|s| s.samples).sum(), shards, etags: Vec::new() }))
    }

    fn finish(mut self: Box<Self>, meta: &Meta) -> Result<Finished> {
        self.close_shard()?;
        self.collect_md5s(true)?;
        let index_path = self.dest.index_path();
        let mut index = (self.index.take().expect("open until finish"))
            .into_inner()
            .map_err(|e| Error::Io { path: index_path.clone(), source: e.into_error() })?;
        let mut meta = meta.clone();
        meta.shards = self.shards.clone();
        let meta_json = json_bytes(&meta);
        // The header is written last: it carries the sample count and the metadata's CRC.
        let header = IndexHeader {
            version: INDEX_VERSION,
            meta_crc32: crc32fast::hash(&meta_json),
            samples: self.samples,
        };
        index.seek(SeekFrom::Start(0)).map_err(Error::io(&index_path))?;
        index.write_all(&header.encode()).map_err(Error::io(&index_path))?;
        index.flush().map_err(Error::io(&index_path))?;
        drop(index);
        self.dest.store_index()?;

        // A part is not a dataset: `wids` is pointed at the merged index, never at a part's.
        if meta.part.is_none() {
            let wids = WidsIndex::of(&self.shards);
            self.dest.put(WIDS_INDEX_FILE, &json_bytes(&wids))?;
        }
        // Last: in a store, this object is what makes the prefix a dataset — not if another
        // run has taken the prefix over meanwhile.
        self.dest.confirm_lease()?;
        self.dest.put(META_FILE, &meta_json)?;
        self.syncer.finish()?;
        let bytes = self.shards.iter().map(|s| s.bytes).sum();
        let WebDatasetSink { dest, warnings, .. } = *self;
        let path = dest.target();
        dest.publish()?;
        Ok(Finished { path, bytes, warnings })
    }
}

/// A ustar header for a regular file: deterministic (mtime 0, uid/gid 0, mode 0644, no names).
pub(crate) fn ustar_header(name: &str, size: u64) -> std::result::Result<[u8; 512], String> {
    if name.len() > MAX_NAME {
        return Err(format!("member name {name:?} is longer than {MAX_NAME} bytes"));
    }
    let mut header = tar::Header::new_ustar();
    header.set_path(name).map_err(|e| format!("member name {name:?}: {e}"))?;
    header.set_size(size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    Ok(*header.as_bytes())
}

/// How much is written between two notes to the hasher (each note costs a flush).
const HASH_STEP: u64 = 8 << 20;

/// Computes one shard's MD5 on its own thread, reading the shard back as it is flushed.
struct ShardHasher {
    /// `None` once the shard is complete: the thread then finishes the last bytes and stops.
    tx: Option<mpsc::Sender<u64>>,
    handle: JoinHandle<std::io::Result<String>>,
    path: PathBuf,
}

impl ShardHasher {
    fn start(path: &Path) -> Result<ShardHasher> {
        let file = File::open(path).map_err(Error::io(path))?;
        let (tx, rx) = mpsc::channel::<u64>();
        let handle = std::thread::Builder::new()
            .name("imgpack-md5".into())
            .spawn(move || {
                use std::os::unix::fs::FileExt;
                let mut md5 = Md5::new();
                let mut buf = vec![0u8; 1 << 20];
                let mut done = 0u64;
                // Each message is a length the file is flushed to; the channel closes at the end.
                for flushed in rx {
                    while done < flushed {
                        let n = ((flushed - done) as usize).min(buf.len());
                        file.read_exact_at(&mut buf[..n], done)?;
                        md5.update(&buf[..n]);
                        done += n as u64;
                    }
                }
                Ok(hex(&md5.finalize()))
            })
            .map_err(Error::io(path))?;
        Ok(ShardHasher { tx: Some(tx), handle, path: path.to_path_buf() })
    }

    fn flushed_to(&self, len: u64) {
        if let Some(tx) = &self.tx {
            // A send fails only if the thread has stopped on an error, which `finish` reports.
            let _ = tx.send(len);
        }
    }

    /// Says the shard is complete, so the thread stops when it has hashed everything.
    fn close(&mut self) {
        self.tx = None;
    }

    /// The MD5 of everything announced with [`ShardHasher::flushed_to`].
    fn finish(mut self) -> Result<String> {
        self.close();
        match self.handle.join() {
            Ok(result) => result.map_err(Error::io(&self.path)),
            Err(_) => Err(Error::Panicked { path: self.path.clone(), thread: "shard MD5".into() }),
        }
    }
}

/// Syncs finished shards (each a group of files) on a background thread, so their writeback
/// overlaps with writing the next shard, and counts the groups done.
struct Syncer {
    /// The directory whose shards it syncs, for errors.
    dir: PathBuf,
    tx: Option<mpsc::Sender<Vec<(File, PathBuf)>>>,
    handle: Option<JoinHandle<Result<()>>>,
    sent: usize,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Syncer {
    fn start(dir: PathBuf) -> Syncer {
        let (tx, rx) = mpsc::channel::<Vec<(File, PathBuf)>>();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = done.clone();
        let handle = std::thread::Builder::new()
            .name("imgpack-sync".into())
            .spawn(move || {
                for group in rx {
                    for (file, path) in group {
                        file.sync_all().map_err(Error::io(&path))?;
                    }
                    counter.fetch_add(1, std::sync::atomic::Ordering::Release);
                }
                Ok(())
            })
            .expect("spawn sync thread");
        Syncer { dir, tx: Some(tx), handle: Some(handle), sent: 0, done }
    }

    fn sync(&mut self, group: Vec<(File, PathBuf)>) {
        if let Some(tx) = &self.tx {
            // If the thread has stopped on an error, `finish` reports it.
            let _ = tx.send(group);
            self.sent += 1;
        }
    }

    /// Groups synced so far, counted from the first this syncer was given.
    fn done(&self) -> usize {
        self.done.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until every group sent is synced, and returns how many that is.
    fn wait(&mut self) -> Result<usize> {
        while self.done() < self.sent {
            if self.handle.as_ref().is_none_or(JoinHandle::is_finished) {
                self.finish()?;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(self.done())
    }

    fn finish(&mut self) -> Result<()> {
        drop(self.tx.take());
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(Error::Panicked { path: self.dir.clone(), thread: "shard sync".into() }),
            None => Ok(()),
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_rollover_counts_headers_and_end_blocks() {
        let limits = ShardLimits { max_bytes: 10 * 512, max_samples: None };
        // An empty shard takes any sample, however large.
        assert!(limits.fits(0, 0, 1 << 30));
        // 6 blocks used + 2 for the sample + 2 end blocks = 10: fits exactly.
        assert!(limits.fits(6 * 512, 3, 2 * 512));
        assert!(!limits.fits(6 * 512, 3, 3 * 512));
        let counted = ShardLimits { max_bytes: u64::MAX, max_samples: Some(2) };
        assert!(counted.fits(0, 1, 512));
        assert!(!counted.fits(0, 2, 512));
    }

    #[test]
    fn headers_are_deterministic_ustar() {
        let h = ustar_header("00000042.jpg", 1234).unwrap();
        assert_eq!(&h[..12], b"00000042.jpg");
        assert_eq!(&h[257..263], b"ustar\0");
        assert_eq!(h, ustar_header("00000042.jpg", 1234).unwrap());
        let buf = [&h[..], &[0u8; 1536]].concat();
        let parsed = imgpack_reader::webdataset::parse_member(&buf, 0).unwrap();
        assert_eq!((parsed.name, parsed.data.len()), ("00000042.jpg", 1234));
        assert!(ustar_header(&"x".repeat(101), 1).is_err());
    }

    #[test]
    fn an_index_piece_is_checked_against_its_shard() {
        // Two samples of 1,536 and 2,048 bytes in shard 3.
        let crcs = [0x1111_1111u32, 0x2222_2222];
        let entries = [
            IndexEntry { offset: 0, len: 1536, shard: 3, crc32: crcs[0] },
            IndexEntry { offset: 1536, len: 2048, shard: 3, crc32: crcs[1] },
        ];
        let mut crc = crc32fast::Hasher::new();
        for e in &entries {
            crc.combine(&crc32fast::Hasher::new_with_initial_len(e.crc32, e.len));
        }
        crc.update(&[0u8; END_OF_ARCHIVE as usize]);
        let shard = ShardInfo {
            name: "shard-000003.tar".into(),
            first: 10,
            samples: 2,
            bytes: 1536 + 2048 + END_OF_ARCHIVE,
            crc32: Some(crc.finalize()),
            md5: None,
        };
        let piece: Vec<u8> = entries.iter().flat_map(|e| e.encode()).collect();
        assert_eq!(check_index_piece(&piece, 3, &shard), Ok(()));
        assert!(check_index_piece(&piece[..INDEX_ENTRY_LEN], 3, &shard).unwrap_err().contains("2 samples"));
        assert!(check_index_piece(&piece, 4, &shard).unwrap_err().contains("shard 3"));
        let mut flipped = piece.clone();
        *flipped.last_mut().unwrap() ^= 1; // a CRC-32 bit
        assert!(check_index_piece(&flipped, 3, &shard).unwrap_err().contains("CRC-32"));
        let other = ShardInfo { bytes: shard.bytes + 512, ..shard.clone() };
        assert!(check_index_piece(&piece, 3, &other).is_err());
    }
}
