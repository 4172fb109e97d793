//! Samples that own their place in the storage instead of borrowing it.
//!
//! [`crate::Sample`] borrows its bytes from the dataset handle (a WebDataset's shard maps, an
//! LMDB snapshot), which is what Rust callers want and what a foreign caller cannot hold: a
//! Python `memoryview` outlives any Rust borrow. A [`SharedSample`] points into the same memory
//! maps — still no copy — and keeps what makes them valid alive itself: the dataset (its maps),
//! the bytes of a sample read from an object store, and, for LMDB, the read transaction the values were found in, since LMDB promises a value's
//! bytes only while its transaction lives. Drop the sample, and the transaction ends; drop the
//! last sample and the last [`Dataset`] handle, and the maps close.

use std::borrow::Cow;
use std::path::Path;
use std::sync::{Arc, Mutex};

use heed::{RoTxn, WithoutTls};

use crate::{Dataset, Field, Result, Sample};

/// A sample whose fields point into the dataset's memory maps and keep them valid:
/// `Send + Sync + 'static`, so it can be handed to another thread or language.
pub struct SharedSample {
    /// The sample index.
    pub index: u64,
    /// The sample key.
    pub key: String,
    fields: Vec<(String, *const u8, usize)>,
    dataset_path: Arc<Path>,
    /// Held only for what it keeps alive; never read.
    _keep: Arc<Keep>,
}

/// What a [`SharedSample`]'s pointers depend on.
///
/// Fields drop in order: the transaction ends before the dataset handle goes, so the last
/// `Arc` on the environment is the dataset's and a later [`crate::open`] of the path either
/// shares it or opens afresh.
struct Keep {
    /// An LMDB read transaction: the values found in it stay put while it lives. In a
    /// `Mutex` only to be `Sync` (heed's `RoTxn` is `Send`); it is never locked.
    _txn: Option<Mutex<RoTxn<'static, WithoutTls>>>,
    /// A sample read from an object store owns its bytes (on the heap, which does not move
    /// with the `Sample`): the pointers are into them.
    _owned: Option<Sample<'static>>,
    _dataset: Arc<Dataset>,
}

// SAFETY: the pointers are into read-only memory maps that `_keep` keeps mapped and unchanged
// (a dataset's shard maps, or an LMDB map under a live read transaction); nothing writes
// through them, so sharing and sending them is as safe as sharing `&[u8]`s of an `Arc`.
unsafe impl Send for SharedSample {}
// SAFETY: as above; `SharedSample` offers only shared (`&[u8]`) access.
unsafe impl Sync for SharedSample {}

impl std::fmt::Debug for SharedSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields: Vec<(&str, usize)> =
            self.fields.iter().map(|(ext, _, len)| (ext.as_str(), *len)).collect();
        f.debug_struct("SharedSample").field("key", &self.key).field("fields", &fields).finish()
    }
}

impl SharedSample {
    /// Takes `sample`'s place in the maps; `keep` must keep what it borrows from alive.
    fn new(sample: &Sample<'_>, keep: Arc<Keep>) -> SharedSample {
        let fields = sample.fields.iter().map(|f| (f.ext.clone(), f.data.as_ptr(), f.data.len())).collect();
        SharedSample {
            index: sample.index,
            key: sample.key.clone(),
            fields,
            dataset_path: sample.dataset.clone(),
            _keep: keep,
        }
    }

    /// The same sample as a [`Sample`] borrowing from this one, for its accessors
    /// ([`Sample::label`], [`Sample::info`], [`Sample::image`], [`Sample::payload`]).
    pub fn sample(&self) -> Sample<'_> {
        Sample {
            index: self.index,
            key: self.key.clone(),
            fields: self
                .fields()
                .map(|(ext, data)| Field { ext: ext.to_string(), data: Cow::Borrowed(data) })
                .collect(),
            dataset: self.dataset_path.clone(),
        }
    }

    /// The fields as (extension, bytes), sorted by extension.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields.iter().map(|(ext, ptr, len)| {
            // SAFETY: `ptr..ptr+len` was a live `&[u8]` into a map that `_keep` keeps valid for
            // as long as `self` exists (see the `Send` impl).
            (ext.as_str(), unsafe { std::slice::from_raw_parts(*ptr, *len) })
        })
    }

    /// The bytes of field `ext`, if present.
    pub fn field(&self, ext: &str) -> Option<&[u8]> {
        self.fields().find_map(|(e, data)| (e == ext).then_some(data))
    }

    /// A handle on the same bytes that keeps them valid, for a caller that needs each field's
    /// lifetime on its own (one Python `memoryview` per field).
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive(self._keep.clone())
    }
}

/// Keeps a [`SharedSample`]'s bytes valid after the sample itself is gone.
#[derive(Clone)]
pub struct KeepAlive(#[allow(dead_code)] Arc<Keep>);

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeepAlive")
    }
}

impl Dataset {
    /// Sample `index`, its fields pointing into the dataset's memory maps (no copy), holding
    /// the dataset (and for LMDB, its own read transaction) so the bytes stay valid as long as
    /// the sample or a [`KeepAlive`] of it exists. Checks and errors are [`Dataset::get`]'s; an
    /// LMDB value takes the same cold-read path.
    pub fn get_shared(self: &Arc<Dataset>, index: u64) -> Result<SharedSample> {
        match &**self {
            Dataset::Lmdb(lmdb) => {
                let txn = lmdb.static_txn()?;
                let placeholder = Arc::new(Keep { _txn: None, _owned: None, _dataset: self.clone() });
                let mut shared = SharedSample::new(&lmdb.get_in(&txn, index)?, placeholder);
                // Moving the transaction moves its handle, not the map the values lie in.
                shared._keep =
                    Arc::new(Keep { _txn: Some(Mutex::new(txn)), _owned: None, _dataset: self.clone() });
                Ok(shared)
            }
            Dataset::WebDataset(wds) => {
                let sample = wds.get(index)?;
                Ok(SharedSample::new(
                    &sample,
                    Arc::new(Keep { _txn: None, _owned: None, _dataset: self.clone() }),
                ))
            }
            #[cfg(feature = "s3")]
            Dataset::Remote(remote) => {
                let sample = remote.get(index)?;
                let shared = SharedSample::new(
                    &sample,
                    Arc::new(Keep { _txn: None, _owned: None, _dataset: self.clone() }),
                );
                Ok(SharedSample {
                    _keep: Arc::new(Keep { _txn: None, _owned: Some(sample), _dataset: self.clone() }),
                    ..shared
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn shared_samples_cross_threads_and_outlive_the_handle() {
        assert_send_sync::<SharedSample>();
        assert_send_sync::<KeepAlive>();
        let dir = tempfile::tempdir().unwrap();
        crate::lmdb::write_example(dir.path()).unwrap();
        let ds = Arc::new(crate::open(dir.path()).unwrap());
        let expected = ds.get(1).unwrap().into_owned();
        let shared = ds.get_shared(1).unwrap();
        let keep = shared.keep_alive();
        drop(ds);
        let bytes = std::thread::spawn(move || shared.field("png").unwrap().to_vec()).join().unwrap();
        assert_eq!(bytes, expected.field("png").unwrap());
        drop(keep);
        let ds = Arc::new(crate::open(dir.path()).unwrap());
        assert!(matches!(ds.get_shared(2), Err(crate::Error::OutOfRange { index: 2, .. })));
        let first = ds.get_shared(0).unwrap();
        let exts: Vec<&str> = first.fields().map(|(ext, _)| ext).collect();
        assert_eq!(exts, ["cls", "jpg", "json"]);
        assert_eq!(first.field("jpg").unwrap(), ds.get(0).unwrap().field("jpg").unwrap());
        assert_eq!(first.sample(), ds.get(0).unwrap());
        assert_eq!(first.sample().info().unwrap().path, "cat/tom.jpg");
    }
}
