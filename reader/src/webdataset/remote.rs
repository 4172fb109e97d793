//! A WebDataset in object storage, read where it lives (feature `s3`).
//!
//! The layout is the one a directory holds ([`super`]), under a prefix instead: `pack -o
//! s3://bucket/prefix/` stores the same objects. Opening lists the prefix once (one request per
//! 1,000 objects: every shard's size, checked against the metadata as a local open checks file
//! lengths) and fetches `imgpack.json` and `imgpack.index` whole, once; from then on
//! [`RemoteWebDataset::get`] is one ranged GET of exactly the sample's bytes, located by the
//! index, and [`RemoteWebDataset::iter`] streams shards whole, one GET per shard, so iterating
//! costs one request per shard rather than per sample. Samples own their bytes: nothing is
//! mapped.
//!
//! What a local open refuses, this refuses too, with the same messages: a prefix without
//! `imgpack.json` (a run that has not finished, since `pack` stores it last), an index that
//! does not match, a missing or resized shard, and every damaged sample [`super::WebDataset::get`]
//! would refuse.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::key::format_key;
use crate::store::{settings, Store, StoreUrl};
use crate::{Error, Field, Meta, Result, Sample};

use super::{
    check_index, check_shard_len, check_shard_name, index_entry, parse_meta, sample_fields, IndexEntry,
    META_FILE, SAMPLE_INDEX_FILE,
};

/// A WebDataset output of `pack` under an `s3://bucket/prefix/`, open for reading. `Send +
/// Sync`: threads may call [`RemoteWebDataset::get`] at once, each call one request, which is
/// how an object store is read fast (many requests in flight).
pub struct RemoteWebDataset {
    store: Store,
    /// `s3://bucket/prefix/`, as errors name the dataset.
    path: Arc<Path>,
    meta: Meta,
    index: Vec<u8>,
    verify: bool,
    /// The size of everything under the prefix, as listed at open.
    stored_bytes: u64,
}

impl std::fmt::Debug for RemoteWebDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWebDataset")
            .field("url", &self.path)
            .field("endpoint", &self.store.endpoint())
            .field("samples", &self.meta.samples)
            .finish()
    }
}

impl RemoteWebDataset {
    /// Opens the WebDataset at `url` (`s3://bucket/prefix/`), at `endpoint` if given, else
    /// the endpoint `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` names, else AWS itself;
    /// credentials come from the AWS environment variables ([`settings`]).
    pub fn open(url: &str, endpoint: Option<&str>) -> Result<RemoteWebDataset> {
        let url = StoreUrl::parse(url)?;
        let endpoint = settings::endpoint(endpoint, |name| std::env::var(name).ok());
        RemoteWebDataset::open_store(Store::open(&url, endpoint.as_deref())?)
    }

    /// Opens the WebDataset under `store`'s prefix.
    pub fn open_store(store: Store) -> Result<RemoteWebDataset> {
        let listed = store.list_sizes()?;
        RemoteWebDataset::open_listed(store, listed)
    }

    /// Opens the WebDataset under `store`'s prefix, whose objects (name and size) `listed`
    /// gives: for a caller that has listed the prefix already ([`Store::list_sizes`]).
    pub fn open_listed(store: Store, listed: Vec<(String, u64)>) -> Result<RemoteWebDataset> {
        let path: Arc<Path> = Arc::from(Path::new(&store.url().to_string()));
        let not_dataset = |reason: String| Error::NotADataset { path: path.to_path_buf(), reason };
        let listed: HashMap<String, u64> = listed.into_iter().collect();
        if !listed.contains_key(META_FILE) {
            return Err(not_a_dataset(store.url(), listed.len()));
        }
        let raw = store.get(META_FILE)?;
        let meta = parse_meta(&path, &raw)?;
        if !listed.contains_key(SAMPLE_INDEX_FILE) {
            return Err(not_dataset(format!(
                "no {SAMPLE_INDEX_FILE}; copy the whole dataset prefix, or re-run `pack`"
            )));
        }
        let index = store.get(SAMPLE_INDEX_FILE)?;
        check_index(&path, &meta, &raw, &index)?;
        for shard in &meta.shards {
            check_shard_name(&path, &shard.name)?;
            let Some(&len) = listed.get(&shard.name) else {
                return Err(not_dataset(format!(
                    "shard {} listed in {META_FILE} is missing; copy the whole dataset prefix, or re-run `pack`",
                    shard.name
                )));
            };
            check_shard_len(&path, shard, len)?;
        }
        let stored_bytes = listed.values().sum();
        Ok(RemoteWebDataset { store, path, meta, index, verify: false, stored_bytes })
    }

    /// Makes every read check the sample's CRC-32 against the index, as
    /// [`super::WebDataset::verify_checksums`] does.
    pub fn verify_checksums(mut self, on: bool) -> Result<RemoteWebDataset> {
        if on && self.meta.checksum.is_none() {
            return Err(Error::NoChecksums { path: self.path.to_path_buf() });
        }
        self.verify = on;
        Ok(self)
    }

    /// `s3://bucket/prefix/`, as a path: what errors and samples name the dataset by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The store the dataset is in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The bytes stored under the prefix when it was opened: shards, indexes and metadata.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes
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

    /// Where sample `index` lives, as the index says.
    pub fn entry(&self, index: u64) -> Result<IndexEntry> {
        index_entry(&self.path, &self.index, self.meta.samples, index)
    }

    /// Sample `index`, in one ranged GET of its bytes. The index entry is checked as
    /// [`super::WebDataset::get`] checks it, before any request: its shard must exist and the
    /// range lie inside the shard's recorded size.
    pub fn get(&self, index: u64) -> Result<Sample<'static>> {
        let (shard, range) = self.locate(index)?;
        let bytes = self.store.get_range(&shard.name, range)?;
        self.sample(index, &bytes)
    }

    /// The stored bytes of sample `index` (its tar members, headers included), in one ranged
    /// GET, unparsed: what [`Self::get`] reads, for measuring the store.
    pub fn read_range(&self, index: u64) -> Result<Vec<u8>> {
        let (shard, range) = self.locate(index)?;
        self.store.get_range(&shard.name, range)
    }

    /// Every sample in order, streamed shard by shard: one GET per shard, and only the sample
    /// being parsed is held, whatever the shard's size.
    pub fn iter(&self) -> RemoteSamples<'_> {
        self.iter_range(0..self.len())
    }

    /// The samples in `range` (clamped to the dataset) in order, streamed as [`Self::iter`]
    /// streams: each shard's GET starts at the range's first sample in it.
    pub fn iter_range(&self, range: std::ops::Range<u64>) -> RemoteSamples<'_> {
        let end = range.end.min(self.len());
        RemoteSamples { dataset: self, next: range.start.min(end), end, open: None, failed: false }
    }

    /// The shard and byte range of sample `index`, checked against the shard's size.
    fn locate(&self, index: u64) -> Result<(&crate::ShardInfo, std::ops::Range<u64>)> {
        let entry = self.entry(index)?;
        let damaged = |reason: String| Error::BadSample {
            path: self.path.to_path_buf(),
            key: format_key(index, self.meta.key_width),
            reason,
        };
        let shards = &self.meta.shards;
        let shard = shards
            .get(entry.shard as usize)
            .ok_or_else(|| damaged(format!("index names shard {} of {}", entry.shard, shards.len())))?;
        let range = entry
            .offset
            .checked_add(entry.len)
            .filter(|&end| end <= shard.bytes)
            .map(|end| entry.offset..end)
            .ok_or_else(|| {
                damaged(format!("index range {}+{} lies outside the shard", entry.offset, entry.len))
            })?;
        Ok((shard, range))
    }

    /// Sample `index` from `bytes`, its stored byte range: checked, parsed and copied out.
    fn sample(&self, index: u64, bytes: &[u8]) -> Result<Sample<'static>> {
        let key = format_key(index, self.meta.key_width);
        if self.verify {
            let expected = self.entry(index)?.crc32;
            let actual = crate::checksum::crc32(bytes);
            if actual != expected {
                return Err(Error::Checksum { path: self.path.to_path_buf(), key, expected, actual });
            }
        }
        let fields = sample_fields(bytes, &key)
            .map_err(|reason| Error::BadSample { path: self.path.to_path_buf(), key: key.clone(), reason })?
            .into_iter()
            .map(|f| Field { ext: f.ext, data: std::borrow::Cow::Owned(f.data.into_owned()) })
            .collect();
        Ok(Sample { index, key, fields, dataset: self.path.clone() })
    }
}

/// Why the prefix `url`, holding `objects` objects but no `imgpack.json`, is not a dataset.
pub fn not_a_dataset(url: &StoreUrl, objects: usize) -> Error {
    let reason = if objects == 0 {
        "nothing is stored under this prefix; check the bucket and the prefix".into()
    } else {
        format!(
            "{objects} objects but no {META_FILE}; a finished `pack --to webdataset -o s3://...` run stores it last, so the run did not finish (or is still running) or this is not its output"
        )
    };
    Error::NotADataset { path: url.to_string().into(), reason }
}

/// The samples of a [`RemoteWebDataset`] in order, read from one streamed GET per shard.
pub struct RemoteSamples<'a> {
    dataset: &'a RemoteWebDataset,
    next: u64,
    end: u64,
    open: Option<OpenShard>,
    /// Set after an error: a broken stream does not resume in the middle.
    failed: bool,
}

/// The shard being streamed: the bytes received and not yet parsed, from `start` on.
struct OpenShard {
    name: String,
    chunks: crate::store::Chunks,
    buf: Vec<u8>,
    start: u64,
}

impl RemoteSamples<'_> {
    fn read(&mut self, index: u64) -> Result<Sample<'static>> {
        let (shard, range) = self.dataset.locate(index)?;
        let reuse =
            self.open.as_ref().is_some_and(|open| open.name == shard.name && open.start <= range.start);
        if !reuse {
            let chunks = self.dataset.store.stream(&shard.name, range.start..shard.bytes)?;
            self.open =
                Some(OpenShard { name: shard.name.clone(), chunks, buf: Vec::new(), start: range.start });
        }
        let open = self.open.as_mut().expect("opened above");
        // Skip what lies before the sample (nothing, in a dataset `pack` wrote), then gather it.
        while open.start + (open.buf.len() as u64) < range.end {
            let chunk = open.chunks.next().unwrap_or_else(|| {
                Err(Error::BadSample {
                    path: self.dataset.path.to_path_buf(),
                    key: format_key(index, self.dataset.meta.key_width),
                    reason: "the shard ended before the sample".into(),
                })
            })?;
            open.buf.extend_from_slice(&chunk);
        }
        let from = (range.start - open.start) as usize;
        let to = (range.end - open.start) as usize;
        let sample = self.dataset.sample(index, &open.buf[from..to]);
        open.buf.drain(..to);
        open.start = range.end;
        sample
    }
}

impl Iterator for RemoteSamples<'_> {
    type Item = Result<Sample<'static>>;

    fn next(&mut self) -> Option<Result<Sample<'static>>> {
        if self.failed || self.next >= self.end {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let sample = self.read(index);
        self.failed = sample.is_err();
        Some(sample)
    }
}
