//! `RawLoader`, the Rust side of `imgpack.Loader`, and what batch decoding needs at the
//! boundary: the crop option, the decoding threads, batches as NumPy arrays.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use imgpack::load::{Batch, Crop, Loader, LoaderOptions};
use numpy::ndarray::Array4;
use numpy::{IntoPyArray, PyArray1, PyArray4};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::dataset::RawDataset;
use crate::errors::{load_to_py, no_panic};

/// The crop named `crop` (`"random-resized"` or `"center"`), with RandomResizedCrop's
/// `scale` and `ratio` ranges for the first.
pub fn parse_crop(crop: &str, scale: (f64, f64), ratio: (f64, f64)) -> PyResult<Crop> {
    let valid = |(lo, hi): (f64, f64)| lo > 0.0 && lo <= hi && hi.is_finite();
    match crop {
        "random-resized" => {
            if !valid(scale) || scale.1 > 1.0 {
                return Err(PyValueError::new_err(format!(
                    "scale={scale:?}: pass (min, max) with 0 < min <= max <= 1, e.g. (0.08, 1.0)"
                )));
            }
            if !valid(ratio) {
                return Err(PyValueError::new_err(format!(
                    "ratio={ratio:?}: pass (min, max) with 0 < min <= max, e.g. (3/4, 4/3)"
                )));
            }
            Ok(Crop::RandomResized { scale, ratio })
        }
        "center" => Ok(Crop::Center),
        other => Err(PyValueError::new_err(format!("crop={other:?}: pass \"random-resized\" or \"center\""))),
    }
}

/// The decoding thread pool with `threads` threads (default: one per core), made once per
/// process and size. Per process, because a pool's threads do not survive `fork`: a
/// DataLoader worker forked from a process that used a pool gets a pool of its own.
pub fn pool(threads: Option<usize>) -> PyResult<Arc<rayon::ThreadPool>> {
    /// By (process id, threads).
    type Pools = HashMap<(u32, usize), Arc<rayon::ThreadPool>>;
    static POOLS: Mutex<Option<Pools>> = Mutex::new(None);
    let threads = match threads {
        None => imgpack::pack::config::all_cores().get(),
        Some(0) => return Err(PyValueError::new_err("threads=0: pass 1 or more, or None for one per core")),
        Some(n) => n,
    };
    let key = (std::process::id(), threads);
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    let pools = pools.get_or_insert_with(HashMap::new);
    pools.retain(|(pid, _), _| *pid == key.0);
    if let Some(pool) = pools.get(&key) {
        return Ok(pool.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("imgpack-decode-{i}"))
        .build()
        .map_err(|e| {
            PyValueError::new_err(format!("cannot start {threads} decoding threads: {e}; pass fewer"))
        })?;
    let pool = Arc::new(pool);
    pools.insert(key, pool.clone());
    Ok(pool)
}

/// A batch as `([N, size, size, 3] uint8, [N] int64)` NumPy arrays that own the Rust buffers
/// (no copy).
pub fn batch_to_py(py: Python<'_>, batch: Batch) -> PyResult<PyBatch<'_>> {
    let side = batch.size as usize;
    let n = batch.labels.len();
    let images = Array4::from_shape_vec((n, side, side, 3), batch.images)
        .map_err(|e| PyValueError::new_err(format!("batch buffer does not fill {n} images: {e}")))?;
    Ok((images.into_pyarray(py), PyArray1::from_vec(py, batch.labels)))
}

/// A batch on the Python side: images `[N, H, W, 3]` uint8 and labels `[N]` int64.
pub type PyBatch<'py> = (Bound<'py, PyArray4<u8>>, Bound<'py, PyArray1<i64>>);

/// Batches of one dataset, decoded ahead on threads of the loader's own.
#[pyclass(frozen, module = "imgpack._imgpack")]
pub struct RawLoader {
    inner: Mutex<Loader>,
}

#[pymethods]
impl RawLoader {
    #[new]
    #[pyo3(signature = (dataset, batch_size, shuffle, seed, drop_last, crop, size, scale, ratio, threads, rank, world_size))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        dataset: &RawDataset,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        crop: &str,
        size: u32,
        scale: (f64, f64),
        ratio: (f64, f64),
        threads: Option<usize>,
        rank: u64,
        world_size: u64,
    ) -> PyResult<RawLoader> {
        let batch_size = NonZeroUsize::new(batch_size)
            .ok_or_else(|| PyValueError::new_err("batch_size=0: pass 1 or more"))?;
        if world_size == 0 || rank >= world_size {
            return Err(PyValueError::new_err(format!(
                "rank={rank}, world_size={world_size}: pass 0 <= rank < world_size"
            )));
        }
        if size == 0 {
            return Err(PyValueError::new_err("size=0: pass the output side in pixels, e.g. 224"));
        }
        let threads = match threads {
            None => imgpack::pack::config::all_cores(),
            Some(n) => NonZeroUsize::new(n).ok_or_else(|| {
                PyValueError::new_err("threads=0: pass 1 or more, or None for one per core")
            })?,
        };
        let options = LoaderOptions {
            batch_size,
            shuffle,
            seed,
            drop_last,
            crop: parse_crop(crop, scale, ratio)?,
            size,
            threads,
            rank,
            world_size,
        };
        let loader = no_panic("Loader", || Loader::new(dataset.inner.clone(), options).map_err(load_to_py))?;
        Ok(RawLoader { inner: Mutex::new(loader) })
    }

    /// Starts epoch `epoch` (its own permutation): the next `next_batch` is its first batch.
    fn set_epoch(&self, epoch: u64) {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).set_epoch(epoch);
    }

    /// The number of batches in an epoch (of this rank's share).
    fn __len__(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The next batch of the epoch, or `None` when it is over.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<PyBatch<'py>>> {
        let next = py.detach(|| {
            no_panic("Loader", || {
                let mut loader = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
                loader.next_batch().transpose().map_err(load_to_py)
            })
        })?;
        next.map(|batch| batch_to_py(py, batch)).transpose()
    }
}
