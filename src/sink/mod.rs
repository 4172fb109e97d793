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

use imgpack_reader::Meta;

use crate::Result;

/// One sample ready to store: its key and its fields sorted by extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedSample {
    /// The sample key (zero-padded index).
    pub key: String,
    /// `(extension, bytes)` pairs, sorted by extension.
    pub fields: Vec<(String, Vec<u8>)>,
}

impl PackedSample {
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

/// An output format.
pub trait Sink {
    /// Stores a batch of samples, in order, after every sample written before.
    fn write_batch(&mut self, batch: &[PackedSample]) -> Result<()>;

    /// Writes the metadata, makes everything durable and publishes the output.
    fn finish(self: Box<Self>, meta: &Meta) -> Result<Finished>;
}
