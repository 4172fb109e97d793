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
//! process is killed is left incomplete in the store, invisible to readers (and billed). So the
//! next run on the prefix aborts what a killed one left ([`Store::abort_left_uploads`]): the
//! uploads a resumable run recorded before sending their first part ([`Store::record_uploads`]),
//! and those S3's ListMultipartUploads lists for the objects `pack` writes
//! ([`Store::list_uploads`]; `object_store` has no call for it, so the request is presigned with
//! its signer). The record covers stores that do not list uploads; the listing covers a run
//! killed between starting an upload and recording it.

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
/// ([`Store::record_uploads`]).
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
        // Completing is what makes the object appear: not once another run owns the prefix.
        self.store.guard()?;
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
    /// streamed up as an upload (recorded in `record`, if given), never whole in memory.
    pub fn upload_file(&self, name: &str, path: &std::path::Path, record: Option<&str>) -> Result<()> {
        use std::io::Read;
        let mut file = std::fs::File::open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        if len <= PART_BYTES as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).map_err(Error::io(path))?;
            return self.put(name, bytes);
        }
        let mut upload = match record {
            Some(record) => self.recorded_upload(name, len, record)?,
            None => self.upload(name, len)?,
        };
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

    /// The unfinished multipart uploads under the prefix that a run of `pack` could have
    /// started — of a shard (`*.tar`), of `imgpack.index`, or under `imgpack-resume/` — as S3's
    /// ListMultipartUploads lists them. `object_store` has no call for it, so the request is
    /// presigned by its signer and sent with its HTTP client. Objects of other names are never
    /// listed, so a prefix at a bucket's root leaves other writers' uploads alone.
    pub fn list_uploads(&self) -> Result<Vec<Open>> {
        use object_store::client::{ClientOptions, HttpConnector, ReqwestConnector};
        use object_store::signer::{SignedUrlOptions, Signer};
        let prefix = match self.url().prefix.as_str() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let failed = |reason: String| {
            Error::Reader(imgpack_reader::Error::Store {
                url: self.url().to_string(),
                operation: "list the unfinished uploads",
                endpoint: self.read.endpoint().to_string(),
                reason,
            })
        };
        let http = ReqwestConnector::default()
            .connect(&ClientOptions::new().with_allow_http(true))
            .map_err(|e| failed(e.to_string()))?;
        let (mut uploads, mut markers) = (Vec::new(), None::<(String, String)>);
        loop {
            let mut query = vec![("uploads", String::new()), ("prefix", prefix.clone())];
            if let Some((key, id)) = &markers {
                query.extend([("key-marker", key.clone()), ("upload-id-marker", id.clone())]);
            }
            let options = SignedUrlOptions::default().with_query(query);
            let root = Key::from("");
            let minute = std::time::Duration::from_secs(60);
            let answer = self.runtime().block_on(async {
                let url = self.client().signed_url_opts(http::Method::GET, &root, minute, &options).await?;
                let request = http::Request::get(url.as_str())
                    .body(object_store::client::HttpRequestBody::from(Vec::new()))
                    .map_err(|e| object_store::Error::Generic { store: "S3", source: e.into() })?;
                let response = http
                    .execute(request)
                    .await
                    .map_err(|e| object_store::Error::Generic { store: "S3", source: e.into() })?;
                let status = response.status();
                let body = response
                    .into_body()
                    .bytes()
                    .await
                    .map_err(|e| object_store::Error::Generic { store: "S3", source: e.into() })?;
                Ok::<_, object_store::Error>((status, String::from_utf8_lossy(&body).into_owned()))
            });
            let (status, body) = answer.map_err(|e| failed(e.to_string()))?;
            if !status.is_success() {
                return Err(failed(format!("HTTP {status}: {}", body.chars().take(300).collect::<String>())));
            }
            let page = parse_uploads(&body);
            uploads.extend(page.uploads.into_iter().filter(|u| {
                let name = u.name.strip_prefix(&prefix).unwrap_or(&u.name);
                let ours = (!name.contains('/') && (name.ends_with(".tar") || name == "imgpack.index"))
                    || name.starts_with("imgpack-resume/");
                ours && u.name.starts_with(&prefix)
            }));
            match page.next {
                Some(next) if Some(&next) != markers.as_ref() => markers = Some(next),
                _ => break,
            }
        }
        for upload in &mut uploads {
            upload.name = upload.name[prefix.len()..].to_string();
        }
        Ok(uploads)
    }

    /// Aborts the uploads runs killed before they could (those `record` names, and those the
    /// store lists: [`Store::list_uploads`]), and returns how many it aborted. A store that
    /// cannot list its unfinished uploads (or will not let these credentials) has only the
    /// recorded ones aborted.
    pub fn abort_left_uploads(&self, record: Option<&str>) -> Result<usize> {
        let mut aborted = match record {
            Some(record) => self.abort_recorded(record)?,
            None => 0,
        };
        if let Ok(listed) = self.list_uploads() {
            aborted += self.abort(listed)?;
        }
        Ok(aborted)
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
        self.abort(uploads)
    }

    /// Aborts `uploads`, passing over those that are gone already; returns how many it aborted.
    fn abort(&self, uploads: Vec<Open>) -> Result<usize> {
        self.guard()?;
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

/// One page of a ListMultipartUploads answer.
#[derive(Debug, Default, PartialEq)]
struct UploadsPage {
    /// Full keys and upload ids.
    uploads: Vec<Open>,
    /// The key and upload-id markers of the next page, if the answer is truncated.
    next: Option<(String, String)>,
}

/// Reads a ListMultipartUploads answer (S3's XML) for what it holds: a handful of flat
/// elements, read by name rather than with an XML library.
fn parse_uploads(xml: &str) -> UploadsPage {
    fn text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
        let open = format!("<{tag}>");
        let start = xml.find(&open)? + open.len();
        let end = xml[start..].find(&format!("</{tag}>"))? + start;
        Some(&xml[start..end])
    }
    fn unescape(text: &str) -> String {
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&#39;", "'")
            .replace("&amp;", "&")
    }
    let mut page = UploadsPage::default();
    let mut rest = xml;
    while let Some(start) = rest.find("<Upload>") {
        let Some(len) = rest[start..].find("</Upload>") else { break };
        let upload = &rest[start..start + len];
        if let (Some(key), Some(id)) = (text(upload, "Key"), text(upload, "UploadId")) {
            page.uploads.push(Open { name: unescape(key), id: unescape(id) });
        }
        rest = &rest[start + len..];
    }
    if text(xml, "IsTruncated") == Some("true") {
        let marker = |tag| text(xml, tag).map(unescape).unwrap_or_default();
        page.next = Some((marker("NextKeyMarker"), marker("NextUploadIdMarker")));
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uploads_listing_gives_keys_ids_and_the_next_page() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>b</Bucket>
<KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker><NextKeyMarker>ds/shard-000001.tar</NextKeyMarker>
<NextUploadIdMarker>id-2</NextUploadIdMarker><MaxUploads>2</MaxUploads><IsTruncated>true</IsTruncated>
<Upload><Key>ds/shard-000000.tar</Key><UploadId>id-1</UploadId><Initiated>2026-12-02T20:00:00Z</Initiated></Upload>
<Upload><Key>ds/a&amp;b/shard-000001.tar</Key><UploadId>id-2</UploadId></Upload></ListMultipartUploadsResult>"#;
        let page = parse_uploads(xml);
        let open = |name: &str, id: &str| Open { name: name.into(), id: id.into() };
        assert_eq!(
            page.uploads,
            [open("ds/shard-000000.tar", "id-1"), open("ds/a&b/shard-000001.tar", "id-2")]
        );
        assert_eq!(page.next, Some(("ds/shard-000001.tar".into(), "id-2".into())));
        let last = parse_uploads(
            "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>",
        );
        assert_eq!(last, UploadsPage::default());
    }

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
