//! Dataset metadata: the one record that says what a dataset holds.
//!
//! It is stored as JSON (under the LMDB key `__meta__`), written last, after every sample, so a
//! dataset without it is incomplete by definition. It holds no timestamps or host names: the
//! same input and options give byte-identical metadata.

use serde::{Deserialize, Deserializer, Serialize};

use crate::key::{MAX_KEY_WIDTH, MIN_KEY_WIDTH};
use crate::part::PartInfo;

/// The format version this crate writes; it reads this one and every earlier one. A change that
/// old readers cannot read bumps it. Version 2 added checksums ([`crate::checksum`]); version 3
/// gave every WebDataset shard a CRC-32 of the whole file ([`ShardInfo::crc32`]) and made its
/// MD5 optional ([`ShardInfo::md5`], only with `pack --md5`).
pub const FORMAT_VERSION: u32 = 3;

/// What a dataset holds and how it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The format name: `imgpack-lmdb`.
    pub format: String,
    /// The format version, [`FORMAT_VERSION`] when written by this crate's writer.
    pub version: u32,
    /// How many samples the dataset holds; keys run from 0 to `samples - 1` with no gap.
    pub samples: u64,
    /// The number of digits in every sample key, [`MIN_KEY_WIDTH`] to [`MAX_KEY_WIDTH`].
    /// Deserializing refuses any other value, so no reader builds keys from an absurd width.
    #[serde(deserialize_with = "key_width_in_range")]
    pub key_width: usize,
    /// Class names in class-index order (`cls` field value `i` is `classes[i]`).
    pub classes: Vec<String>,
    /// Every field extension present in the dataset, sorted.
    pub fields: Vec<String>,
    /// Where the samples came from.
    pub source: SourceInfo,
    /// The options that shaped the output (mode, shuffle, seed, extensions, ...), as given.
    pub options: serde_json::Value,
    /// The tool and version that wrote the dataset, e.g. `imgpack 0.1.0`.
    pub tool: String,
    /// The checksum algorithm of the samples' stored bytes ([`crate::checksum::ALGORITHM`]), or
    /// `None` for a dataset written before version 2, which carries no checksums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// WebDataset outputs only: the shards in order, with the samples each holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardInfo>,
    /// Only in one part of a dataset packed in parts (`pack PLAN --part K/N`): which part, of
    /// which plan. Such a part is not a dataset by itself ([`crate::part`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<PartInfo>,
}

impl Meta {
    /// Why a reader of `format` cannot read a dataset with this metadata, if it cannot: another
    /// format, a version this crate does not know (0 was never written; a newer one needs a
    /// newer reader), or a checksum algorithm it does not know (checking those sums as CRC-32
    /// would call every sample damaged) — or it is one part of a dataset packed in parts,
    /// which only `pack merge` reads.
    pub fn unreadable(&self, format: &str) -> Option<String> {
        if let Some(part) = &self.part {
            return Some(format!(
                "this is part {} of {} of a dataset packed with `pack PLAN --part`, not a dataset by itself; run `pack merge` on the directory above it when all {} parts are done, and open that directory",
                part.index, part.count, part.count
            ));
        }
        self.unreadable_part(format)
    }

    /// Like [`Meta::unreadable`], but accepts one part of a dataset packed in parts (what
    /// `pack merge` reads).
    pub fn unreadable_part(&self, format: &str) -> Option<String> {
        if self.format != format || !(1..=FORMAT_VERSION).contains(&self.version) {
            return Some(format!(
                "metadata says format {:?} version {}; this reader reads {format} versions 1 to {FORMAT_VERSION} (upgrade imgpack-reader for newer ones)",
                self.format, self.version
            ));
        }
        match self.checksum.as_deref() {
            Some(algorithm) if algorithm != crate::checksum::ALGORITHM => Some(format!(
                "metadata says checksum {algorithm:?}; this reader knows only {:?} (upgrade imgpack-reader)",
                crate::checksum::ALGORITHM
            )),
            _ => None,
        }
    }
}

/// Deserializes `key_width`, refusing widths `pack` never writes. The check lives here, in the
/// one type every reader of the metadata goes through (this crate's readers and `pack verify`
/// alike), because every read formats a key of this width: a corrupt `key_width` of 10^9 would
/// make each read allocate a gigabyte, and one below [`MIN_KEY_WIDTH`] names keys that were
/// never written.
fn key_width_in_range<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let width = u64::deserialize(deserializer)?;
    match usize::try_from(width) {
        Ok(width) if (MIN_KEY_WIDTH..=MAX_KEY_WIDTH).contains(&width) => Ok(width),
        _ => Err(serde::de::Error::custom(format_args!(
            "key_width {width} is not between {MIN_KEY_WIDTH} and {MAX_KEY_WIDTH}"
        ))),
    }
}

/// One shard of a WebDataset output, as listed in its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// The shard's file name, relative to the dataset directory, e.g. `shard-000000.tar`.
    pub name: String,
    /// The index of its first sample.
    pub first: u64,
    /// How many samples it holds (samples `first .. first + samples`).
    pub samples: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// The CRC-32 (IEEE, as `zlib.crc32`) of the whole file, tar headers, padding and end
    /// blocks included: computed while the shard is written, at memory speed. Present from
    /// format version 3 on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<u32>,
    /// The MD5 of the whole file, lower-case hex (as `wids` records it): always present up to
    /// format version 2, and from version 3 only when packed with `--md5` (it cost about half
    /// of packing's CPU time, and `wids` does not check it when reading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5: Option<String>,
}

/// Where a dataset's samples came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The kind of source: `imagefolder`.
    pub kind: String,
    /// The source root as given on the command line.
    pub root: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_json(key_width: &str) -> String {
        format!(
            r#"{{"format":"imgpack-lmdb","version":2,"samples":1,"key_width":{key_width},"classes":[],"fields":[],
                "source":{{"kind":"imagefolder","root":"x"}},"options":{{}},"tool":"t"}}"#
        )
    }

    #[test]
    fn key_widths_pack_never_writes_are_refused() {
        assert_eq!(serde_json::from_str::<Meta>(&meta_json("8")).unwrap().key_width, 8);
        assert_eq!(serde_json::from_str::<Meta>(&meta_json("20")).unwrap().key_width, 20);
        for bad in ["1000000000", "21", "7", "0", "18446744073709551615", "-1", "8.5", "\"8\""] {
            let err = serde_json::from_str::<Meta>(&meta_json(bad)).unwrap_err().to_string();
            assert!(err.contains("key_width") || err.contains("invalid"), "{bad}: {err}");
        }
        let err = serde_json::from_str::<Meta>(&meta_json("1000000000")).unwrap_err().to_string();
        assert!(err.contains("key_width 1000000000 is not between 8 and 20"), "{err}");
    }
}
