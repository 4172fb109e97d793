//! Integration tests: run the real `pack` binary on temporary trees and read every output
//! back, comparing bytes, labels and counts with the source.

mod util;

mod architecture;
mod bad_input;
mod bench_read;
mod cli;
mod completions;
mod convert;
mod determinism;
mod hostile;
mod io_concurrency;
mod lmdb_roundtrip;
mod parts;
mod plan;
mod resume;
mod signals;
mod store;
mod transcode;
mod verify;
mod webdataset;
