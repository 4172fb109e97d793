//! `pack SRC --to FORMAT`: the run from a source to a published output.
//!
//! [`config`] says what to do, [`pipeline`] lists, transcodes and writes the samples in order
//! (reading them ahead with [`readahead`], transforming them in chunks with [`chunks`]),
//! [`staged`] publishes the output atomically, [`resume`] checkpoints an interrupted run and
//! continues it, and [`report`] is what the run tells the user.

pub mod chunks;
pub mod config;
pub mod pipeline;
pub mod readahead;
pub mod recorded;
pub mod report;
pub mod resume;
pub mod staged;

pub use pipeline::pack;
