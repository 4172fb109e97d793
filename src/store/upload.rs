//! One object streamed up as it is written, in parts, with bounded memory.
//!
//! A shard is up to `--shard-size` (1 GB by default) and is written sample by sample; holding
//! it whole before uploading would cost that much memory per shard. An [`Upload`] is a
//! multipart upload instead: bytes collect into a part of [`PART_BYTES`] (S3's parts are at
//! least 5 MiB, but for the last), a full part is sent on the store's runtime while writing
//! goes on, and at most [`IN_FLIGHT`] parts are on their way at once — a writer that gets
//! ahead waits for one to land. So an upload holds at most `(IN_FLIGHT + 1) * PART_BYTES`
//! (40 MiB), whatever the object's size.
//!
//! The object exists only once [`Upload::finish`] completes the upload. An upload dropped
//! without finishing (an error, Ctrl-C) is aborted, so the store drops its parts; one whose
//! process is killed is left incomplete in the store, invisible to readers (and billed). So a
//! resumable run records the ids of the uploads it has open in the store itself
//! ([`Store::record_uploads`]) before it sends their first part, and the next run on the prefix
//! aborts them ([`Store::abort_recorded`]): `object_store` cannot list a bucket's unfinished
//! uploads. Only a run killed in the instant between starting an upload and recording it leaves
//! one for the bucket's lifecycle rule (`AbortIncompleteMultipartUpload`).

use std::collections::VecDeque;

use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use object_store::{MultipartId, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::Store;
use crate::{Error, Result};

/// The size of a part, unless the object could need more than S3's 10,000 of them.
pub const PART_BYTES: usize = 8 << 20;

/// Parts sent at once per upload.
pub const IN_FLIGHT: usize = 4;

/// How long a drop waits for the store to abort an unfinished upload: a store that is down
/// would otherwise be retried for minutes by a run that is already failing.
const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// S3's most parts in one upload, with a margin.
const MAX_PARTS: u64 = 9_000;

/// The part size for an object of at most `max_bytes`: [`PART_BYTES`], or more when the
/// object could otherwise need more parts than S3 allows.
fn part_size(max_bytes: u64) -> usize {
    usize::try_from((PART_BYTES as u64).max(max_bytes.div_ceil(MAX_PARTS))).unwrap_or(usize::MAX)
}

/// A multipart upload being written.
///
/// It is driven through `object_store`'s low-level [`MultipartStore`] API rather than its
/// `WriteMultipart` helper because that one hides the upload's id, and a run that is killed
/// can only have its upload aborted later by someone who knows the id
/// ([`Store::record_upload`]).
pub struct Upload {
    store: Store,
    name: String,
    key: Key,
    id: MultipartId,
    part_bytes: usize,
    /// The part being filled.
    part: Vec<u8>,
    /// Parts on their way, in order.
    sending: VecDeque<JoinHandle<object_store::Result<PartId>>>,
    /// Parts stored, in order.
    parts: Vec<PartId>,
    bytes: u64,
    /// Completed: nothing to abort.
    done: bool,
}

impl Upload {
    /// Starts the upload of object `name`, to hold at most `max_bytes`.
    pub(crate) fn start(store: Store, name: &str, max_bytes: u64) -> Result<Upload> {
        let part_bytes = part_size(max_bytes);
        let key = store.key(name);
        let id = store
            .runtime()
            .block_on(store.client().create_multipart(&key))
            .map_err(store.error(name, "start the upload"))?;
        Ok(Upload {
            store,
            name: name.to_string(),
            key,
            id,
            part_bytes,
            part: Vec::new(),
            sending: VecDeque::new(),
            parts: Vec::new(),
            bytes: 0,
            done: false,
        })
    }

    /// The store's id of this upload: what aborts it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Appends `bytes`; waits while [`IN_FLIGHT`] parts are still being sent.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            if self.part.capacity() == 0 {
                self.part.reserve_exact(self.part_bytes);
            }
            let take = bytes.len().min(self.part_bytes - self.part.len());
            self.part.extend_from_slice(&bytes[..take]);
            self.bytes += take as u64;
            bytes = &bytes[take..];
            if self.part.len() == self.part_bytes {
                self.send()?;
            }
        }
        Ok(())
    }

    /// Sends the part filled so far on the store's runtime, once fewer than [`IN_FLIGHT`]
    /// parts are on their way.
    fn send(&mut self) -> Result<()> {
        while self.sending.len() >= IN_FLIGHT {
            self.land_one()?;
        }
        let payload = PutPayload::from(std::mem::take(&mut self.part));
        let index = self.parts.len() + self.sending.len();
        let (client, key, id) = (self.store.client().clone(), self.key.clone(), self.id.clone());
        let task = async move { client.put_part(&key, &id, index, payload).await };
        self.sending.push_back(self.store.runtime().spawn(task));
        Ok(())
    }

    /// Waits for the oldest part on its way to be stored.
    fn land_one(&mut self) -> Result<()> {
        let Some(task) = self.sending.pop_front() else { return Ok(()) };
        let landed = self.store.runtime().block_on(task).map_err(|e| {
            Error::Reader(imgpack_reader::Error::Store {
                url: self.store.url().object(&self.name),
                operation: "upload",
                endpoint: self.store.read.endpoint().to_string(),
                reason: format!("the part's task ended without an answer ({e})"),
            })
        })?;
        let part = landed.map_err(self.store.upload_error(&self.name, "upload"))?;
        self.parts.push(part);
        Ok(())
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sends the last part, waits for every part and completes the upload: the object exists
    /// when this returns. Returns its ETag, if the store gave one.
    pub fn finish(mut self) -> Result<Option<String>> {
        // An empty object is one empty part: S3 completes no upload without parts.
        if !self.part.is_empty() || self.parts.len() + self.sending.len() == 0 {
            self.send()?;
        }
        while !self.sending.is_empty() {
            self.land_one()?;
        }
        let parts = std::mem::take(&mut self.parts);
        let completed = self
            .store
            .runtime()
            .block_on(self.store.client().complete_multipart(&self.key, &self.id, parts))
            .map_err(self.store.upload_error(&self.name, "upload"))?;
        self.done = true;
        Ok(completed.e_tag)
    }
}

impl Drop for Upload {
    /// Aborts an unfinished upload, so the store does not keep its parts. Best effort: a store
    /// that is gone cannot be told (a later run aborts it: [`Store::abort_recorded`]).
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.sending.drain(..).for_each(|task| task.abort());
        let (client, key, id) = (self.store.client(), &self.key, &self.id);
        // The timer is made inside the runtime: it needs the runtime's clock.
        let _ = self
            .store
            .runtime()
            .block_on(async { tokio::time::timeout(ABORT_WAIT, client.abort_multipart(key, id)).await });
    }
}

/// An upload in progress as a record names it: enough for a later run to abort it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// The object being uploaded, relative to the prefix.
    pub name: String,
    /// The store's upload id.
    pub id: String,
}

impl Store {
    /// Writes `uploads`, the uploads a run has open, to object `record`, so that if the run is
    /// killed (no drop aborts them then) a later run can abort them ([`Store::abort_recorded`]).
    /// `object_store` cannot list a bucket's unfinished uploads, and S3 keeps them, billed and
    /// invisible, until a lifecycle rule removes them; a record is how a run finds its own.
    pub fn record_uploads(&self, record: &str, uploads: &[Open]) -> Result<()> {
        self.put(record, crate::encoding::json_bytes(&uploads))
    }

    /// Starts the upload of object `name` (at most `max_bytes`) and records it in object
    /// `record` ([`Store::record_uploads`]) before a byte of it is sent, so a run that follows
    /// a killed one can abort it.
    pub fn recorded_upload(&self, name: &str, max_bytes: u64, record: &str) -> Result<Upload> {
        let upload = self.upload(name, max_bytes)?;
        self.record_uploads(record, &[Open { name: name.to_string(), id: upload.id().to_string() }])?;
        Ok(upload)
    }

    /// Stores the local file at `path` as object `name`: in one request when it is small, else
    /// streamed up as an upload recorded in `record`, never whole in memory.
    pub fn upload_file(&self, name: &str, path: &std::path::Path, record: &str) -> Result<()> {
        use std::io::Read;
        let mut file = std::fs::File::open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        if len <= PART_BYTES as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).map_err(Error::io(path))?;
            return self.put(name, bytes);
        }
        let mut upload = self.recorded_upload(name, len, record)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).map_err(Error::io(path))?;
            if n == 0 {
                break;
            }
            upload.write(&buf[..n])?;
        }
        upload.finish().map(drop)
    }

    /// Writes object `name`, `size` bytes, to the local file at `path`, streamed: never whole
    /// in memory.
    pub fn download(&self, name: &str, size: u64, path: &std::path::Path) -> Result<()> {
        use std::io::Write;
        let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(Error::io(path))?);
        for chunk in self.read.stream(name, 0..size)? {
            file.write_all(&chunk?).map_err(Error::io(path))?;
        }
        file.flush().map_err(Error::io(path))
    }

    /// Aborts every upload object `record` names (an upload that has completed or was aborted
    /// already is passed over), and returns how many were still open. A missing record names
    /// none.
    pub fn abort_recorded(&self, record: &str) -> Result<usize> {
        let read = async { self.client().get(&self.key(record)).await?.bytes().await };
        let raw = match self.runtime().block_on(read) {
            Ok(raw) => raw,
            Err(object_store::Error::NotFound { .. }) => return Ok(0),
            Err(e) => return Err(self.error(record, "read")(e)),
        };
        let uploads: Vec<Open> = serde_json::from_slice(&raw).map_err(|e| Error::BadOutput {
            path: self.url().object(record).into(),
            reason: format!("the record of open uploads is unreadable ({e}); delete it and run again"),
        })?;
        let mut aborted = 0;
        for open in uploads {
            let key = self.key(&open.name);
            match self.runtime().block_on(self.client().abort_multipart(&key, &open.id)) {
                Ok(()) => aborted += 1,
                Err(e) => match self.read.error(&open.name, "abort the upload")(e) {
                    imgpack_reader::Error::StoreUploadAborted { .. } => {}
                    other => return Err(other.into()),
                },
            }
        }
        Ok(aborted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_8_mib_unless_the_object_could_need_too_many() {
        assert_eq!(part_size(0), PART_BYTES);
        assert_eq!(part_size(1_000_000_000), PART_BYTES);
        // 9,000 parts of 8 MiB: about 75 GB.
        assert_eq!(part_size(MAX_PARTS * PART_BYTES as u64), PART_BYTES);
        let big = 200_000_000_000u64;
        let part = part_size(big) as u64;
        assert!(part > PART_BYTES as u64 && big.div_ceil(part) <= MAX_PARTS, "{part}");
    }
}
