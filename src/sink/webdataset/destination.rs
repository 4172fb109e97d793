//! Where a WebDataset's files go: a staged local directory, or a prefix in an object store.
//!
//! The sink writes the same bytes either way — shards, DALI `.idx`, `imgpack.index`,
//! `shardindex.json`, `imgpack.json` — and this is the one place that knows the difference:
//!
//! * **A directory** ([`Staged`]): every file is written in the temporary directory, synced,
//!   and the directory is renamed into place at the end, so the dataset appears whole.
//! * **A store prefix** ([`Store`]): there is no rename in an object store, so visibility is
//!   ordering instead. Each shard is streamed up as it is written (a multipart upload with a
//!   few parts in flight, never a whole shard in memory: [`crate::store::upload`]), its `.idx`
//!   follows it, `imgpack.index` (whose header is rewritten at the end) is spooled to a local
//!   temporary file and uploaded at the end, and `imgpack.json`, which readers and `pack
//!   verify` require, goes last. A prefix without it is not a dataset.
//!
//!   To be resumable there, a run keeps under the prefix's `imgpack-resume/` (besides the
//!   journal and listing: [`crate::pack::resume`]) the ids of the uploads it has open, so a
//!   run that follows a killed one aborts them, and each closed shard's entries of
//!   `imgpack.index` (`imgpack-resume/SHARD.index`, a few bytes per sample), since the spool is
//!   local and may be lost with the machine. A resumed run checks each kept shard by its size
//!   and ETag, and each piece against its shard's CRC-32, and rebuilds the spool from them.
//!   Publishing removes `imgpack-resume/` after `imgpack.json` is stored.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use imgpack_reader::webdataset::SAMPLE_INDEX_FILE;
use md5::{Digest, Md5};

use super::direct::DirectFile;
use crate::encoding::hex;
use crate::pack::resume::{self, STORE_SCRATCH, UPLOADS_RECORD};
use crate::pack::staged::Staged;
use crate::store::lock::{StoreLock, LOCK_OBJECT};
use crate::store::{Store, Upload};
use crate::{Error, Result};

/// Where the output goes.
pub(super) enum Destination {
    /// A local directory, staged and renamed into place.
    Dir(Staged),
    /// A store prefix, written in visibility order; `imgpack.index` is spooled here first.
    Store {
        /// The prefix.
        store: Store,
        /// The local spool of `imgpack.index`, removed when dropped.
        index: tempfile::NamedTempFile,
        /// What this run stored, removed again if it stops without publishing.
        stored: Stored,
        /// The lease on the prefix, released last, after `stored` has cleaned up.
        lock: Box<StoreLock>,
    },
}

/// The objects a run stored under a prefix. A run that stops without publishing (an error,
/// Ctrl-C) before its first checkpoint deletes them when this is dropped, with its journal
/// files, as a staged directory is removed, so the same command can simply run again; after a
/// checkpoint they are kept for `--resume`, as a killed run leaves them, without `imgpack.json`.
pub(super) struct Stored {
    store: Store,
    names: Vec<String>,
    /// A checkpoint was reported: what is stored is worth resuming.
    pub(super) keep: bool,
    published: bool,
}

impl Drop for Stored {
    fn drop(&mut self) {
        if !self.published && !self.keep {
            let mut names = std::mem::take(&mut self.names);
            names.extend(resume::FILES.iter().map(|name| resume::store_scratch(name)));
            names.push(UPLOADS_RECORD.to_string());
            // Best effort: a failing run reports its own error, not this one.
            let _ = self.store.delete_within(&names, std::time::Duration::from_secs(20));
        }
    }
}

/// The object holding shard `shard`'s entries of `imgpack.index` while a run to a store is
/// unfinished.
pub(super) fn index_piece(shard: &str) -> String {
    format!("{STORE_SCRATCH}/{shard}.index")
}

impl Destination {
    /// Writes under `store`'s prefix, which [`resume::stage_store`] has prepared. `kept`: the
    /// objects an interrupted run stored that a resumed one keeps; they stay whatever happens.
    pub(super) fn store(store: Store, lock: StoreLock, kept: Option<Vec<String>>) -> Result<Destination> {
        let index = tempfile::Builder::new()
            .prefix(".imgpack-index-")
            .tempfile()
            .map_err(Error::io(std::env::temp_dir()))?;
        let keep = kept.is_some();
        let stored = Stored { store: store.clone(), names: kept.unwrap_or_default(), keep, published: false };
        Ok(Destination::Store { store, index, stored, lock: Box::new(lock) })
    }

    /// The store, when the output is in one.
    pub(super) fn in_store(&self) -> Option<&Store> {
        match self {
            Destination::Dir(_) => None,
            Destination::Store { store, .. } => Some(store),
        }
    }

    /// Notes that object `name` was stored, to be removed if the run stops before a checkpoint.
    pub(super) fn stored(&mut self, name: String) {
        if let Destination::Store { stored, .. } = self {
            stored.names.push(name);
        }
    }

    /// Notes that a checkpoint was reported: a run to a store that stops now keeps its work.
    pub(super) fn checkpointed(&mut self) {
        if let Destination::Store { stored, .. } = self {
            stored.keep = true;
        }
    }

    /// Renews the lease on a store prefix now, failing if another run owns it: called just
    /// before `imgpack.json` makes the prefix a dataset.
    pub(super) fn confirm_lease(&self) -> Result<()> {
        self.in_store().map_or(Ok(()), Store::confirm_lease)
    }

    /// The output as the user named it.
    pub(super) fn target(&self) -> PathBuf {
        match self {
            Destination::Dir(staged) => staged.target().to_path_buf(),
            Destination::Store { store, .. } => PathBuf::from(store.url().to_string()),
        }
    }

    /// Where a file of the output is named in messages: its path in the staged directory, or
    /// its object's URL.
    pub(super) fn name(&self, name: &str) -> PathBuf {
        match self {
            Destination::Dir(staged) => staged.path().join(name),
            Destination::Store { store, .. } => PathBuf::from(store.url().object(name)),
        }
    }

    /// The local file `imgpack.index` is written to.
    pub(super) fn index_path(&self) -> PathBuf {
        match self {
            Destination::Dir(staged) => staged.path().join(SAMPLE_INDEX_FILE),
            Destination::Store { index, .. } => index.path().to_path_buf(),
        }
    }

    /// Creates `imgpack.index`, empty.
    pub(super) fn create_index(&self) -> Result<File> {
        let path = self.index_path();
        match self {
            Destination::Dir(_) => File::create(&path).map_err(Error::io(&path)),
            Destination::Store { index, .. } => index.as_file().try_clone().map_err(Error::io(&path)),
        }
    }

    /// Starts shard `name`, to hold at most `max_bytes`.
    pub(super) fn create_shard(&mut self, name: &str, max_bytes: u64, md5: bool) -> Result<ShardOut> {
        match self {
            Destination::Dir(staged) => {
                let path = staged.path().join(name);
                // With `--md5` the shard's hasher reads the file back while it is still in the
                // page cache, so it goes through it; otherwise around it.
                if !md5 {
                    if let Some(direct) = DirectFile::create(&path)? {
                        return Ok(ShardOut::Direct(direct));
                    }
                }
                let file = File::create(&path).map_err(Error::io(&path))?;
                Ok(ShardOut::File(BufWriter::with_capacity(64 << 10, file)))
            }
            Destination::Store { store, stored, .. } => {
                stored.names.push(name.to_string());
                let upload = store.recorded_upload(name, max_bytes, UPLOADS_RECORD)?;
                Ok(ShardOut::Upload(Box::new(upload), md5.then(Md5::new)))
            }
        }
    }

    /// Stores a small file whole (a DALI index, `shardindex.json`, `imgpack.json`). In a
    /// directory the file is returned, to be synced; in a store it exists when this returns.
    pub(super) fn put(&mut self, name: &str, bytes: &[u8]) -> Result<Option<File>> {
        match self {
            Destination::Dir(staged) => {
                let path = staged.path().join(name);
                let mut file = File::create(&path).map_err(Error::io(&path))?;
                file.write_all(bytes).map_err(Error::io(&path))?;
                Ok(Some(file))
            }
            Destination::Store { store, stored, .. } => {
                stored.names.push(name.to_string());
                store.put(name, bytes.to_vec()).map(|()| None)
            }
        }
    }

    /// Makes `imgpack.index`, complete in its local file, part of the output: nothing to do in
    /// a directory; uploaded, streamed from the spool, to a store.
    pub(super) fn store_index(&mut self) -> Result<()> {
        let Destination::Store { store, index, stored, .. } = self else { return Ok(()) };
        stored.names.push(SAMPLE_INDEX_FILE.to_string());
        store.upload_file(SAMPLE_INDEX_FILE, index.path(), Some(UPLOADS_RECORD))
    }

    /// Makes the output visible: the staged directory is renamed into place; in a store,
    /// `imgpack.json` was the last object written, which is what makes a prefix a dataset, and
    /// what was kept only for resuming (`imgpack-resume/`) is deleted now.
    pub(super) fn publish(self) -> Result<()> {
        match self {
            Destination::Dir(staged) => staged.publish(),
            Destination::Store { store, mut stored, lock, .. } => {
                stored.published = true;
                let scratch = store.read().list_objects(Some(STORE_SCRATCH))?;
                let scratch: Vec<String> =
                    scratch.into_iter().map(|o| o.name).filter(|n| n != LOCK_OBJECT).collect();
                store.delete(&scratch)?;
                // Deletes the lock object, last.
                drop(lock);
                Ok(())
            }
        }
    }
}

/// Where one shard's bytes go while it is written.
pub(super) enum ShardOut {
    /// A file in the staged directory, written through the page cache.
    File(BufWriter<File>),
    /// A file in the staged directory, written around the page cache ([`DirectFile`]).
    Direct(DirectFile),
    /// A multipart upload, with the shard's MD5 (`--md5`) summed as its bytes go by, since
    /// there is no file to read it back from.
    Upload(Box<Upload>, Option<Md5>),
}

/// A closed shard.
pub(super) enum Closed {
    /// Its file, to be synced (and, with `--md5`, read back by its hasher).
    File(File),
    /// Uploaded: the object exists; its MD5 if asked for, and its ETag.
    Stored { md5: Option<String>, e_tag: String },
}

impl ShardOut {
    /// Appends `bytes`; `path` names the shard in errors.
    pub(super) fn write(&mut self, bytes: &[u8], path: &Path) -> Result<()> {
        match self {
            ShardOut::File(file) => file.write_all(bytes).map_err(Error::io(path)),
            ShardOut::Direct(file) => file.write(bytes),
            ShardOut::Upload(upload, md5) => {
                if let Some(md5) = md5 {
                    md5.update(bytes);
                }
                upload.write(bytes)
            }
        }
    }

    /// The shard's file, when it is written through the page cache.
    pub(super) fn file(&mut self) -> Option<&mut BufWriter<File>> {
        match self {
            ShardOut::File(file) => Some(file),
            ShardOut::Direct(_) | ShardOut::Upload(..) => None,
        }
    }

    /// Ends the shard: flushes its file, or completes its upload.
    pub(super) fn close(self, path: &Path) -> Result<Closed> {
        match self {
            ShardOut::File(file) => file
                .into_inner()
                .map(Closed::File)
                .map_err(|e| Error::Io { path: path.to_path_buf(), source: e.into_error() }),
            ShardOut::Direct(file) => file.finish().map(Closed::File),
            ShardOut::Upload(upload, md5) => {
                let e_tag = upload.finish()?.unwrap_or_default();
                Ok(Closed::Stored { md5: md5.map(|m| hex(&m.finalize())), e_tag })
            }
        }
    }
}
