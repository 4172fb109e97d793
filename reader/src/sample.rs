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
