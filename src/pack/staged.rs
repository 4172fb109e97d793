//! Publishing outputs atomically.
//!
//! A run writes under a temporary name next to the output (`.NAME.imgpack-tmp`) and renames it
//! into place only once everything is written and synced. An interrupted run therefore never
//! leaves anything at the output path that could be mistaken for a complete dataset; what it
//! leaves is visibly temporary.
//!
//! Publishing knows nothing of what writes into the temporary. Its owner tells it which files
//! are scratch ([`Staged::scratch`]: removed before publishing, like the resume journal or the
//! LMDB sink's checksum file) and which file, when present, means the temporary is worth
//! keeping after a failed run ([`Staged::keep_if`]: the checkpoint journal, for `--resume`).
//!
//! One run at a time writes an output: staging takes its [`OutputLock`] first. The lock is a
//! `flock`, so it dies with its process; the file it is taken on is only where it lives, and
//! a file left by a killed run is taken over by the next one.

use std::fs;
use std::path::{Path, PathBuf};

use crate::fs::{parent_of, remove_any, sync_file, sync_tree, temp_path};
use crate::{Error, Result};

/// An output being written under a temporary name.
#[derive(Debug)]
pub struct Staged {
    target: PathBuf,
    temp: PathBuf,
    overwrite: bool,
    /// Files in the temporary that are not part of the output: removed before publishing.
    scratch: Vec<&'static str>,
    /// A file whose presence keeps the temporary when the run stops without publishing.
    keep_if: Option<&'static str>,
    /// Held until the run ends, so a second run cannot write the same output meanwhile.
    _lock: OutputLock,
}

/// A lock on an output: an exclusive `flock` on `.NAME.imgpack-lock` beside it, held by the
/// one run writing it, with that run's pid written in it.
///
/// Two runs writing one output — a job submitted twice, a scheduler re-running a task whose
/// first attempt still runs — would otherwise share one temporary directory and could publish
/// a mix of both. The second run fails at once instead ([`Error::Busy`], naming the lock file;
/// the pid in it says which process holds it). On a file system without locks (some network
/// mounts) runs are not protected, as without this lock.
///
/// **A lock file is not a lock.** The lock is the `flock`, which the kernel releases when the
/// process holding it ends, however it ends. A run that finishes, fails or stops at a
/// checkpoint removes the file; one that is killed (`kill -9`, a second Ctrl-C, a crash)
/// leaves it, and the next run simply takes the lock on it and removes it when done: a leftover
/// file never blocks a run. Readers, `pack verify` and `pack merge` never look at it: it is a
/// hidden file beside the output (inside `OUT` for `--part` runs, where merge looks only at
/// part directories and their temporaries).
///
/// The file is removed while the lock is held, so a run that opened it just before cannot lock
/// the removed file while a third run locks a new one: after locking, [`OutputLock::acquire`]
/// checks that the path still names the file it locked, and starts over if not.
#[derive(Debug)]
pub struct OutputLock {
    file: Option<(fs::File, PathBuf)>,
}

/// What the lock file of `target` is called: `.NAME.imgpack-lock` beside it.
pub fn lock_path(target: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(target.file_name().unwrap_or_default());
    name.push(".imgpack-lock");
    parent_of(target).join(name)
}

/// Whether `file` and the file at `path` are one file (the path was not removed or replaced).
fn same_file(file: &fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

impl OutputLock {
    /// Takes the lock of `target`, or fails naming the lock file of the run that holds it.
    /// A lock file left by a run that was killed is taken over.
    pub fn acquire(target: &Path) -> Result<OutputLock> {
        let path = lock_path(target);
        loop {
            let mut file = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(Error::io(&path))?;
            // SAFETY: flock on a file descriptor this function owns.
            let locked =
                unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) };
            if locked != 0 {
                let error = std::io::Error::last_os_error();
                return match error.raw_os_error() {
                    Some(libc::EWOULDBLOCK) => {
                        let pid = OutputLock::holder(&path);
                        Err(Error::Busy { path: target.to_path_buf(), lock: path, pid })
                    }
                    Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => Ok(OutputLock { file: None }),
                    _ => Err(Error::io(&path)(error)),
                };
            }
            if !same_file(&file, &path) {
                // Its holder removed it between our open and our lock: lock the new one.
                continue;
            }
            // Whoever wrote it before (a killed run) is gone: the pid now is ours. Only for
            // people and messages: the flock is the lock, so a failed write does not matter.
            let pid = format!("{}\n", std::process::id());
            let _ = file.set_len(0).and_then(|()| std::io::Write::write_all(&mut file, pid.as_bytes()));
            return Ok(OutputLock { file: Some((file, path)) });
        }
    }

    /// The pid written in the lock file at `lock`: the process that holds it, if the lock is
    /// held (a leftover file names a process that is gone).
    pub fn holder(lock: &Path) -> Option<u32> {
        fs::read_to_string(lock).ok()?.trim().parse().ok()
    }
}

impl Drop for OutputLock {
    /// Removes the lock file, then releases the lock (closing the file). A file that is not
    /// the one locked any more (removed by hand, and made again by another run) is left alone.
    fn drop(&mut self) {
        if let Some((file, path)) = self.file.take() {
            if same_file(&file, &path) {
                let _ = fs::remove_file(&path);
            }
            drop(file);
        }
    }
}

impl Staged {
    /// Prepares to write `target`: refuses an existing one unless `overwrite`, clears the
    /// leftovers of an interrupted run, and creates the temporary directory.
    pub fn create_dir(target: &Path, overwrite: bool) -> Result<Staged> {
        Ok(Staged::open_dir(target, overwrite, |_| Ok(false))?.0)
    }

    /// Like [`Staged::create_dir`], but an interrupted run's temporary directory is offered to
    /// `reuse` first: when it answers `true` the temporary is kept as it is, otherwise it is
    /// cleared. Returns whether it was kept.
    pub fn open_dir(
        target: &Path,
        overwrite: bool,
        reuse: impl FnOnce(&Path) -> Result<bool>,
    ) -> Result<(Staged, bool)> {
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
        let reused = temp.is_dir() && reuse(&temp)?;
        if !reused {
            remove_any(&temp)?;
            fs::create_dir(&temp).map_err(Error::io(&temp))?;
        }
        let staged = Staged {
            target: target.to_path_buf(),
            temp,
            overwrite,
            scratch: Vec::new(),
            keep_if: None,
            _lock: lock,
        };
        Ok((staged, reused))
    }

    /// Marks `name` in the temporary as scratch: removed before publishing, never published.
    pub fn scratch(&mut self, name: &'static str) {
        self.scratch.push(name);
    }

    /// Keeps the temporary when the run stops without publishing, if `name` exists in it then.
    pub fn keep_if(&mut self, name: &'static str) {
        self.keep_if = Some(name);
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
        for name in &self.scratch {
            let path = self.temp.join(name);
            if path.exists() {
                fs::remove_file(&path).map_err(Error::io(&path))?;
            }
        }
        sync_tree(&self.temp)?;
        if self.overwrite && self.target.symlink_metadata().is_ok() {
            // One atomic step where the file system can: the new output and the old one swap
            // names, so a reader of the output path sees the old dataset or the new one, never
            // nothing; the old one, now at the temporary name, is then removed. (A crash
            // between the two leaves the old dataset at the temporary name, which the next run
            // clears like any temporary without a journal.)
            if exchange(&self.temp, &self.target).map_err(Error::io(&self.target))? {
                remove_any(&self.temp)?;
                return sync_file(&parent_of(&self.target));
            }
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

/// Swaps the names of `a` and `b` atomically (`renameat2` with `RENAME_EXCHANGE`); `false`
/// where the file system or the kernel cannot (some network and FUSE file systems, kernels
/// before 3.15), so the caller falls back to two renames.
fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
        let (a, b) = (c(a)?, c(b)?);
        // SAFETY: two valid NUL-terminated paths, resolved from the working directory.
        let rc = unsafe {
            libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE)
        };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL | libc::ENOSYS | libc::ENOTSUP) => Ok(false),
            _ => Err(e),
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (a, b);
        Ok(false)
    }
}

impl Drop for Staged {
    /// A run that stops with an error removes its temporary, unless it holds the file named by
    /// [`Staged::keep_if`] (a checkpoint journal, kept for `--resume`); after
    /// [`Staged::publish`] there is nothing left at the temporary path. The lock is released
    /// and its file removed after this. (A killed process runs no destructor; the next run
    /// deals with what it left: it clears or resumes the temporary and takes over the lock file.)
    fn drop(&mut self) {
        if !self.keep_if.is_some_and(|name| self.temp.join(name).exists()) {
            let _ = remove_any(&self.temp);
        }
    }
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

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn overwriting_swaps_the_old_output_for_the_new_in_one_step() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::write(a.join("x"), b"a").unwrap();
        fs::write(&b, b"b is a file").unwrap();
        // ext4 and tmpfs, where the tests run, support RENAME_EXCHANGE: no fallback here.
        assert!(exchange(&a, &b).unwrap(), "renameat2(RENAME_EXCHANGE) is supported here");
        assert_eq!(fs::read(a).unwrap(), b"b is a file");
        assert_eq!(fs::read(b.join("x")).unwrap(), b"a");
        let missing = dir.path().join("missing");
        assert!(
            exchange(&missing, &dir.path().join("b")).is_err(),
            "a missing path is an error, not a fallback"
        );
    }

    #[test]
    fn a_live_lock_is_refused_naming_its_file_and_a_released_one_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let first = Staged::create_dir(&target, false).unwrap();
        let lock = lock_path(&target);
        assert_eq!(lock, dir.path().join(".out.imgpack-lock"));
        assert_eq!(OutputLock::holder(&lock), Some(std::process::id()), "the holder's pid is in the file");
        match Staged::create_dir(&target, false) {
            Err(Error::Busy { path, lock: named, pid }) => {
                assert_eq!((path, named, pid), (target.clone(), lock.clone(), Some(std::process::id())))
            }
            other => panic!("a second writer got {other:?}"),
        }
        assert!(first.path().is_dir(), "the refused run left the first one's temporary alone");
        drop(first);
        assert!(!lock.exists(), "a run that ends removes its lock file");
        drop(Staged::create_dir(&target, false).unwrap());
    }

    #[test]
    fn a_lock_file_left_by_a_killed_run_is_taken_over_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let lock = lock_path(&target);
        // What `kill -9` leaves: the file, with a pid that is gone, and no flock on it.
        fs::write(&lock, b"4194304\n").unwrap();
        let staged = Staged::create_dir(&target, false).unwrap();
        assert_eq!(OutputLock::holder(&lock), Some(std::process::id()));
        staged.publish().unwrap();
        assert!(!lock.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "only the output is left");
    }

    #[test]
    fn a_lock_file_removed_and_made_again_by_another_run_is_not_removed_by_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let lock = lock_path(&target);
        let first = OutputLock::acquire(&target).unwrap();
        fs::remove_file(&lock).unwrap();
        let second = OutputLock::acquire(&target).unwrap();
        drop(first);
        assert!(lock.exists(), "the first run removed the second run's lock file");
        assert!(matches!(OutputLock::acquire(&target), Err(Error::Busy { .. })));
        drop(second);
        assert!(!lock.exists());
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
