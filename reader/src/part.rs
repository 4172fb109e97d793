//! Parts: one dataset packed by N separate runs (`pack PLAN --part K/N`), then merged
//! (`pack merge OUT`).
//!
//! Each part is a directory `OUT/part-KKKK-of-NNNN` (K counted from 0) holding an ordinary
//! LMDB or WebDataset output (shards named with [`shard_prefix`]) of a contiguous range of the plan's samples, whose metadata carries
//! a [`PartInfo`]. A part is not a dataset on its own: its keys start where its range starts
//! (the plan index of its first sample), so readers refuse it ([`crate::Meta::unreadable`]) and
//! point at `pack merge`, which checks that the N parts belong together and writes the
//! dataset-level files. A merged WebDataset keeps its shards in the part directories and names
//! them `part-KKKK-of-NNNN/shard-pKKKK-000000.tar` in its metadata and `shardindex.json`
//! ([`crate::webdataset::is_shard_name`] accepts exactly that one level of directory).

use serde::{Deserialize, Serialize};

/// What makes a dataset's metadata the metadata of one part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartInfo {
    /// K: which part this is, from 0.
    pub index: u64,
    /// N: how many parts the plan was split into.
    pub count: u64,
    /// The MD5 of the plan file, lower-case hex: parts of one dataset come from one plan.
    pub plan: String,
    /// How many samples the whole plan lists.
    pub plan_samples: u64,
    /// The plan index of the part's first sample; the part's packed samples have the keys
    /// `first`, `first + 1`, ... with no gap (a skipped file takes no key).
    pub first: u64,
    /// How many planned samples the part covers (`first .. first + planned` of the plan),
    /// packed or skipped.
    pub planned: u64,
    /// The planned samples the part could not pack, in plan order.
    #[serde(default)]
    pub skipped: Vec<SkippedSample>,
}

/// A planned sample a part skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedSample {
    /// Its index in the plan.
    pub index: u64,
    /// Its path relative to the source root (lossy if the path is not UTF-8).
    pub path: String,
    /// Why it was not packed.
    pub reason: String,
}

/// The directory name of part `index` of `count`: `part-0002-of-0004`. Both numbers take the
/// same width, at least 4 digits, so the parts of one dataset sort by name in part order.
pub fn dir_name(index: u64, count: u64) -> String {
    let width = count.to_string().len().max(4);
    format!("part-{index:0width$}-of-{count:0width$}")
}

/// The shard name prefix part `index` of `count` writes with the dataset's `prefix`:
/// `shard-p0002`, so its shards are `shard-p0002-000000.tar`, ... File names then differ
/// across parts, not just their directories: a cache keyed by file name (`wids`' `cache_dir`)
/// cannot mix up two parts' `shard-000000.tar`.
pub fn shard_prefix(prefix: &str, index: u64, count: u64) -> String {
    let width = count.to_string().len().max(4);
    format!("{prefix}-p{index:0width$}")
}

/// The `(index, count)` a part directory name stands for, if it is exactly what [`dir_name`]
/// writes.
pub fn parse_dir_name(name: &str) -> Option<(u64, u64)> {
    let (index, count) = name.strip_prefix("part-")?.split_once("-of-")?;
    let number = |s: &str| s.bytes().all(|b| b.is_ascii_digit()).then(|| s.parse::<u64>().ok()).flatten();
    let (index, count) = (number(index)?, number(count)?);
    (index < count && dir_name(index, count) == name).then_some((index, count))
}

/// Whether the directory `path` holds part directories (merged or not).
pub fn holds_parts(path: &std::path::Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|entries| {
        entries.flatten().any(|e| e.file_name().to_str().and_then(parse_dir_name).is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_sort_in_part_order() {
        assert_eq!(dir_name(2, 4), "part-0002-of-0004");
        assert_eq!(dir_name(7, 12345), "part-00007-of-12345");
        assert_eq!(parse_dir_name("part-0002-of-0004"), Some((2, 4)));
        let names: Vec<String> = (0..12).map(|k| dir_name(k, 12)).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        for bad in ["part-4-of-4", "part-0004-of-0004", "part-2-of-0004", "part-0002-of-4", "part--of-", "x"]
        {
            assert_eq!(parse_dir_name(bad), None, "{bad}");
        }
    }
}
