//! imgpack: pack image datasets into few large files that training jobs read fast.
//!
//! A data loader that opens hundreds of thousands of small files waits on per-file open and
//! seek costs, and the GPU waits with it. `pack` turns an ImageFolder tree into an LMDB
//! database (memory-mapped, microsecond random reads) whose layout is owned by the
//! [`imgpack_reader`] crate.
//!
//! The tree is the architecture; each command and each stage has a module named after it:
//!
//! - [`pack`](mod@pack): `pack SRC --to FORMAT`. [`pack::config`] turns options into a validated
//!   configuration before any work starts, [`pack::pipeline`] runs the stages in parallel with
//!   bounded memory, [`pack::staged`] publishes the output atomically, [`pack::resume`]
//!   checkpoints and continues interrupted runs, [`pack::report`] is what the run says.
//! - [`source`]: where samples are listed (an ImageFolder tree sorted exactly as torchvision
//!   sorts it, on disk or under an `s3://` prefix, a packed dataset, a plan file) and loaded
//!   from.
//! - [`transcode`]: what happens to each image (check, decode, resize, encode).
//! - [`sink`]: how samples are written, one module per output format.
//! - [`load`]: training time: decode packed samples into batches (crops, epoch order, prefetch).
//! - [`cluster`]: one plan packed on many machines: [`cluster::split`] cuts the plan into parts,
//!   [`cluster::part`] packs one, [`cluster::merge`] joins them (one module per format).
//! - [`store`]: writing to object storage (`s3://bucket/prefix/`): streamed multipart uploads,
//!   puts and deletes, on the reader crate's client (`imgpack_reader::store`: locations,
//!   settings, typed errors).
//! - [`verify`](mod@verify): `pack verify`, one module per format.
//! - [`inspect`]: `pack info` and `pack ls`, what a dataset holds.
//! - [`bench`](mod@bench): `pack bench-read`, random-read latency of trees and packed datasets.
//! - [`cli`]: the `pack` command line itself (clap definitions, one call per subcommand, the
//!   summary and progress bar), shared by the binary and the Python package's entry point.
//!
//! Small shared pieces sit at the top: [`fs`] (durable file steps), [`encoding`], [`size`],
//! [`interrupt`], and the typed [`Error`].

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod encoding;
mod error;
pub mod fs;
pub mod inspect;
pub mod interrupt;
pub mod load;
pub mod pack;
pub mod progress;
mod shuffle;
pub mod sink;
pub mod size;
pub mod source;
pub mod store;
pub mod transcode;
pub mod verify;

pub use error::{Error, Result};
pub use pack::config::{OnError, OutputFormat, PackConfig};
pub use pack::report::Report;

/// The tool name and version recorded in every dataset's metadata.
pub const TOOL: &str = concat!("imgpack ", env!("CARGO_PKG_VERSION"));
