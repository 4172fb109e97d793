//! `pack merge s3://bucket/out/`: WebDataset parts uploaded under `out/part-KKKK-of-NNNN/`
//! merged where they are, for a cluster job whose machines share no volume.
//!
//! One listing of the prefix gives every part's objects and sizes; the parts are checked as on
//! disk ([`super::check_parts`]: same messages, naming the `s3://` locations), and the merge is
//! the local one ([`super::webdataset::merge`]) through [`StoredFiles`]: the dataset-level
//! objects `imgpack.index`, `shardindex.json` and then, last, `imgpack.json` are uploaded, so
//! the prefix reads as a dataset only once it is complete. The objects left are exactly the
//! files a local merge of the same parts leaves.
//!
//! When a part skipped files, the keys after them move and the shards holding them must be
//! rewritten. An object cannot be changed in place, so each such shard is streamed down sample
//! by sample, its headers rewritten, and streamed up again under the same key as a multipart
//! upload ([`crate::store::Upload`]): memory holds one sample plus the upload's parts in
//! flight, whatever the shard's size, and the shard is replaced only when its upload completes
//! (a reader sees the old or the new shard, never half of one). A merge stopped half-way is run
//! again: a shard already rewritten is recognised and rewritten to the same bytes.
//!
//! LMDB parts cannot be in a store (`pack` writes LMDB only to disk, and an LMDB merge writes
//! one database in place): they are refused, saying to merge them on disk. A merge holds the
//! prefix's lease while it runs ([`crate::store::lock`]), so a second merge started meanwhile
//! fails naming the first.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use imgpack_reader::part::PartInfo;
use imgpack_reader::store::Chunks;
use imgpack_reader::webdataset::{IndexEntry, META_FILE, SAMPLE_INDEX_FILE};
use imgpack_reader::{Meta, ShardInfo};

use super::webdataset::{self, damaged, Files, Shard};
use super::{
    already_summary, check_parts, merged_meta, sort_part_dirs, summary, FoundPart, MergeOptions, Merged,
};
use crate::progress::Progress;
use crate::store::lock::{StoreLock, Timing, LOCK_OBJECT};
use crate::store::{Store, StoreUrl, Upload};
use crate::{Error, Result};

/// Merges the WebDataset parts under `url` into one dataset there.
pub(super) fn merge(url: &StoreUrl, options: &MergeOptions, bar: &dyn Progress) -> Result<Merged> {
    let store = Store::open(url, options.endpoint.as_deref())?;
    // The first request: wrong settings or a missing bucket are reported here. One merge of a
    // prefix at a time, as one run of a part (held until the merge returns).
    // Stopped while waiting for another's stale lock: the merge's own error, which says to run
    // the merge again, not the run's ("before the first checkpoint": a merge has none).
    let lock = StoreLock::acquire(&store, Timing::from_env(), &|text: &str| bar.notice(text)).map_err(
        |e| match e {
            Error::Interrupted { .. } => Error::MergeInterrupted { path: PathBuf::from(url.to_string()) },
            e => e,
        },
    )?;
    let store = store.under(&lock);
    let sizes: BTreeMap<String, u64> =
        store.list_sizes()?.into_iter().filter(|(name, _)| name != LOCK_OBJECT).collect();
    let out = PathBuf::from(url.to_string());
    let dirs =
        sort_part_dirs(sizes.keys().filter_map(|name| name.split_once('/')).map(|(dir, _)| dir.to_string()));
    if let Some((name, _)) = dirs.0.iter().find(|(name, _)| sizes.contains_key(&format!("{name}/data.mdb"))) {
        return Err(Error::Merge {
            path: out.clone(),
            reason: format!(
                "{} holds an LMDB part, and LMDB parts are merged on disk (the merge writes one database in place, which a store cannot hold): copy the prefix to a local directory (`aws s3 sync {url} DIR`), run `pack merge DIR`, and upload DIR/data.mdb if the store is where the dataset should live",
                out.join(name).display()
            ),
        });
    }
    let read_meta = |name: &str| -> Result<Option<Meta>> {
        let meta_name = format!("{name}/{META_FILE}");
        if !sizes.contains_key(&meta_name) {
            return Ok(None);
        }
        let raw = store.get(&meta_name)?;
        let format = imgpack_reader::webdataset::FORMAT_NAME;
        crate::cluster::part::parse_meta(&out.join(name), &raw, format).map(Some)
    };
    if sizes.contains_key(META_FILE) {
        // Merged before: it must open as a dataset, and its parts say what was skipped.
        let dataset = imgpack_reader::open_with_endpoint(&out, options.endpoint.as_deref())?;
        let meta = dataset.meta().clone();
        let mut infos: Vec<PartInfo> = Vec::new();
        for (name, _) in &dirs.0 {
            infos.extend(read_meta(name)?.and_then(|meta| meta.part));
        }
        let mut merged = already_summary(out, &meta, &infos, sizes.values().sum());
        merged.warnings.extend(lock.warning.clone());
        return Ok(merged);
    }
    let parts = check_parts(&out, dirs, read_meta)?;
    let mut meta = merged_meta(&parts);
    let temp = tempfile::Builder::new()
        .prefix("imgpack-merge-")
        .tempdir()
        .map_err(Error::io(&std::env::temp_dir()))?;
    let files = StoredFiles { store, sizes, temp };
    let bytes_out = webdataset::merge(&files, &parts, &mut meta, options, bar)?;
    let mut merged = summary(out, &parts, &meta, bytes_out);
    merged.warnings.extend(lock.warning.clone());
    Ok(merged)
}

/// A merge's files as objects under a store prefix.
struct StoredFiles {
    store: Store,
    /// Every object under the prefix when the merge started, with its size.
    sizes: BTreeMap<String, u64>,
    /// Where the merged index is written before it is uploaded.
    temp: tempfile::TempDir,
}

impl StoredFiles {
    fn url(&self, name: &str) -> PathBuf {
        PathBuf::from(self.store.url().object(name))
    }
}

impl Files for StoredFiles {
    /// A part's index is read whole: its entries are held in memory by the merge anyway.
    fn index(&self, part: &FoundPart) -> Result<Box<dyn Read + '_>> {
        let bytes = self.store.get(&format!("{}/{SAMPLE_INDEX_FILE}", part.name))?;
        Ok(Box::new(std::io::Cursor::new(bytes)))
    }

    fn shard(&self, part: &FoundPart, shard: &ShardInfo) -> Result<Box<dyn Shard + '_>> {
        let name = format!("{}/{}", part.name, shard.name);
        let path = self.url(&name);
        let Some(&len) = self.sizes.get(&name) else {
            return Err(damaged(&path, "missing, though the part's metadata lists it".into()));
        };
        if len != shard.bytes {
            return Err(damaged(&path, format!("{len} bytes, the part's metadata says {}", shard.bytes)));
        }
        let stream =
            Streamed { chunks: self.store.stream(&name, len)?, chunk: Vec::new(), at: 0, path: path.clone() };
        Ok(Box::new(StoredShard { path, stream, upload: self.store.upload(&name, len)? }))
    }

    fn index_temp(&self) -> PathBuf {
        self.temp.path().join(SAMPLE_INDEX_FILE)
    }

    fn publish_file(&self, temp: &Path, name: &str) -> Result<()> {
        self.store.upload_file(name, temp, None)
    }

    fn publish(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.store.put(name, bytes.to_vec())
    }

    /// Every object under the prefix, as listed again now the merged files are there (but the
    /// merge's lock, deleted when it returns).
    fn dataset_bytes(&self, _meta: &Meta) -> Result<u64> {
        Ok(self
            .store
            .list_sizes()?
            .iter()
            .filter(|(name, _)| name != LOCK_OBJECT)
            .map(|(_, size)| size)
            .sum())
    }

    fn output(&self) -> PathBuf {
        PathBuf::from(self.store.url().to_string())
    }
}

/// A stored shard streamed down and, rewritten, up again under its own key.
struct StoredShard {
    path: PathBuf,
    stream: Streamed,
    upload: Upload,
}

impl Shard for StoredShard {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read(&mut self, _entry: &IndexEntry, buf: &mut [u8]) -> Result<()> {
        self.stream.fill(buf)
    }

    /// The whole sample: an upload is written from the start to the end.
    fn write(&mut self, _entry: &IndexEntry, buf: &[u8], _changed: &[usize]) -> Result<()> {
        self.upload.write(buf)
    }

    fn tail(&mut self, _pos: u64) -> Result<Vec<u8>> {
        let tail = self.stream.rest()?;
        self.upload.write(&tail)?;
        Ok(tail)
    }

    /// Completes the upload: the shard is replaced now, whole.
    fn finish(self: Box<Self>) -> Result<()> {
        self.upload.finish().map(drop)
    }
}

/// A streamed GET read in pieces of the sizes asked for, whatever sizes the chunks arrive in.
struct Streamed {
    chunks: Chunks,
    chunk: Vec<u8>,
    /// How much of `chunk` was handed out.
    at: usize,
    path: PathBuf,
}

impl Streamed {
    /// The next `buf.len()` bytes.
    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            if self.at == self.chunk.len() {
                match self.chunks.next() {
                    Some(chunk) => (self.chunk, self.at) = (chunk?, 0),
                    None => return Err(damaged(&self.path, "its samples run past its end".into())),
                }
            }
            let n = (buf.len() - done).min(self.chunk.len() - self.at);
            buf[done..done + n].copy_from_slice(&self.chunk[self.at..self.at + n]);
            (done, self.at) = (done + n, self.at + n);
        }
        Ok(())
    }

    /// Every byte not handed out yet.
    fn rest(&mut self) -> Result<Vec<u8>> {
        let mut rest = self.chunk.split_off(self.at);
        for chunk in self.chunks.by_ref() {
            rest.extend_from_slice(&chunk?);
        }
        self.at = self.chunk.len();
        Ok(rest)
    }
}
