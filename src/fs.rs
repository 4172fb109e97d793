//! File-system steps every output shares: temporary names beside a target, durable
//! replacement of a file, syncing a tree, removing whatever is at a path, sizes on disk.
//!
//! Durability here means the POSIX sequence a crash cannot tear: write under a temporary name,
//! `fsync` the file, rename it over the target, `fsync` the directory that holds both.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The temporary name of anything written at `target` before it is complete:
/// `.NAME.imgpack-tmp` beside it. Readers refuse such names
/// ([`imgpack_reader::UNFINISHED_SUFFIX`]), so an interrupted write is never mistaken for data.
pub fn temp_path(target: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(target.file_name().unwrap_or_default());
    name.push(imgpack_reader::UNFINISHED_SUFFIX);
    parent_of(target).join(name)
}

/// The directory that holds `path`: `.` for a bare name.
pub fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Syncs a directory, and everything below it, to disk.
pub fn sync_tree(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(Error::io(dir))? {
        let entry = entry.map_err(Error::io(dir))?;
        let path = entry.path();
        if entry.file_type().map_err(Error::io(&path))?.is_dir() {
            sync_tree(&path)?;
        } else {
            sync_file(&path)?;
        }
    }
    sync_file(dir)
}

/// Syncs one file or directory to disk.
pub fn sync_file(path: &Path) -> Result<()> {
    fs::File::open(path).and_then(|f| f.sync_all()).map_err(Error::io(path))
}

/// Removes whatever is at `path` (a file, a symbolic link or a whole directory); nothing there is
/// not an error.
pub fn remove_any(path: &Path) -> Result<()> {
    match path.symlink_metadata() {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(Error::io(path)),
        Ok(_) => fs::remove_file(path).map_err(Error::io(path)),
        Err(_) => Ok(()),
    }
}

/// The bytes the regular files directly inside `dir` take (what a part or dataset occupies);
/// 0 for what cannot be read.
pub fn disk_usage(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
        })
        .unwrap_or(0)
}

/// The bytes an unprivileged writer can still put on the file system holding `dir`
/// (`statvfs`'s `f_bavail`), or `None` if it cannot be asked.
pub fn free_space(dir: &Path) -> Option<u64> {
    let path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str())).ok()?;
    // SAFETY: statvfs fills the zeroed struct for a NUL-terminated path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(path.as_ptr(), &mut stat) } == 0)
        .then(|| stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Replaces the file at `path` with `bytes` atomically and durably: written beside it under its
/// temporary name ([`temp_path`]), synced, renamed over it, and the directory synced.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let temp = temp_path(path);
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(&temp)?;
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&temp);
        return Err(Error::io(&temp)(e));
    }
    fs::rename(&temp, path).map_err(Error::io(path))?;
    sync_file(&parent_of(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporaries_sit_beside_their_target_under_a_name_readers_refuse() {
        let temp = temp_path(Path::new("out/train.lmdb"));
        assert_eq!(temp, Path::new("out/.train.lmdb.imgpack-tmp"));
        assert!(imgpack_reader::is_unfinished(&temp));
        assert_eq!(temp_path(Path::new("x")), Path::new("./.x.imgpack-tmp"));
    }

    #[test]
    fn replace_file_leaves_only_the_new_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.json");
        fs::write(&path, b"old").unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary left behind");
    }

    #[test]
    fn remove_any_removes_files_trees_and_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("t");
        fs::create_dir_all(tree.join("a/b")).unwrap();
        fs::write(tree.join("a/b/f"), b"x").unwrap();
        assert_eq!(disk_usage(&tree.join("a/b")), 1);
        remove_any(&tree).unwrap();
        remove_any(&tree).unwrap();
        assert!(!tree.exists());
    }
}
