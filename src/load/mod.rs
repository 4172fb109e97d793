//! Decoding packed samples into training batches: what a data loader does with a packed dataset.
//!
//! This is the training-time half of imgpack, in Rust so the Python package only binds it
//! (`Dataset.get_batch`, `Loader`): reading, decoding, cropping and resizing run on Rust threads
//! with the GIL released, and a batch comes back as one `N x size x size x 3` `uint8` array.
//! It reuses the writer's decoders, so pixels are torchvision's (`PIL.Image.open(f).convert("RGB")`)
//! and the resize is `pack`'s SIMD one.
//!
//! The steps, one module each:
//!
//! - [`order`]: which samples an epoch visits and in what order, shared between ranks exactly as
//!   torch's `DistributedSampler` shares them.
//! - [`crop`]: which region of each image is kept, torchvision's `RandomResizedCrop` or the
//!   evaluation centre crop, from a per-sample seed ([`seed`]), so it is the same on every run and
//!   thread count.
//! - [`decode`]: one sample to one image, decoding only the crop's window of a JPEG, at reduced
//!   DCT scale when the window is large (`jpeg`); decoded `npy` datasets (`npy`) are cropped and
//!   resized without decoding.
//! - [`batch`]: many samples in parallel into one array; [`loader`]: the epoch loop, decoding
//!   the next batches on a background thread while the caller trains.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use imgpack::load::{Loader, LoaderOptions};
//!
//! let dataset = Arc::new(imgpack_reader::open("train.lmdb")?);
//! let mut loader = Loader::new(dataset, LoaderOptions { batch_size: 128usize.try_into()?, ..LoaderOptions::default() })?;
//! for epoch in 0..90 {
//!     loader.set_epoch(epoch);
//!     while let Some(batch) = loader.next_batch() {
//!         let batch = batch?;
//!         assert_eq!(batch.images.len(), batch.len() * 224 * 224 * 3);
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod batch;
pub mod crop;
pub mod decode;
mod error;
mod jpeg;
pub mod loader;
mod npy;
pub mod order;
pub mod seed;

pub use batch::{decode_batch, Batch};
pub use crop::{region, Crop, Region};
pub use decode::{decode_crop, decode_full};
pub use error::LoadError;
pub use loader::{Loader, LoaderOptions, PREFETCH};
pub use order::epoch_indices;
pub use seed::{epoch_seed, sample_seed};
