//! The ImageFolder sink: unpacks samples back into `TREE/<source path relative to SRC>`.
//!
//! Each sample's `json` field says where it came from; the file is written there with its
//! stored bytes, so packing a tree and unpacking it gives the same files. Every class folder is
//! created, empty ones included, so `ImageFolder(TREE)` gives the same class indices. A path that
//! would land outside `TREE` (`..`, an absolute path, an empty component) is refused: a dataset
//! from elsewhere must never be able to write where it likes.

use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use imgpack_reader::format::JSON_FIELD;
use imgpack_reader::{Meta, SampleInfo};

use super::{Finished, PackedSample, Sink};
use crate::pack::staged::Staged;
use crate::{Error, Result};

/// Writes an ImageFolder tree.
pub struct ImageFolderSink {
    staged: Staged,
    bytes: u64,
}

impl ImageFolderSink {
    /// Starts a tree at `target`, with a folder for every class.
    pub fn create(target: &Path, overwrite: bool, classes: &[String]) -> Result<ImageFolderSink> {
        let staged = Staged::create_dir(target, overwrite)?;
        for class in classes {
            let dir = safe_relative(class.as_bytes())
                .ok()
                .filter(|p| p.components().count() == 1)
                .ok_or_else(|| Error::BadOutput {
                    path: target.to_path_buf(),
                    reason: format!("class name {class:?} is not a plain folder name; refusing to unpack"),
                })?;
            let dir = staged.path().join(dir);
            fs::create_dir(&dir).map_err(Error::io(&dir))?;
        }
        Ok(ImageFolderSink { staged, bytes: 0 })
    }

    fn write_sample(&mut self, sample: &PackedSample) -> Result<()> {
        let field = |ext: &str| sample.fields.iter().find(|(e, _)| e == ext).map(|(_, d)| d);
        let bad = |reason: String| Error::BadSample { path: PathBuf::from(&sample.key), reason };
        let info: SampleInfo = field(JSON_FIELD)
            .and_then(|json| serde_json::from_slice(json).ok())
            .ok_or_else(|| bad("no readable json field, so its source path is unknown".into()))?;
        let rel = info.path_bytes().map_err(&bad)?;
        let rel = safe_relative(&rel).map_err(bad)?;
        let image = sample
            .fields
            .iter()
            .find(|(ext, _)| imgpack_reader::ImageFormat::from_extension(ext).is_some())
            .map(|(_, data)| data)
            .ok_or_else(|| Error::BadSample { path: rel.clone(), reason: "no image field".into() })?;
        let dest = self.staged.path().join(&rel);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(Error::io(parent))?;
        }
        let mut file = fs::OpenOptions::new().write(true).create_new(true).open(&dest).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Error::BadSample { path: rel.clone(), reason: "two samples have this source path".into() }
            } else {
                Error::Io { path: dest.clone(), source: e }
            }
        })?;
        file.write_all(image).map_err(Error::io(&dest))?;
        self.bytes += image.len() as u64;
        Ok(())
    }
}

impl Sink for ImageFolderSink {
    fn write_batch(&mut self, batch: &[PackedSample]) -> Result<()> {
        batch.iter().try_for_each(|s| self.write_sample(s))
    }

    fn finish(self: Box<Self>, _meta: &Meta) -> Result<Finished> {
        let path = self.staged.target().to_path_buf();
        self.staged.publish()?;
        Ok(Finished { path, bytes: self.bytes, warnings: Vec::new() })
    }
}

/// A relative path that stays inside the directory it is joined to: `/`-separated, no empty,
/// `.` or `..` component, no leading `/`, no NUL. The error says why not.
pub fn safe_relative(path: &[u8]) -> std::result::Result<PathBuf, String> {
    let shown = String::from_utf8_lossy(path);
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.starts_with(b"/") {
        return Err(format!("absolute path {shown:?} would be written outside the output; refused"));
    }
    if path.contains(&0) {
        return Err(format!("path {shown:?} contains a NUL byte; refused"));
    }
    for part in path.split(|&b| b == b'/') {
        if part.is_empty() || part == b"." || part == b".." {
            return Err(format!(
                "path {shown:?} has a {:?} component and could escape the output; refused",
                String::from_utf8_lossy(part)
            ));
        }
    }
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_escape_are_refused() {
        assert!(safe_relative(b"cat/x.jpg").is_ok());
        assert!(safe_relative(b"cat/.hidden.jpg").is_ok());
        assert!(safe_relative(b"cat/a\xffb.jpg").is_ok());
        for bad in
            [&b"../x.jpg"[..], b"/etc/passwd", b"cat/../../x", b"cat//x", b"./x", b"", b"a\0b", b"cat/.."]
        {
            assert!(safe_relative(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
