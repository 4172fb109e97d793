//! Plans in object storage, for a cluster job whose machines share no volume:
//! `pack plan SRC -o s3://bucket/train.plan`, then `pack s3://bucket/train.plan --part K/N ...`
//! on every machine.
//!
//! A plan is one object, not a prefix. It is written with one PUT of exactly the bytes a plan
//! file on disk holds, so its MD5 — what ties the parts of a dataset to their plan — is the
//! same wherever it was kept, and parts packed from a stored plan merge with parts packed from
//! a downloaded copy. It is read by downloading it to a temporary file that the plan code
//! reads as any plan file: a part reads its plan line by line, and a file is what the rest of
//! the run (the plan's MD5, resume) expects to name.

use std::path::{Path, PathBuf};

use super::{is_plan, ListingPlan};
use crate::store::{Store, StoreUrl};
use crate::{Error, Result};

/// Where `pack plan` writes a plan: a local file, or an object in a store.
#[derive(Debug)]
pub enum PlanFile {
    /// A file, written atomically (a temporary beside it, renamed).
    Local(PathBuf),
    /// An object, written in one PUT (an object appears whole or not at all).
    Stored(StoredObject),
}

/// One object in a store: the store opened at the prefix the object is in, and its name there.
#[derive(Debug)]
pub struct StoredObject {
    store: Store,
    name: String,
}

impl StoredObject {
    /// The object `s3://bucket/key` names at `endpoint`; `None` if it names a prefix (it ends
    /// with `/`, or is a bucket's root). Sends no request.
    fn at(text: &str, endpoint: Option<&str>) -> Result<Option<StoredObject>> {
        let url = StoreUrl::parse(text)?;
        if text.ends_with('/') || url.prefix.is_empty() {
            return Ok(None);
        }
        let (parent, name) = url.prefix.rsplit_once('/').unwrap_or(("", &url.prefix));
        let parent = StoreUrl { bucket: url.bucket.clone(), prefix: parent.to_string() };
        Ok(Some(StoredObject { store: Store::open(&parent, endpoint)?, name: name.to_string() }))
    }

    /// `s3://bucket/key`, for messages.
    pub fn url(&self) -> String {
        self.store.url().object(&self.name)
    }
}

impl PlanFile {
    /// Where `path` names: an object for `s3://bucket/key` (at `endpoint`), else a file. A
    /// prefix (`s3://bucket/plans/`) is refused: a plan is one object.
    pub fn new(path: &Path, endpoint: Option<&str>) -> Result<PlanFile> {
        let Some(text) = path.to_str().filter(|p| crate::store::is_store_url(p)) else {
            return Ok(PlanFile::Local(path.to_path_buf()));
        };
        match StoredObject::at(text, endpoint)? {
            Some(object) => Ok(PlanFile::Stored(object)),
            None => Err(Error::Usage(format!(
                "-o {text}: a plan is one object, and this names a prefix; name the object, e.g. -o {}",
                StoreUrl::parse(text)?.object("train.plan")
            ))),
        }
    }

    /// Whether a file or object is there already. For an object, one HEAD: the first request
    /// of `pack plan`, made before the tree is walked, so wrong store settings or a missing
    /// bucket are reported at once.
    pub fn exists(&self) -> Result<bool> {
        match self {
            PlanFile::Local(path) => Ok(path.exists()),
            PlanFile::Stored(object) => Ok(object.store.size(&object.name)?.is_some()),
        }
    }

    /// Writes `plan` there.
    pub fn write(&self, plan: &ListingPlan) -> Result<()> {
        match self {
            PlanFile::Local(path) => plan.write(path),
            PlanFile::Stored(object) => object.store.put(&object.name, plan.to_bytes()?),
        }
    }

    /// How messages and summaries name it.
    pub fn display(&self) -> String {
        match self {
            PlanFile::Local(path) => path.display().to_string(),
            PlanFile::Stored(object) => object.url(),
        }
    }
}

/// A plan read from a store, downloaded to a temporary file; the file is removed when this is
/// dropped.
#[derive(Debug)]
pub struct StoredPlan {
    /// The temporary directory holding the copy.
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// `s3://bucket/key`.
    url: String,
}

impl StoredPlan {
    /// The plan `source` names, downloaded, when `source` is an `s3://bucket/key` of an object
    /// (at `endpoint`); `None` for a local path and for a prefix — one that ends with `/`, or
    /// under which no object of that very name is stored (one HEAD tells). An object that is
    /// not a plan is refused: it cannot be packed, and the prefix of the same name is meant
    /// with a trailing `/`.
    pub fn fetch(source: &Path, endpoint: Option<&str>) -> Result<Option<StoredPlan>> {
        let Some(text) = source.to_str().filter(|p| crate::store::is_store_url(p)) else { return Ok(None) };
        let Some(object) = StoredObject::at(text, endpoint)? else { return Ok(None) };
        let Some(bytes) = object.store.size(&object.name)? else { return Ok(None) };
        let dir = tempfile::Builder::new()
            .prefix("imgpack-plan-")
            .tempdir()
            .map_err(Error::io(&std::env::temp_dir()))?;
        let path = dir.path().join(&object.name);
        object.store.download(&object.name, bytes, &path)?;
        if !is_plan(&path) {
            return Err(Error::BadSource {
                path: PathBuf::from(object.url()),
                reason: format!(
                    "is an object, not a plan written by `pack plan`; to pack the tree or dataset stored under the prefix of that name, end it with a slash: {text}/"
                ),
            });
        }
        Ok(Some(StoredPlan { _dir: dir, path, url: object.url() }))
    }

    /// The local copy.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `err`, from packing the local copy, naming the plan as the user did (`s3://bucket/key`)
    /// rather than the temporary copy: "the plan s3://... fixed the order", "s3://...: not a
    /// plan written by `pack plan`: line 7".
    pub fn named(&self, err: Error) -> Error {
        let copy = self.path.display().to_string();
        let rename = |path: PathBuf| if path == self.path { PathBuf::from(&self.url) } else { path };
        match err {
            Error::Usage(text) => Error::Usage(text.replace(&copy, &self.url)),
            Error::BadSource { path, reason } => Error::BadSource { path: rename(path), reason },
            Error::Io { path, source } => Error::Io { path: rename(path), source },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `text` points, without a request: (prefix the store is opened at, object name).
    fn object(text: &str) -> Option<(String, String)> {
        let object = StoredObject::at(text, Some("http://127.0.0.1:9")).unwrap()?;
        Some((object.store.url().to_string(), object.name))
    }

    #[test]
    fn a_location_names_an_object_unless_it_ends_with_a_slash() {
        assert_eq!(
            object("s3://my-bucket/plans/train.plan"),
            Some(("s3://my-bucket/plans/".into(), "train.plan".into()))
        );
        assert_eq!(
            object("s3://my-bucket/train.plan"),
            Some(("s3://my-bucket/".into(), "train.plan".into()))
        );
        assert_eq!(object("s3://my-bucket/plans/"), None);
        assert_eq!(object("s3://my-bucket"), None);
        assert_eq!(object("s3://my-bucket/"), None);
    }

    #[test]
    fn a_plan_is_written_to_a_file_or_an_object_never_a_prefix() {
        let endpoint = Some("http://127.0.0.1:9");
        assert!(matches!(PlanFile::new(Path::new("t.plan"), endpoint), Ok(PlanFile::Local(_))));
        let stored = PlanFile::new(Path::new("s3://my-bucket/p/t.plan"), endpoint).unwrap();
        assert_eq!(stored.display(), "s3://my-bucket/p/t.plan");
        let err = PlanFile::new(Path::new("s3://my-bucket/p/"), endpoint).unwrap_err().to_string();
        assert!(err.contains("names a prefix") && err.contains("-o s3://my-bucket/p/train.plan"), "{err}");
    }

    #[test]
    fn a_local_path_is_no_stored_plan_and_sends_no_request() {
        assert!(StoredPlan::fetch(Path::new("train.plan"), Some("http://127.0.0.1:9")).unwrap().is_none());
        assert!(StoredPlan::fetch(Path::new("s3://my-bucket/tree/"), Some("http://127.0.0.1:9"))
            .unwrap()
            .is_none());
    }
}
