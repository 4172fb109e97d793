//! Writing to object storage: datasets under an `s3://bucket/prefix/`, through `object_store`.
//!
//! Reading and writing share one client setup, in the reader crate
//! ([`imgpack_reader::store`]): [`url`] parses the locations, [`settings`] finds the endpoint
//! and credentials the way the AWS CLI does, its `problem` turns a failed request into an
//! error naming the bucket, the key and the fix. This module adds what only `pack` does:
//! [`Store::put`] and [`Store::delete`], and [`upload`], which streams one object up in parts
//! with bounded memory.
//!
//! `object_store` is async; nothing else in `pack` is. A [`Store`] blocks on the small tokio
//! runtime the reader's store owns, so callers stay synchronous. Parts of an upload run on that
//! runtime while the caller goes on producing the next bytes.
//!
//! What `object_store` retries by itself (timeouts, 5xx, dropped connections, with
//! exponential backoff: [`settings`]) never reaches the caller; what does is permanent.

pub mod lock;
pub mod upload;

use std::sync::Arc;

use futures_util::TryStreamExt;
use imgpack_reader::store::problem::{self, Problem};
use object_store::aws::AmazonS3;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

pub use imgpack_reader::store::{is_store_url, settings, url, StoreUrl};
pub use upload::Upload;

use crate::{Error, Result};

/// How long [`Store::upload_error`] waits to learn whether the bucket still exists.
const BUCKET_PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A prefix in a bucket, to write to: the reader's [`imgpack_reader::store::Store`] (clients,
/// runtime, listing, reading), with uploads and deletes.
#[derive(Clone, Debug)]
pub struct Store {
    read: imgpack_reader::store::Store,
    /// The lease this store writes under, if any: every write checks it ([`lock`]).
    lease: Option<Arc<lock::Lease>>,
}

impl Store {
    /// Sets up the clients for `url` at `endpoint` (none: AWS itself). Sends no request:
    /// [`Store::list`] is the first, and finds a missing bucket, refused credentials or an
    /// endpoint that does not answer.
    pub fn open(url: &StoreUrl, endpoint: Option<&str>) -> Result<Store> {
        Ok(Store { read: imgpack_reader::store::Store::open(url, endpoint)?, lease: None })
    }

    /// The prefix this store writes under.
    pub fn url(&self) -> &StoreUrl {
        self.read.url()
    }

    /// The reading side: gets, ranged gets, listings.
    pub fn read(&self) -> &imgpack_reader::store::Store {
        &self.read
    }

    pub(crate) fn client(&self) -> &Arc<AmazonS3> {
        self.read.client()
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        self.read.runtime()
    }

    /// The typed error for a failed `operation` on object `name`.
    pub(crate) fn error<'a>(
        &'a self,
        name: &'a str,
        operation: &'static str,
    ) -> impl Fn(object_store::Error) -> Error + 'a {
        let error = self.read.error(name, operation);
        move |e| Error::Reader(error(e))
    }

    /// The typed error for a failed `operation` on the multipart upload of object `name`. A
    /// store answers `NoSuchUpload` both when someone aborted the upload and when its bucket
    /// was deleted; one listing tells which, so the message gives the right fix.
    pub(crate) fn upload_error<'a>(
        &'a self,
        name: &'a str,
        operation: &'static str,
    ) -> impl Fn(object_store::Error) -> Error + 'a {
        move |e| {
            let error = self.read.error(name, operation)(e);
            if !matches!(error, imgpack_reader::Error::StoreUploadAborted { .. }) {
                return Error::Reader(error);
            }
            let check = self.read.check_client();
            let probe = async { tokio::time::timeout(BUCKET_PROBE_WAIT, check.list(None).try_next()).await };
            Error::Reader(match self.runtime().block_on(probe) {
                Ok(Err(listing)) if problem::classify(&listing) == Problem::NoSuchBucket => {
                    imgpack_reader::Error::NoSuchBucket {
                        url: self.url().object(name),
                        bucket: self.url().bucket.clone(),
                        endpoint: self.read.endpoint().to_string(),
                    }
                }
                _ => error,
            })
        }
    }

    pub(crate) fn key(&self, name: &str) -> Key {
        self.read.key(name)
    }

    /// The names (relative to the prefix, sorted) of every object under the prefix. The first
    /// request of a run: it retries only briefly, so wrong settings are reported at once.
    pub fn list(&self) -> Result<Vec<String>> {
        Ok(self.read.list()?)
    }

    /// The size of object `name`, or `None` if there is no such object: one HEAD. Often the
    /// first request of a run (is this location an object or a prefix?), so it retries only
    /// briefly and wrong settings are reported at once.
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        match self.runtime().block_on(self.read.check_client().head(&self.key(name))) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(name, "read")(e)),
        }
    }

    /// Object `name`, whole, in one request.
    pub fn get(&self, name: &str) -> Result<Vec<u8>> {
        Ok(self.read.get(name)?)
    }

    /// The first `bytes` of object `name` as they arrive, in one streamed GET: for reading a
    /// whole object without holding it in memory.
    pub fn stream(&self, name: &str, bytes: u64) -> Result<imgpack_reader::store::Chunks> {
        Ok(self.read.stream(name, 0..bytes)?)
    }

    /// Copies object `name` of `bytes` bytes into the new local file `path`, streamed: one
    /// chunk in memory at a time.
    pub fn download(&self, name: &str, bytes: u64, path: &std::path::Path) -> Result<()> {
        use std::io::Write;
        let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(Error::io(path))?);
        if bytes > 0 {
            for chunk in self.stream(name, bytes)? {
                file.write_all(&chunk?).map_err(Error::io(path))?;
            }
        }
        file.flush().map_err(Error::io(path))
    }

    /// The names (relative to the prefix, sorted) and sizes of every object under the prefix,
    /// retried only briefly as [`Store::list`] is.
    pub fn list_sizes(&self) -> Result<Vec<(String, u64)>> {
        Ok(self.read.list_sizes()?)
    }

    /// Stores `bytes` as object `name`, in one request.
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.guard()?;
        self.runtime()
            .block_on(self.client().put(&self.key(name), PutPayload::from(bytes)))
            .map(drop)
            .map_err(self.error(name, "upload"))
    }

    /// Deletes the objects `names`: the first alone and before the others (callers put the one
    /// that makes a dataset visible, `imgpack.json`, first), the rest in batches (S3's
    /// DeleteObjects takes 1,000 keys a request), so replacing a dataset of thousands of
    /// shards is a few requests, not thousands.
    pub fn delete(&self, names: &[String]) -> Result<()> {
        let Some((first, rest)) = names.split_first() else { return Ok(()) };
        self.guard()?;
        self.runtime()
            .block_on(self.client().delete(&self.key(first)))
            .map_err(self.error(first, "delete"))?;
        let keys: Vec<object_store::Result<Key>> = rest.iter().map(|n| Ok(self.key(n))).collect();
        let deleted = self.client().delete_stream(Box::pin(futures_util::stream::iter(keys)));
        self.runtime().block_on(deleted.try_collect::<Vec<_>>()).map(drop).map_err(self.error("", "delete"))
    }

    /// Deletes the objects `names` as [`Store::delete`] does, but gives up after `within`:
    /// for cleaning up after a run that is failing already, perhaps because the store is gone.
    pub fn delete_within(&self, names: &[String], within: std::time::Duration) -> Result<()> {
        self.guard()?;
        let all = async {
            for name in names {
                self.client().delete(&self.key(name)).await.map_err(self.error(name, "delete"))?;
            }
            Ok(())
        };
        // The timer is made inside the runtime: it needs the runtime's clock.
        match self.runtime().block_on(async { tokio::time::timeout(within, all).await }) {
            Ok(done) => done,
            Err(_) => Err(Error::Reader(imgpack_reader::Error::Store {
                url: self.url().to_string(),
                operation: "clean up",
                endpoint: self.read.endpoint().to_string(),
                reason: format!("the store did not answer within {within:?}"),
            })),
        }
    }

    /// Starts a multipart upload of object `name`, to hold at most `max_bytes` (the part size
    /// is chosen so that fits in S3's 10,000 parts).
    pub fn upload(&self, name: &str, max_bytes: u64) -> Result<Upload> {
        self.guard()?;
        Upload::start(self.clone(), name, max_bytes)
    }
}
