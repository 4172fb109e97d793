//! Outputs: where packed samples go.
//!
//! Every output format implements [`Sink`]: samples arrive in key order, in batches, from one
//! thread; [`Sink::finish`] is required and is where the output becomes real — it writes the
//! metadata, syncs, and publishes atomically. Dropping a sink without finishing leaves only a
//! temporary that no reader mistakes for a dataset (tar-rs's `Builder::finish` and zstd's
//! "don't forget to call finish()" are the same contract).

pub mod imagefolder;
pub mod lmdb;
pub mod webdataset;

use std::path::PathBuf;

use imgpack_reader::{Meta, ShardInfo};

use crate::Result;

/// One sample ready to store: its key and its fields sorted by extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedSample {
    /// The sample key (zero-padded index).
    pub key: String,
    /// `(extension, bytes)` pairs, sorted by extension.
    pub fields: Vec<(String, Vec<u8>)>,
    /// The CRC-32 of each field's bytes, in the same order, when already computed — the
    /// pipeline does it on its worker threads, off the one writer thread. Empty: the sink
    /// computes them.
    pub crcs: Vec<u32>,
}

impl PackedSample {
    /// The CRC-32 of field `i`'s bytes.
    pub fn field_crc(&self, i: usize) -> u32 {
        self.crcs.get(i).copied().unwrap_or_else(|| crc32fast::hash(&self.fields[i].1))
    }

    /// The CRC-32 of all the fields' bytes in order, from the fields' own CRCs.
    pub fn crc(&self) -> u32 {
        let mut all = crc32fast::Hasher::new();
        for (i, (_, bytes)) in self.fields.iter().enumerate() {
            all.combine(&crc32fast::Hasher::new_with_initial_len(self.field_crc(i), bytes.len() as u64));
        }
        all.finalize()
    }

    /// The total size of the fields.
    pub fn bytes(&self) -> u64 {
        self.fields.iter().map(|(_, b)| b.len() as u64).sum()
    }
}

/// What a finished sink produced.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The published output path.
    pub path: PathBuf,
    /// Bytes the output occupies.
    pub bytes: u64,
    /// Things the sink noticed that the user should know (e.g. an oversized sample).
    pub warnings: Vec<String>,
}

/// How far a sink's output is durable: the point a resumed run continues from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Durable {
    /// Samples durable, counted from the first.
    pub samples: u64,
    /// WebDataset: the finished and synced shards, with their MD5s.
    pub shards: Vec<ShardInfo>,
    /// WebDataset in a store: the shards' ETags, in order.
    pub etags: Vec<String>,
}

/// An output format.
pub trait Sink {
    /// Stores a batch of samples, in order, after every sample written before.
    fn write_batch(&mut self, batch: &[PackedSample]) -> Result<()>;

    /// Makes durable what is cheap to make durable now — or, with `now`, everything that can
    /// be (a shard still being written never is) — and returns the new durable point if it
    /// moved since the last call. Outputs that cannot be resumed return `None`.
    fn checkpoint(&mut self, now: bool) -> Result<Option<Durable>> {
        let _ = now;
        Ok(None)
    }

    /// Writes the metadata, makes everything durable and publishes the output.
    fn finish(self: Box<Self>, meta: &Meta) -> Result<Finished>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_crc_combines_its_fields_crcs_whether_given_or_not() {
        let fields = vec![("cls".to_string(), b"3".to_vec()), ("jpg".to_string(), vec![7u8; 10_000])];
        let whole = crc32fast::hash(&[&b"3"[..], &[7u8; 10_000]].concat());
        let computed = PackedSample { key: "00000000".into(), fields: fields.clone(), crcs: Vec::new() };
        assert_eq!(computed.crc(), whole);
        let crcs = fields.iter().map(|(_, b)| crc32fast::hash(b)).collect();
        let given = PackedSample { key: "00000000".into(), fields, crcs };
        assert_eq!(given.crc(), whole);
    }
}
