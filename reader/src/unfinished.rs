//! Unfinished runs: the name that marks a `pack` run's directory as not yet published, and the
//! refusal every reader gives such a directory.
//!
//! It is a module of its own because both the format readers ([`crate::lmdb`],
//! [`crate::webdataset`]) and the format detection above them ([`crate::open`]) need it: kept in
//! either, it made the other import back.

use std::path::Path;

use crate::{Error, Result};

/// The end of the name of the directory a `pack` run writes into (`.NAME.imgpack-tmp` beside its
/// output `NAME`) until it renames it into place. Just before that rename the directory holds a
/// complete-looking dataset, so readers refuse any path with this ending: such a directory is an
/// unfinished run by name, whatever it holds.
pub const UNFINISHED_SUFFIX: &str = ".imgpack-tmp";

/// Whether `path` names an unfinished run's directory ([`UNFINISHED_SUFFIX`]).
pub fn is_unfinished(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name.as_encoded_bytes().ends_with(UNFINISHED_SUFFIX.as_bytes()))
}

/// Fails with [`Error::NotADataset`] if `path` [`is_unfinished`], saying what to open instead.
pub(crate) fn refuse(path: &Path) -> Result<()> {
    if !is_unfinished(path) {
        return Ok(());
    }
    Err(Error::NotADataset {
        path: path.to_path_buf(),
        reason: "this is the temporary directory of a `pack` run that has not finished (or was interrupted); open the output it is renamed to when done, or continue the run with `pack ... --resume`".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_component_marks_a_run_unfinished() {
        assert!(is_unfinished(Path::new("out/.train.lmdb.imgpack-tmp")));
        assert!(!is_unfinished(Path::new("out/.train.lmdb.imgpack-tmp/part-0000-of-0002")));
        assert!(!is_unfinished(Path::new("out/train.lmdb")));
        assert!(!is_unfinished(Path::new("out/train.imgpack-tmp.d")));
        let err = refuse(Path::new("/d/.x.imgpack-tmp")).unwrap_err().to_string();
        assert!(err.starts_with("/d/.x.imgpack-tmp: ") && err.contains("--resume"), "{err}");
        assert!(refuse(Path::new("/d/x")).is_ok());
    }
}
