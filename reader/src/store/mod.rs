//! Object storage: datasets under an `s3://bucket/prefix/`, through `object_store` (feature
//! `s3`).
//!
//! Past one machine, datasets live in object stores (AWS S3 and the S3-compatible MinIO, Ceph,
//! SeaweedFS, R2). This module is the one place, for the reader and for `pack` alike, that
//! reaches them: [`url`] parses the locations, [`settings`] finds the endpoint and credentials
//! the way the AWS CLI does, [`problem`] turns a failed request into an [`Error`] naming the
//! bucket, the key and the fix, and [`Store`] holds the clients. `pack` adds writing (uploads,
//! deletes) on top of the same [`Store`].
//!
//! `object_store` is async; nothing else here is. A [`Store`] owns a small tokio runtime (two
//! worker threads: the work is waiting on the network, not computing) and every call blocks on
//! it, so callers stay synchronous and can call from any number of threads at once.
//!
//! What `object_store` retries by itself (timeouts, 5xx, dropped connections, with
//! exponential backoff: [`settings`]) never reaches the caller; what does is permanent.

pub mod problem;
pub mod settings;
pub mod url;

use std::ops::Range;
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

pub use url::{is_store_url, StoreUrl};

use crate::{Error, Result};

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its name, relative to the listed prefix.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag, the store's checksum of its content (for a multipart upload, of its parts),
    /// if the store gives one.
    pub e_tag: Option<String>,
}

/// A prefix in a bucket, with the clients and the runtime to reach it. Cheap to clone: clones
/// share the clients and the runtime.
#[derive(Clone)]
pub struct Store {
    url: StoreUrl,
    /// The endpoint as the user named it, for messages.
    endpoint: String,
    /// For the work: retries transient errors for minutes ([`settings::work_retries`]).
    client: Arc<AmazonS3>,
    /// For the first request, which finds wrong settings: retries briefly.
    check: Arc<AmazonS3>,
    runtime: Arc<Runtime>,
}

/// The runtime, and the process that made it. A process forked from that one (a PyTorch
/// DataLoader worker under `fork`) inherits the runtime without its threads, and dropping it
/// there would wait for those threads forever; there it is leaked instead (the child opens a
/// store of its own).
struct Runtime {
    runtime: std::mem::ManuallyDrop<tokio::runtime::Runtime>,
    pid: u32,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.runtime) }
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({} at {})", self.url, self.endpoint)
    }
}

impl Store {
    /// Sets up the clients for `url` at `endpoint` (none: AWS itself; see
    /// [`settings::endpoint`] for the flag-then-environment order). Sends no request:
    /// [`Store::list`] is the first, and finds a missing bucket, refused credentials or an
    /// endpoint that does not answer.
    pub fn open(url: &StoreUrl, endpoint: Option<&str>) -> Result<Store> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("imgpack-store")
            .enable_all()
            .build()
            .map_err(|source| Error::Io { path: url.to_string().into(), source })?;
        Ok(Store {
            url: url.clone(),
            endpoint: settings::endpoint_name(endpoint),
            client: Arc::new(settings::client(url, endpoint, settings::work_retries())?),
            check: Arc::new(settings::client(url, endpoint, settings::check_retries())?),
            runtime: Arc::new(Runtime {
                runtime: std::mem::ManuallyDrop::new(runtime),
                pid: std::process::id(),
            }),
        })
    }

    /// The prefix.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// The endpoint, as messages name it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The client for the work, for a writer to send its own requests with.
    pub fn client(&self) -> &Arc<AmazonS3> {
        &self.client
    }

    /// The client that retries only briefly: for a request whose failure should be reported
    /// at once rather than waited out.
    pub fn check_client(&self) -> &Arc<AmazonS3> {
        &self.check
    }

    /// The runtime every request runs on.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime.runtime
    }

    /// The typed error for a failed `operation` on object `name`.
    pub fn error<'a>(
        &'a self,
        name: &'a str,
        operation: &'static str,
    ) -> impl Fn(object_store::Error) -> Error + 'a {
        move |e| problem::to_error(&e, &self.url, name, operation, &self.endpoint)
    }

    /// The key of object `name` of the prefix, exactly as written: `Key::from` would
    /// percent-encode every non-ASCII byte and `%`, `~`, `#`, ... and so name another object
    /// than the one listed (`é.jpg` as `%C3%A9.jpg`). [`StoreUrl::parse`] has refused what a
    /// raw key cannot hold (empty, `.` and `..` segments, control characters); a listed name
    /// that still cannot be one falls back to the encoded form, which the store then reports
    /// as missing.
    pub fn key(&self, name: &str) -> Key {
        raw_key(&self.url.key(name))
    }

    /// The names (relative to the prefix, sorted) of every object under the prefix.
    pub fn list(&self) -> Result<Vec<String>> {
        Ok(self.list_sizes()?.into_iter().map(|(name, _)| name).collect())
    }

    /// The names (relative to the prefix, sorted) and sizes of every object under the prefix.
    /// The first request of a run: it retries only briefly, so wrong settings are reported at
    /// once.
    pub fn list_sizes(&self) -> Result<Vec<(String, u64)>> {
        Ok(self.list_objects(None)?.into_iter().map(|o| (o.name, o.size)).collect())
    }

    /// Every object under the prefix (under `prefix/under/` when `under` is given), sorted by
    /// name, with its size and ETag: what a resumed upload checks the objects it kept against.
    /// Names are relative to the prefix either way. Retries only briefly, as
    /// [`Store::list_sizes`].
    pub fn list_objects(&self, under: Option<&str>) -> Result<Vec<Listed>> {
        let full = match under {
            Some(under) => self.url.key(under),
            None => self.url.prefix.clone(),
        };
        let prefix = (!full.is_empty()).then(|| raw_key(&full));
        let listed: Vec<_> = self
            .runtime()
            .block_on(self.check.list(prefix.as_ref()).try_collect())
            .map_err(self.error(under.unwrap_or(""), "list"))?;
        let skip = if self.url.prefix.is_empty() { 0 } else { self.url.prefix.len() + 1 };
        let mut objects: Vec<Listed> = listed
            .into_iter()
            .map(|meta| Listed {
                name: meta.location.as_ref()[skip..].to_string(),
                size: meta.size,
                e_tag: meta.e_tag,
            })
            .collect();
        objects.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(objects)
    }

    /// Object `name`, whole, in one request, or `None` if there is no such object: one request
    /// where a listing would page through every object under the prefix. Often a run's first
    /// request, so it retries only briefly, as [`Store::list_sizes`].
    pub fn get_if_exists(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let read = async { self.check.get(&self.key(name)).await?.bytes().await };
        match self.runtime().block_on(read) {
            Ok(bytes) => Ok(Some(Vec::from(bytes))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(name, "read")(e)),
        }
    }

    /// Object `name`, whole, in one request.
    pub fn get(&self, name: &str) -> Result<Vec<u8>> {
        let read = async { self.client.get(&self.key(name)).await?.bytes().await };
        self.runtime().block_on(read).map(Vec::from).map_err(self.error(name, "read"))
    }

    /// Bytes `range` of object `name`, in one ranged GET. A store that answers with fewer
    /// bytes (the object is shorter than the range) is an error, not a short read.
    pub fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let want = range.end.saturating_sub(range.start);
        let bytes = self
            .runtime()
            .block_on(self.client.get_range(&self.key(name), range.clone()))
            .map_err(self.error(name, "read"))?;
        if bytes.len() as u64 != want {
            return Err(self.short(name, &range, bytes.len() as u64));
        }
        Ok(Vec::from(bytes))
    }

    /// Bytes `range` of object `name` as they arrive, in one streamed GET: for reading a
    /// whole shard without holding it in memory.
    pub fn stream(&self, name: &str, range: Range<u64>) -> Result<Chunks> {
        let options = GetOptions { range: Some(GetRange::Bounded(range.clone())), ..GetOptions::default() };
        let result = self
            .runtime()
            .block_on(self.client.get_opts(&self.key(name), options))
            .map_err(self.error(name, "read"))?;
        Ok(Chunks {
            store: self.clone(),
            name: name.to_string(),
            stream: result.into_stream().map_ok(Vec::from).boxed(),
            done: false,
            range,
            received: 0,
        })
    }

    fn short(&self, name: &str, range: &Range<u64>, got: u64) -> Error {
        Error::Store {
            url: self.url.object(name),
            operation: "read",
            endpoint: self.endpoint.clone(),
            reason: format!(
                "asked for bytes {}..{}, the store sent {got}: the object is shorter than its dataset says (replaced or truncated)",
                range.start, range.end
            ),
        }
    }
}

/// `key` as an object store path, unencoded where it can be (see [`Store::key`]).
fn raw_key(key: &str) -> Key {
    Key::parse(key).unwrap_or_else(|_| Key::from(key))
}

/// The bytes of one streamed GET, chunk by chunk as they arrive ([`Store::stream`]).
pub struct Chunks {
    store: Store,
    name: String,
    stream: futures_util::stream::BoxStream<'static, object_store::Result<Vec<u8>>>,
    range: Range<u64>,
    received: u64,
    /// Set once the stream ended or failed.
    done: bool,
}

impl Iterator for Chunks {
    type Item = Result<Vec<u8>>;

    fn next(&mut self) -> Option<Result<Vec<u8>>> {
        if self.done {
            return None;
        }
        let store = &self.store;
        let next = store.runtime().block_on(self.stream.next());
        self.done = !matches!(next, Some(Ok(_)));
        match next {
            Some(Ok(chunk)) => {
                self.received += chunk.len() as u64;
                Some(Ok(chunk))
            }
            Some(Err(e)) => Some(Err(store.error(&self.name, "read")(e))),
            None if self.received < self.range.end - self.range.start => {
                Some(Err(store.short(&self.name, &self.range, self.received)))
            }
            None => None,
        }
    }
}
