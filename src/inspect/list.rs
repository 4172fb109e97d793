//! `pack ls PATH`: one entry per sample, streamed in key order.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::ControlFlow;
use std::path::Path;

use serde::Serialize;

/// One sample as `pack ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Always `sample`: the record's type among `pack`'s JSON lines.
    #[serde(rename = "type")]
    pub record: &'static str,
    /// The sample index.
    pub index: u64,
    /// The sample key (the index zero-padded).
    pub key: String,
    /// The class index (the `cls` field).
    pub label: u32,
    /// The class name.
    pub class: String,
    /// The source path relative to the source root, as recorded in the `json` field.
    pub path: String,
    /// Every stored field with its size in bytes, by extension.
    pub fields: BTreeMap<String, u64>,
}

impl fmt::Display for Entry {
    /// Tab-separated columns, so `cut` and `awk` take them apart: key, class index, class,
    /// path, and the fields as `ext:bytes` pairs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields: Vec<String> = self.fields.iter().map(|(ext, bytes)| format!("{ext}:{bytes}")).collect();
        write!(f, "{}\t{}\t{}\t{}\t{}", self.key, self.label, self.class, self.path, fields.join(" "))
    }
}

/// How many samples are read between two looks at whether the caller wants to stop.
const CHUNK: u64 = 1024;

/// Calls `visit` with the first `limit` samples of the dataset at `path` (all without a
/// limit), in order, until it returns [`ControlFlow::Break`].
pub fn list(
    path: &Path,
    endpoint: Option<&str>,
    limit: Option<u64>,
    mut visit: impl FnMut(&Entry) -> ControlFlow<()>,
) -> crate::Result<()> {
    let dataset = super::open(path, endpoint)?;
    let classes = dataset.classes().to_vec();
    let end = limit.unwrap_or(u64::MAX).min(dataset.len());
    let mut stop = false;
    let mut start = 0;
    while start < end && !stop {
        let chunk_end = (start + CHUNK).min(end);
        dataset.scan_range(start..chunk_end, |sample| {
            if stop {
                return Ok(());
            }
            let label = sample.label()?;
            let entry = Entry {
                record: "sample",
                index: sample.index,
                key: sample.key.clone(),
                label,
                class: class_name(&classes, label),
                path: sample.info()?.path,
                fields: sample.fields.iter().map(|f| (f.ext.clone(), f.data.len() as u64)).collect(),
            };
            stop = visit(&entry).is_break();
            Ok(())
        })?;
        start = chunk_end;
    }
    Ok(())
}

/// The name of class `label`, or a note that the label is out of range (a damaged dataset:
/// `pack verify` names such samples).
pub(super) fn class_name(classes: &[String], label: u32) -> String {
    match classes.get(label as usize) {
        Some(name) => name.clone(),
        None => format!("<label {label} beyond the {} classes; run pack verify>", classes.len()),
    }
}
