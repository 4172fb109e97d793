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
//! process is killed is left incomplete in the store, invisible to readers, until the bucket's
//! lifecycle rule (`AbortIncompleteMultipartUpload`) or a later abort removes it.

use object_store::{ObjectStore, PutMultipartOptions, WriteMultipart};

use super::Store;
use crate::Result;

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
pub struct Upload {
    store: Store,
    name: String,
    part_bytes: usize,
    /// `None` once finished or aborted.
    writer: Option<WriteMultipart>,
    /// Bytes written into the part being filled.
    filling: usize,
    bytes: u64,
}

impl Upload {
    /// Starts the upload of object `name`, to hold at most `max_bytes`.
    pub(crate) fn start(store: Store, name: &str, max_bytes: u64) -> Result<Upload> {
        let part_bytes = part_size(max_bytes);
        let key = store.key(name);
        let upload = store
            .runtime()
            .block_on(store.client().put_multipart_opts(&key, PutMultipartOptions::default()))
            .map_err(store.error(name, "start the upload"))?;
        let writer = WriteMultipart::new_with_chunk_size(upload, part_bytes);
        Ok(Upload { store, name: name.to_string(), part_bytes, writer: Some(writer), filling: 0, bytes: 0 })
    }

    /// Appends `bytes`; waits while [`IN_FLIGHT`] parts are still being sent.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let take = bytes.len().min(self.part_bytes - self.filling);
            let writer = self.writer.as_mut().expect("written only until finished");
            if self.filling + take == self.part_bytes {
                // This write completes a part and sends it: make room for it first.
                self.store
                    .runtime()
                    .block_on(writer.wait_for_capacity(IN_FLIGHT - 1))
                    .map_err(self.store.upload_error(&self.name, "upload"))?;
            }
            // Sending a full part spawns a task on the store's runtime.
            let _entered = self.store.runtime().enter();
            writer.write(&bytes[..take]);
            self.filling = (self.filling + take) % self.part_bytes;
            self.bytes += take as u64;
            bytes = &bytes[take..];
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sends the last part, waits for every part and completes the upload: the object exists
    /// when this returns.
    pub fn finish(mut self) -> Result<()> {
        let writer = self.writer.take().expect("finished once");
        self.store
            .runtime()
            .block_on(writer.finish())
            .map(drop)
            .map_err(self.store.upload_error(&self.name, "upload"))
    }
}

impl Drop for Upload {
    /// Aborts an unfinished upload, so the store does not keep its parts. Best effort: a store
    /// that is gone cannot be told.
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            // The timer is made inside the runtime: it needs the runtime's clock.
            let _ = self
                .store
                .runtime()
                .block_on(async { tokio::time::timeout(ABORT_WAIT, writer.abort()).await });
        }
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
