//! Publishing outputs atomically.
//!
//! A run writes under a temporary name next to the output (`.NAME.imgpack-tmp`) and renames it
//! into place only once everything is written and synced. An interrupted run therefore never
//! leaves anything at the output path that could be mistaken for a complete dataset; what it
//! leaves is visibly temporary. Once a run has written a checkpoint journal there
//! ([`crate::resume`]), the temporary is kept when the run stops early, for `--resume`; the next
//! run without `--resume` clears it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::resume::Journal;
use crate::{Error, Result};

/// An output being written under a temporary name.
#[derive(Debug)]
pub struct Staged {
    target: PathBuf,
    temp: PathBuf,
    overwrite: bool,
    /// Held until the run ends, so a second run cannot write the same output meanwhile.
    _lock: OutputLock,
}

/// A lock on an output: an exclusive `flock` on `.NAME.imgpack-lock` beside it, held by the
/// one run writing it.
///
/// Two runs writing one output — a job submitted twice, a scheduler re-running a task whose
/// first attempt still runs — would otherwise share one temporary directory and could publish
/// a mix of both. The second run fails at once instead. On a file system without locks (some
/// network mounts) runs are not protected, as without this lock. The lock file is removed when
/// the lock is released.
#[derive(Debug)]
pub struct OutputLock {
    file: Option<(fs::File, PathBuf)>,
}

impl OutputLock {
    /// Takes the lock of `target`, or fails naming the run that holds it.
    pub fn acquire(target: &Path) -> Result<OutputLock> {
        let mut name = std::ffi::OsString::from(".");
        name.push(target.file_name().unwrap_or_default());
        name.push(".imgpack-lock");
        let path = parent_of(target).join(name);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(Error::io(&path))?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } == 0
        {
            return Ok(OutputLock { file: Some((file, path)) });
        }
        let error = std::io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Err(Error::Busy { path: target.to_path_buf(), lock: path }),
            Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => Ok(OutputLock { file: None }),
            _ => Err(Error::io(&path)(error)),
        }
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        if let Some((file, path)) = self.file.take() {
            let _ = fs::remove_file(&path);
            drop(file);
        }
    }
}

impl Staged {
    /// Prepares to write `target`: refuses an existing one unless `overwrite`, clears the
    /// leftovers of an interrupted run, and creates the temporary directory.
    pub fn create_dir(target: &Path, overwrite: bool) -> Result<Staged> {
        Ok(Staged::open_dir(target, overwrite, false)?.0)
    }

    /// Like [`Staged::create_dir`], but with `resume` an interrupted run's temporary that holds
    /// a journal is kept and its journal returned. The flag says whether such a temporary was
    /// there and discarded (without `resume`).
    pub fn open_dir(target: &Path, overwrite: bool, resume: bool) -> Result<(Staged, Option<Journal>, bool)> {
        if target.symlink_metadata().is_ok() && !overwrite {
            return Err(Error::OutputExists { path: target.to_path_buf() });
        }
        if target.file_name().is_none() {
            return Err(Error::Usage(format!("-o {}: name a file or directory to create", target.display())));
        }
        let parent = parent_of(target);
        if !parent.is_dir() {
            return Err(Error::Usage(format!(
                "-o {}: parent directory {} does not exist; create it first",
                target.display(),
                parent.display()
            )));
        }
        let lock = OutputLock::acquire(target)?;
        let temp = temp_path(target);
        let journal = if temp.is_dir() { Journal::read(&temp)? } else { None };
        let staged = Staged { target: target.to_path_buf(), temp, overwrite, _lock: lock };
        if resume && journal.is_some() {
            return Ok((staged, journal, false));
        }
        remove_any(&staged.temp)?;
        fs::create_dir(&staged.temp).map_err(Error::io(&staged.temp))?;
        Ok((staged, None, journal.is_some()))
    }

    /// Where to write.
    pub fn path(&self) -> &Path {
        &self.temp
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Syncs every file and directory below the temporary directory, renames it to the target
    /// (replacing an old one) and syncs the parent directory so the rename itself is durable.
    pub fn publish(self) -> Result<()> {
        for name in crate::resume::FILES {
            let path = self.temp.join(name);
            if path.exists() {
                fs::remove_file(&path).map_err(Error::io(&path))?;
            }
        }
        sync_tree(&self.temp)?;
        if self.overwrite && self.target.symlink_metadata().is_ok() {
            let mut old = self.temp.clone().into_os_string();
            old.push("-old");
            let old = PathBuf::from(old);
            remove_any(&old)?;
            fs::rename(&self.target, &old).map_err(Error::io(&self.target))?;
            fs::rename(&self.temp, &self.target).map_err(Error::io(&self.target))?;
            remove_any(&old)?;
        } else {
            fs::rename(&self.temp, &self.target).map_err(Error::io(&self.target))?;
        }
        sync_file(&parent_of(&self.target))
    }
}

impl Drop for Staged {
    /// A run that stops with an error removes its temporary, unless it holds a checkpoint
    /// journal (then it is kept for `--resume`); after [`Staged::publish`] there is nothing left
    /// at the temporary path. (A killed process runs no destructor; the next run deals with
    /// what it left.)
    fn drop(&mut self) {
        if !self.temp.join(crate::resume::JOURNAL_FILE).exists() {
            let _ = remove_any(&self.temp);
        }
    }
}

/// The temporary directory a run writing `target` uses: `.NAME.imgpack-tmp` beside it.
pub fn temp_path(target: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(target.file_name().unwrap_or_default());
    name.push(imgpack_reader::UNFINISHED_SUFFIX);
    parent_of(target).join(name)
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Syncs a directory, and everything below it, to disk.
fn sync_tree(dir: &Path) -> Result<()> {
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

fn sync_file(path: &Path) -> Result<()> {
    fs::File::open(path).and_then(|f| f.sync_all()).map_err(Error::io(path))
}

fn remove_any(path: &Path) -> Result<()> {
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
    fn existing_output_is_refused_without_overwrite_and_replaced_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("old"), b"old").unwrap();
        assert!(matches!(Staged::create_dir(&target, false), Err(Error::OutputExists { .. })));
        let staged = Staged::create_dir(&target, true).unwrap();
        fs::write(staged.path().join("new"), b"new").unwrap();
        assert!(target.join("old").exists(), "the old output stays until publish");
        staged.publish().unwrap();
        assert!(!target.join("old").exists());
        assert_eq!(fs::read(target.join("new")).unwrap(), b"new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary left behind");
    }

    #[test]
    fn an_unpublished_output_never_appears() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let staged = Staged::create_dir(&target, false).unwrap();
        fs::write(staged.path().join("data"), b"partial").unwrap();
        let temp = staged.path().to_path_buf();
        drop(staged);
        assert!(!target.exists());
        assert!(!temp.exists(), "an abandoned temporary is removed");
    }
}
