//! Object storage: datasets under an `s3://bucket/prefix/`, through `object_store`.
//!
//! Past one machine, datasets live in object stores (AWS S3 and the S3-compatible MinIO, Ceph,
//! SeaweedFS, R2). This module is the one place that speaks to them: [`url`] parses the
//! locations, [`settings`] finds the endpoint and credentials the way the AWS CLI does,
//! `problem` turns a failed request into an [`Error`] naming the bucket, the key and the fix,
//! and [`upload`] streams one object up in parts with bounded memory.
//!
//! `object_store` is async; nothing else in `pack` is. A [`Store`] owns a small tokio runtime
//! (two worker threads: the work is waiting on the network, not computing) and every call
//! blocks on it, so callers stay synchronous. Parts of an upload run on that runtime while the
//! caller goes on producing the next bytes.
//!
//! What `object_store` retries by itself (timeouts, 5xx, dropped connections, with
//! exponential backoff: [`settings`]) never reaches the caller; what does is permanent.

pub(crate) mod problem;
pub mod settings;
pub mod upload;
pub mod url;

use std::sync::Arc;

use futures_util::TryStreamExt;
use object_store::aws::AmazonS3;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

pub use upload::Upload;
pub use url::{is_store_url, StoreUrl};

use crate::{Error, Result};

/// How long [`Store::upload_error`] waits to learn whether the bucket still exists.
const BUCKET_PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A prefix in a bucket, with the clients and the runtime to reach it.
#[derive(Clone)]
pub struct Store {
    url: StoreUrl,
    /// The endpoint as the user named it, for messages.
    endpoint: String,
    /// For the work: retries transient errors for minutes ([`settings`]).
    client: Arc<AmazonS3>,
    /// For the first request, which finds wrong settings: retries briefly.
    check: Arc<AmazonS3>,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({} at {})", self.url, self.endpoint)
    }
}

impl Store {
    /// Sets up the clients for `url` at `endpoint` (none: AWS itself). Sends no request:
    /// [`Store::list`] is the first, and finds a missing bucket, refused credentials or an
    /// endpoint that does not answer.
    pub fn open(url: &StoreUrl, endpoint: Option<&str>) -> Result<Store> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("imgpack-store")
            .enable_all()
            .build()
            .map_err(|e| Error::Threads { threads: 2, reason: format!("the store's runtime: {e}") })?;
        Ok(Store {
            url: url.clone(),
            endpoint: settings::endpoint_name(endpoint),
            client: Arc::new(settings::client(url, endpoint, settings::work_retries())?),
            check: Arc::new(settings::client(url, endpoint, settings::check_retries())?),
            runtime: Arc::new(runtime),
        })
    }

    /// The prefix this store writes under.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// The typed error for a failed `operation` on object `name`.
    pub(crate) fn error<'a>(
        &'a self,
        name: &'a str,
        operation: &'static str,
    ) -> impl Fn(object_store::Error) -> Error + 'a {
        move |e| problem::to_error(&e, &self.url, name, operation, &self.endpoint)
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
            let error = problem::to_error(&e, &self.url, name, operation, &self.endpoint);
            if !matches!(error, Error::StoreUploadAborted { .. }) {
                return error;
            }
            let probe =
                async { tokio::time::timeout(BUCKET_PROBE_WAIT, self.check.list(None).try_next()).await };
            match self.runtime.block_on(probe) {
                Ok(Err(listing)) if problem::classify(&listing) == problem::Problem::NoSuchBucket => {
                    Error::NoSuchBucket {
                        url: self.url.object(name),
                        bucket: self.url.bucket.clone(),
                        endpoint: self.endpoint.clone(),
                    }
                }
                _ => error,
            }
        }
    }

    fn key(&self, name: &str) -> Key {
        Key::from(self.url.key(name))
    }

    /// The names (relative to the prefix, sorted) of every object under the prefix. The first
    /// request of a run: it retries only briefly, so wrong settings are reported at once.
    pub fn list(&self) -> Result<Vec<String>> {
        let prefix = (!self.url.prefix.is_empty()).then(|| Key::from(self.url.prefix.as_str()));
        let listed: Vec<_> = self
            .runtime
            .block_on(self.check.list(prefix.as_ref()).try_collect())
            .map_err(self.error("", "list"))?;
        let skip = if self.url.prefix.is_empty() { 0 } else { self.url.prefix.len() + 1 };
        let mut names: Vec<String> =
            listed.into_iter().map(|meta| meta.location.as_ref()[skip..].to_string()).collect();
        names.sort();
        Ok(names)
    }

    /// Stores `bytes` as object `name`, in one request.
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.runtime
            .block_on(self.client.put(&self.key(name), PutPayload::from(bytes)))
            .map(drop)
            .map_err(self.error(name, "upload"))
    }

    /// Deletes the objects `names`: the first alone and before the others (callers put the one
    /// that makes a dataset visible, `imgpack.json`, first), the rest in batches (S3's
    /// DeleteObjects takes 1,000 keys a request), so replacing a dataset of thousands of
    /// shards is a few requests, not thousands.
    pub fn delete(&self, names: &[String]) -> Result<()> {
        let Some((first, rest)) = names.split_first() else { return Ok(()) };
        self.runtime.block_on(self.client.delete(&self.key(first))).map_err(self.error(first, "delete"))?;
        let keys: Vec<object_store::Result<Key>> = rest.iter().map(|n| Ok(self.key(n))).collect();
        let deleted = self.client.delete_stream(Box::pin(futures_util::stream::iter(keys)));
        self.runtime.block_on(deleted.try_collect::<Vec<_>>()).map(drop).map_err(self.error("", "delete"))
    }

    /// Deletes the objects `names` as [`Store::delete`] does, but gives up after `within`:
    /// for cleaning up after a run that is failing already, perhaps because the store is gone.
    pub fn delete_within(&self, names: &[String], within: std::time::Duration) -> Result<()> {
        let all = async {
            for name in names {
                self.client.delete(&self.key(name)).await.map_err(self.error(name, "delete"))?;
            }
            Ok(())
        };
        // The timer is made inside the runtime: it needs the runtime's clock.
        match self.runtime.block_on(async { tokio::time::timeout(within, all).await }) {
            Ok(done) => done,
            Err(_) => Err(Error::Store {
                url: self.url.to_string(),
                operation: "clean up",
                endpoint: self.endpoint.clone(),
                reason: format!("the store did not answer within {within:?}"),
            }),
        }
    }

    /// Starts a multipart upload of object `name`, to hold at most `max_bytes` (the part size
    /// is chosen so that fits in S3's 10,000 parts).
    pub fn upload(&self, name: &str, max_bytes: u64) -> Result<Upload> {
        Upload::start(self.clone(), name, max_bytes)
    }
}
