//! The `wids` shard index (`shardindex.json`): the JSON file that webdataset's `wids` reads to
//! find every shard and its sample count, which is what lets it index samples at random.

use serde::{Deserialize, Serialize};

use crate::ShardInfo;

/// The `wids` shard index file.
pub const WIDS_INDEX_FILE: &str = "shardindex.json";

/// The `wids` shard index (`shardindex.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WidsIndex {
    /// Always `wids-shard-index-v1`.
    #[serde(rename = "__kind__")]
    pub kind: String,
    /// Always 1.
    pub wids_version: u32,
    /// The shards in order.
    pub shardlist: Vec<WidsShard>,
}

impl WidsIndex {
    /// The index of these shards, as `pack` writes it.
    pub fn of(shards: &[ShardInfo]) -> WidsIndex {
        WidsIndex {
            kind: "wids-shard-index-v1".into(),
            wids_version: 1,
            shardlist: shards
                .iter()
                .map(|s| WidsShard {
                    url: s.name.clone(),
                    nsamples: s.samples,
                    filesize: s.bytes,
                    md5sum: s.md5.clone(),
                })
                .collect(),
        }
    }
}

/// One shard in the `wids` index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WidsShard {
    /// The shard path relative to the JSON file.
    pub url: String,
    /// Samples in the shard.
    pub nsamples: u64,
    /// The shard's size in bytes.
    pub filesize: u64,
    /// MD5 of the shard, lower-case hex, when the dataset was packed with `--md5`; left out
    /// otherwise (`wids` reads shards without it: `ShardListDataset` never checks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5sum: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_has_the_field_names_wids_reads() {
        let shard = ShardInfo {
            name: "shard-000000.tar".into(),
            first: 0,
            samples: 3,
            bytes: 10_240,
            crc32: Some(7),
            md5: Some("ab12".into()),
        };
        let json = serde_json::to_value(WidsIndex::of(std::slice::from_ref(&shard))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "__kind__": "wids-shard-index-v1",
                "wids_version": 1,
                "shardlist": [{"url": "shard-000000.tar", "nsamples": 3, "filesize": 10240, "md5sum": "ab12"}],
            })
        );
        assert_eq!(serde_json::from_value::<WidsIndex>(json).unwrap().shardlist[0].nsamples, 3);
        // Without --md5 there is no md5sum at all (not an empty one, which wids would check).
        let json = serde_json::to_value(WidsIndex::of(&[ShardInfo { md5: None, ..shard }])).unwrap();
        assert_eq!(
            json["shardlist"][0],
            serde_json::json!({"url": "shard-000000.tar", "nsamples": 3, "filesize": 10240})
        );
    }
}
