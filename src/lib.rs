//! imgpack: pack image datasets into few large files that training jobs read fast.
//!
//! A data loader that opens hundreds of thousands of small files waits on per-file open and
//! seek costs, and the GPU waits with it. `pack` turns an ImageFolder tree into an LMDB
//! database (memory-mapped, microsecond random reads) whose layout is owned by the
//! [`imgpack_reader`] crate.
//!
//! The pipeline reads as its modules: [`source`] finds the samples (sorted exactly as
//! torchvision's `ImageFolder` sorts them), [`transcode`] checks or converts each image, a
//! [`sink`] writes them in order, and [`pipeline`] runs the stages in parallel with bounded
//! memory and produces a [`report::Report`]. [`config`] turns command-line options into a
//! validated plan before any work starts, and [`output`] publishes results atomically.
//! [`plan`], [`parts`] and [`merge`] split one run across the machines of a cluster job.
//! [`bench`](mod@bench) is `pack bench-read`: random-read latency of trees and packed datasets.

pub mod bench;
pub mod cluster;
pub mod config;
pub mod encoding;
mod error;
pub mod fs;
pub mod interrupt;
pub mod merge;
pub mod output;
pub mod parts;
pub mod pipeline;
pub mod plan;
pub mod report;
pub mod resume;
mod shuffle;
pub mod sink;
pub mod size;
pub mod source;
pub mod transcode;
pub mod verify;

pub use config::{OnError, OutputFormat, PackConfig};
pub use error::{Error, Result};
pub use report::Report;

/// The tool name and version recorded in every dataset's metadata.
pub const TOOL: &str = concat!("imgpack ", env!("CARGO_PKG_VERSION"));
