//! `imgpack._imgpack`: the Rust side of the Python package.
//!
//! Thin on purpose, like Hugging Face `tokenizers`' bindings: the format and every check live in
//! `imgpack-reader`, decoding and batching in `imgpack::load`, the command line in
//! `imgpack::cli`. This crate only converts at the boundary — Rust errors into the Python
//! exceptions a Python user expects (`errors`), mapped bytes into `memoryview`s that keep
//! their map alive (`dataset`), pixel buffers into NumPy arrays without a copy — and releases
//! the GIL around every read and decode, so several Python threads read at once.
//!
//! No Rust panic crosses into Python: every call that does work runs under
//! `errors::no_panic`, which turns a panic into a `RuntimeError` naming it as a bug.

mod dataset;
mod errors;
mod loader;

use std::ffi::OsString;

use pyo3::prelude::*;

/// Runs the `pack` command line with `argv` (program name first) and returns its exit code:
/// the `pack` entry point that `pip install imgpack` puts on PATH.
#[pyfunction]
fn pack_main(py: Python<'_>, argv: Vec<OsString>) -> PyResult<u8> {
    py.detach(|| errors::no_panic("pack", || Ok(imgpack::cli::main(argv))))
}

/// The extension module.
#[pymodule]
fn _imgpack(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pack_main, m)?)?;
    m.add_function(wrap_pyfunction!(dataset::open, m)?)?;
    m.add_class::<dataset::RawDataset>()?;
    m.add_class::<loader::RawLoader>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The fields that hold an encoded image, from the one list the format has (the reader's
    // `ImageFormat`), so that `Sample.image` finds every format pack stores and nothing else.
    let image_fields: Vec<&str> = imgpack_reader::ImageFormat::ALL.iter().map(|f| f.extension()).collect();
    m.add("IMAGE_FIELDS", pyo3::types::PyTuple::new(m.py(), image_fields)?)?;
    Ok(())
}
