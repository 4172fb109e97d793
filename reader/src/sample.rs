//! One sample as read back: its key and its fields.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::format::{ImageFormat, CLS_FIELD, JSON_FIELD, NPY_FIELD, NPY_ZSTD_FIELD};

/// One field of a sample: an extension and the bytes stored under `{key}.{ext}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field<'a> {
    /// The extension, e.g. `jpg`, `cls`, `json`.
    pub ext: String,
    /// The stored bytes; borrowed straight from the memory map where the reader allows it.
    pub data: Cow<'a, [u8]>,
}

/// A sample: its index, its key and its fields sorted by extension.
///
/// `Sample<'static>` owns its bytes; a sample borrowed from a read snapshot
/// ([`crate::lmdb::Snapshot::get`]) points into the memory map and copies nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample<'a> {
    /// The sample index (its position in the dataset).
    pub index: u64,
    /// The sample key, the index in zero-padded decimal.
    pub key: String,
    /// The fields, sorted by extension.
    pub fields: Vec<Field<'a>>,
    /// The dataset the sample was read from, named in errors about it.
    pub dataset: Arc<Path>,
}

/// The contents of a sample's `json` field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleInfo {
    /// The source path relative to the source root, with `/` separators (lossily decoded if
    /// the file name was not UTF-8; see `path_hex`).
    pub path: String,
    /// The class name.
    pub class: String,
    /// The exact source path bytes in hex, present only when the path is not valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
}

impl SampleInfo {
    /// The record for a sample from `path` (relative to the source root, `/`-separated, raw
    /// bytes) in class `class`: `path_hex` is set exactly when the path is not UTF-8.
    pub fn new(path: &[u8], class: &str) -> SampleInfo {
        let path_hex =
            std::str::from_utf8(path).is_err().then(|| path.iter().map(|b| format!("{b:02x}")).collect());
        SampleInfo { path: String::from_utf8_lossy(path).into_owned(), class: class.to_string(), path_hex }
    }

    /// The exact source path bytes: `path_hex` decoded when present, else `path`. The error
    /// says what is wrong with a malformed `path_hex`.
    ///
    /// The bytes are returned as recorded, not checked as a path: a damaged or hostile dataset
    /// can record `../x` or `/etc/passwd`, so a caller that creates files by this path must
    /// refuse absolute paths and `..` components itself (as `pack --to imagefolder` does).
    pub fn path_bytes(&self) -> Result<Vec<u8>, String> {
        let Some(hex) = &self.path_hex else { return Ok(self.path.clone().into_bytes()) };
        let bad = || format!("json path_hex {hex:?} is not hex");
        // Only hex digits, checked up front: `from_str_radix` alone would take `+1` for `01`.
        if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(bad)
    }
}

impl<'a> Sample<'a> {
    /// The bytes of field `ext`, if present.
    pub fn field(&self, ext: &str) -> Option<&[u8]> {
        self.fields.iter().find(|f| f.ext == ext).map(|f| &*f.data)
    }

    /// The image field: its format and bytes.
    pub fn image(&self) -> Option<(ImageFormat, &[u8])> {
        self.fields.iter().find_map(|f| ImageFormat::from_extension(&f.ext).map(|fmt| (fmt, &*f.data)))
    }

    /// The sample's payload: its image field, or its decoded-pixels field (`npy`, `npy.zst`),
    /// as (extension, bytes).
    pub fn payload(&self) -> Option<(&str, &[u8])> {
        self.fields.iter().find_map(|f| {
            let is_payload = ImageFormat::from_extension(&f.ext).is_some()
                || f.ext == NPY_FIELD
                || f.ext == NPY_ZSTD_FIELD;
            is_payload.then_some((f.ext.as_str(), &*f.data))
        })
    }

    /// The class index from the `cls` field.
    pub fn label(&self) -> Result<u32, crate::Error> {
        let raw = self.field(CLS_FIELD).ok_or_else(|| self.damaged("no cls field"))?;
        std::str::from_utf8(raw)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| self.damaged("cls field is not a decimal number"))
    }

    /// The parsed `json` field.
    pub fn info(&self) -> Result<SampleInfo, crate::Error> {
        let raw = self.field(JSON_FIELD).ok_or_else(|| self.damaged("no json field"))?;
        serde_json::from_slice(raw).map_err(|e| self.damaged(&format!("json field: {e}")))
    }

    /// Copies every borrowed field, detaching the sample from the snapshot it came from.
    pub fn into_owned(self) -> Sample<'static> {
        Sample {
            index: self.index,
            key: self.key,
            dataset: self.dataset,
            fields: self
                .fields
                .into_iter()
                .map(|f| Field { ext: f.ext, data: Cow::Owned(f.data.into_owned()) })
                .collect(),
        }
    }

    fn damaged(&self, reason: &str) -> crate::Error {
        crate::Error::BadSample {
            path: self.dataset.to_path_buf(),
            key: self.key.clone(),
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_through_the_json_record() {
        let plain = SampleInfo::new(b"cat/a b.jpg", "cat");
        assert_eq!((plain.path.as_str(), plain.path_hex.as_deref()), ("cat/a b.jpg", None));
        assert_eq!(plain.path_bytes().unwrap(), b"cat/a b.jpg");
        let odd = SampleInfo::new(b"cat/caf\xe9.jpg", "cat");
        assert_eq!(odd.path_hex.as_deref(), Some("6361742f636166e92e6a7067"));
        assert_eq!(odd.path_bytes().unwrap(), b"cat/caf\xe9.jpg");
        let broken = SampleInfo { path_hex: Some("6".into()), ..odd };
        assert!(broken.path_bytes().unwrap_err().contains("not hex"));
    }
}
