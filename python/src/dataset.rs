//! `RawDataset`: a dataset `pack` wrote, open for reading from Python.
//!
//! The Python class `imgpack.Dataset` wraps it and adds what is Python's business (negative
//! indices, pickling as a path, reopening in a forked worker); this one reads. Every read runs
//! with the GIL released, so Python threads read in parallel; the dataset is `Send + Sync`.

use std::path::PathBuf;
use std::sync::Arc;

use imgpack::load::{self, Crop};
use imgpack_reader::shared::KeepAlive;
use imgpack_reader::Dataset;
use numpy::ndarray::{Array3, ArrayView1};
use numpy::{IntoPyArray, PyArray1, PyArray3};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMemoryView};

use crate::errors::{load_to_py, no_panic, to_py};
use crate::loader::{parse_crop, pool};

/// A dataset open for reading: the Rust handle behind `imgpack.Dataset`.
#[pyclass(frozen, module = "imgpack._imgpack")]
pub struct RawDataset {
    pub(crate) inner: Arc<Dataset>,
    meta_json: String,
}

/// Keeps the memory map under a field's `memoryview` alive: the base object of the NumPy
/// array the view is made from.
#[pyclass(frozen, module = "imgpack._imgpack")]
struct MapKeeper {
    _keep: KeepAlive,
}

/// Opens the LMDB or WebDataset dataset at `path` (an `s3://` one at `endpoint`); see
/// `imgpack.open`.
#[pyfunction]
#[pyo3(signature = (path, verify_checksums = false, endpoint = None))]
pub fn open(
    py: Python<'_>,
    path: PathBuf,
    verify_checksums: bool,
    endpoint: Option<String>,
) -> PyResult<RawDataset> {
    py.detach(|| {
        no_panic("open", || {
            let dataset = imgpack_reader::open_with_endpoint(&path, endpoint.as_deref())
                .and_then(|d| d.verify_checksums(verify_checksums))
                .map_err(to_py)?;
            let meta_json = serde_json::to_string(dataset.meta()).expect("metadata serialises");
            Ok(RawDataset { inner: Arc::new(dataset), meta_json })
        })
    })
}

#[pymethods]
impl RawDataset {
    fn __len__(&self) -> usize {
        usize::try_from(self.inner.len()).unwrap_or(usize::MAX)
    }

    /// Class names in class-index order.
    #[getter]
    fn classes(&self) -> Vec<String> {
        self.inner.classes().to_vec()
    }

    /// The dataset metadata as JSON (the `__meta__` record / `imgpack.json`).
    #[getter]
    fn meta_json(&self) -> &str {
        &self.meta_json
    }

    /// `"lmdb"` or `"webdataset"`.
    #[getter]
    fn format(&self) -> &'static str {
        match &*self.inner {
            Dataset::Lmdb(_) => "lmdb",
            Dataset::WebDataset(_) | Dataset::Remote(_) => "webdataset",
            _ => "unknown",
        }
    }

    /// Sample `index` (0 <= index < len) as `(key, label, path, [(ext, memoryview), ...])`.
    /// The views point into the memory map, read-only, and keep it mapped while they live.
    fn get<'py>(&self, py: Python<'py>, index: u64) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let (shared, label, path) = py.detach(|| {
            no_panic("get", || {
                let shared = self.inner.get_shared(index).map_err(to_py)?;
                let sample = shared.sample();
                let label = sample.label().map_err(to_py)?;
                let path = sample.info().map_err(to_py)?.path;
                Ok((shared, label, path))
            })
        })?;
        let keeper = Bound::new(py, MapKeeper { _keep: shared.keep_alive() })?.into_any();
        let mut fields = Vec::with_capacity(3);
        for (ext, data) in shared.fields() {
            fields.push((ext.to_string(), read_only_view(py, data, &keeper)?));
        }
        (shared.key.clone(), label, path, fields).into_pyobject(py)
    }

    /// Every sample's label and source path (relative to the source root), in index order, in
    /// one pass that copies no image bytes: what `imgpack.torch.ImageFolder` lists as `samples`.
    fn scan<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyArray1<i64>>, Vec<String>)> {
        let (labels, paths) = py.detach(|| {
            no_panic("scan", || {
                let capacity = usize::try_from(self.inner.len()).unwrap_or(0);
                let (mut labels, mut paths) = (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
                self.inner
                    .scan(|sample| {
                        labels.push(i64::from(sample.label()?));
                        paths.push(sample.info()?.path);
                        Ok(())
                    })
                    .map_err(to_py)?;
                Ok((labels, paths))
            })
        })?;
        Ok((labels.into_pyarray(py), paths))
    }

    /// Sample `index`'s image decoded at full size: a `[H, W, 3]` uint8 RGB array with the
    /// pixels Pillow's `Image.open(...).convert("RGB")` gives.
    fn decode<'py>(&self, py: Python<'py>, index: u64) -> PyResult<Bound<'py, PyArray3<u8>>> {
        let (width, height, pixels) = py.detach(|| {
            no_panic("decode", || {
                let sample = self.inner.get_shared(index).map_err(to_py)?;
                let borrowed = sample.sample();
                let (ext, bytes) = borrowed.payload().ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "{}: sample {} has no image or pixels field",
                        self.inner.path().display(),
                        sample.key
                    ))
                })?;
                load::decode_full(ext, bytes).map_err(|reason| {
                    PyValueError::new_err(format!(
                        "{}: sample {} cannot be decoded: {reason}",
                        self.inner.path().display(),
                        sample.key
                    ))
                })
            })
        })?;
        let shape = (height as usize, width as usize, 3);
        let array = Array3::from_shape_vec(shape, pixels)
            .map_err(|e| PyValueError::new_err(format!("decoded pixels do not fill {shape:?}: {e}")))?;
        Ok(array.into_pyarray(py))
    }

    /// Decodes the samples `indices` into one `[N, size, size, 3]` uint8 batch and their
    /// labels; see `imgpack.Dataset.get_batch`.
    #[pyo3(signature = (indices, size, crop, scale, ratio, seed, epoch, threads))]
    #[allow(clippy::too_many_arguments)]
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<u64>,
        size: u32,
        crop: &str,
        scale: (f64, f64),
        ratio: (f64, f64),
        seed: u64,
        epoch: u64,
        threads: Option<usize>,
    ) -> PyResult<crate::loader::PyBatch<'py>> {
        let crop: Crop = parse_crop(crop, scale, ratio)?;
        let pool = pool(threads)?;
        let batch = py.detach(|| {
            no_panic("get_batch", || {
                load::decode_batch(&self.inner, &indices, &crop, size, seed, epoch, &pool).map_err(load_to_py)
            })
        })?;
        crate::loader::batch_to_py(py, batch)
    }

    fn __repr__(&self) -> String {
        format!(
            "<imgpack dataset {} ({}, {} samples)>",
            self.inner.path().display(),
            self.format(),
            self.inner.len()
        )
    }
}

/// A read-only `memoryview` of `data` (which lies in a map `keeper` keeps alive), made through
/// a NumPy array whose base is `keeper`: the limited API of CPython 3.9 cannot export a buffer
/// from a Rust object, but NumPy can, and it holds its base for as long as any view exists.
fn read_only_view<'py>(
    py: Python<'py>,
    data: &[u8],
    keeper: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyMemoryView>> {
    let view = ArrayView1::from(data);
    // SAFETY: `data` lies in a read-only map that `keeper` keeps mapped and unchanged for as
    // long as the array (its base is `keeper`) lives; the array is made read-only at once, so
    // nothing writes through it.
    let array = unsafe { PyArray1::<u8>::borrow_from_array(&view, keeper.clone()) };
    let kwargs = PyDict::new(py);
    kwargs.set_item("write", false)?;
    array.call_method("setflags", (), Some(&kwargs))?;
    PyMemoryView::from(array.as_any())
}
