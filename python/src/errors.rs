//! Rust errors as the Python exceptions a Python user expects.
//!
//! A missing path is `FileNotFoundError`, an index past the end `IndexError`, a checksum
//! mismatch `imgpack.ChecksumError` (a `ValueError`) naming the sample, a directory that is no
//! dataset (or a damaged one) `ValueError` with the message the CLI prints, a file system or
//! LMDB failure `OSError`. In an object store, a missing bucket is `FileNotFoundError`, refused
//! credentials `PermissionError`, an endpoint that does not answer `ConnectionError`, any other
//! failed request `OSError`. The messages are the reader's own, which name the path and the fix.

use std::panic::{catch_unwind, AssertUnwindSafe};

use imgpack_reader::Error;
use pyo3::exceptions::{
    PyConnectionError, PyFileNotFoundError, PyIndexError, PyOSError, PyPermissionError, PyRuntimeError,
    PyValueError,
};
use pyo3::prelude::*;

pyo3::create_exception!(
    _imgpack,
    ChecksumError,
    PyValueError,
    "A sample's bytes do not have the CRC-32 the dataset recorded: the dataset is damaged. The message names the dataset and the sample key."
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ChecksumError", m.py().get_type::<ChecksumError>())
}

/// The Python exception for a reader error.
pub fn to_py(err: Error) -> PyErr {
    let message = err.to_string();
    match &err {
        Error::Io { path, source } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err((ENOENT, message, path.display().to_string()))
        }
        // As Python's own `open` says it: `[Errno 2] No such file or directory: 'PATH'`.
        Error::NotADataset { path, .. } if !path.exists() && !is_store_path(path) => {
            PyFileNotFoundError::new_err((ENOENT, "No such file or directory", path.display().to_string()))
        }
        Error::Io { .. } | Error::Lmdb { .. } => PyOSError::new_err(message),
        Error::OutOfRange { .. } => PyIndexError::new_err(message),
        Error::Checksum { .. } => ChecksumError::new_err(message),
        Error::NoSuchBucket { .. } => PyFileNotFoundError::new_err(message),
        Error::StoreDenied { .. } => PyPermissionError::new_err(message),
        Error::StoreUnreachable { .. } => PyConnectionError::new_err(message),
        Error::Store { .. } | Error::StoreUploadAborted { .. } => PyOSError::new_err(message),
        _ => PyValueError::new_err(message),
    }
}

/// The Python exception for an error of the batch decoder.
pub fn load_to_py(err: imgpack::load::LoadError) -> PyErr {
    match err {
        imgpack::load::LoadError::Read(err) => to_py(err),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// Whether `path` is an `s3://` location rather than a local path.
fn is_store_path(path: &std::path::Path) -> bool {
    path.to_str().is_some_and(imgpack_reader::store::is_store_url)
}

/// `errno` for "no such file or directory", which `FileNotFoundError` carries (Linux and macOS).
const ENOENT: i32 = 2;

/// Runs `work`, turning a Rust panic into a `RuntimeError` instead of letting it unwind into
/// the interpreter: a panic is a bug in imgpack, and the message says so.
pub fn no_panic<T>(what: &str, work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(PyRuntimeError::new_err(format!(
                "internal error in imgpack while running {what} (a bug; please report it): {detail}"
            )))
        }
    }
}
