//! What a run records about how it was made: the options that shape the output (in every
//! dataset's metadata, `options`) and the run description a checkpoint journal keeps.
//!
//! Both are typed, and "what changed" between two runs is derived from them: `--resume` refuses
//! a run made differently, a part is re-packed only when its options differ, and `pack merge`
//! refuses parts made differently, each naming the changed options. Thread counts are left out
//! on purpose: they do not change a byte of the output.
//!
//! In the metadata the options are a JSON object with sorted keys, whatever the field order
//! here (`serde_json` without `preserve_order`), so metadata stays byte-identical.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The options that shape a run's output, as its metadata records them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    /// `lmdb`, `webdataset` or `imagefolder`.
    pub to: String,
    /// Whether the samples were shuffled.
    pub shuffle: bool,
    /// The shuffle seed (`null` without shuffling).
    pub seed: Option<u64>,
    /// The file extensions listed.
    pub extensions: Vec<String>,
    /// `skip` or `fail`.
    pub on_error: String,
    /// How images were transcoded.
    #[serde(flatten)]
    pub transcode: crate::transcode::Recorded,
    /// WebDataset: the shard name prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// WebDataset: the largest shard in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_size: Option<u64>,
    /// WebDataset: the most samples per shard (`null` for no limit).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::encoding::present")]
    pub shard_samples: Option<Option<u64>>,
    /// WebDataset: `true` when every shard has an MD5 (`--md5`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5: Option<bool>,
}

impl Options {
    /// As the metadata's `options` object.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("options serialise")
    }

    /// What differs from `before` (the options of an earlier run or another part), as
    /// `name: before -> now`.
    pub fn differences(&self, before: &Options) -> Vec<String> {
        differences(&before.to_value(), &self.to_value())
    }

    /// What differs from options as recorded in a dataset's metadata, which may come from
    /// another version of `pack`: compared as recorded, so an option this version does not know
    /// shows up as a difference rather than being dropped.
    pub fn differences_from_recorded(&self, before: &Value) -> Vec<String> {
        differences(before, &self.to_value())
    }
}

/// Which part of which plan a run packs, as its journal records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPart {
    /// K.
    pub index: u64,
    /// N.
    pub count: u64,
    /// The plan's digest.
    pub plan: String,
}

/// What made an output: tool, source, options and part. A resumed run must match it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// `imgpack VERSION`.
    pub tool: String,
    /// The source root as given.
    pub source: String,
    /// `imagefolder`, `lmdb` or `webdataset`.
    pub source_kind: String,
    /// The options.
    pub options: Options,
    /// The part, when packing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<RunPart>,
}

impl Run {
    /// What differs from `before`, as `name: before -> now`, options prefixed `options.`.
    pub fn differences(&self, before: &Run) -> Vec<String> {
        let value = |run: &Run| serde_json::to_value(run).expect("runs serialise");
        differences(&value(before), &value(self))
    }
}

/// What differs between two JSON values, as `key: before -> now`, nested keys joined with dots.
pub fn differences(before: &Value, now: &Value) -> Vec<String> {
    match (before, now) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .flat_map(|key| {
                    let (x, y) = (a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null));
                    differences(x, y).into_iter().map(move |d| {
                        if d.starts_with(": ") {
                            format!("{key}{d}")
                        } else {
                            format!("{key}.{d}")
                        }
                    })
                })
                .collect()
        }
        _ if before == now => Vec::new(),
        _ => vec![format!(": {before} -> {now}")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            to: "lmdb".into(),
            shuffle: false,
            seed: None,
            extensions: vec!["jpg".into()],
            on_error: "skip".into(),
            transcode: crate::transcode::Recorded { mode: "passthrough".into(), ..Default::default() },
            prefix: None,
            shard_size: None,
            md5: None,
            shard_samples: None,
        }
    }

    #[test]
    fn differences_name_each_changed_option() {
        let a = serde_json::json!({"tool": "x", "options": {"shuffle": false, "seed": null, "to": "lmdb"}});
        let b = serde_json::json!({"tool": "x", "options": {"shuffle": true, "seed": 7, "to": "lmdb"}});
        assert_eq!(differences(&a, &b), ["options.seed: null -> 7", "options.shuffle: false -> true"]);
        assert!(differences(&a, &a).is_empty());
        let mut shuffled = options();
        (shuffled.shuffle, shuffled.seed) = (true, Some(7));
        assert_eq!(shuffled.differences(&options()), ["seed: null -> 7", "shuffle: false -> true"]);
    }

    #[test]
    fn options_record_null_for_settings_that_are_off_and_omit_the_others() {
        let mut wds = options();
        (wds.prefix, wds.shard_size, wds.shard_samples) = (Some("shard".into()), Some(1 << 30), Some(None));
        let value = wds.to_value();
        assert_eq!(value["shard_samples"], Value::Null);
        assert!(value.as_object().unwrap().contains_key("shard_samples"));
        assert!(!value.as_object().unwrap().contains_key("quality"), "{value}");
        // Read back exactly, `null` included.
        let back: Options = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(back, wds);
        assert!(wds.differences_from_recorded(&value).is_empty());
        // A recorded option this version does not know is a difference, not ignored.
        let mut newer = value;
        newer["future"] = serde_json::json!(1);
        assert_eq!(wds.differences_from_recorded(&newer), ["future: 1 -> null"]);
    }
}
