//! The one place that opens an LMDB environment: [`open_env`] for reading a published dataset,
//! shared by every reader in the process, and [`create`] for the examples and tests that write
//! one. heed's `unsafe` open appears here and nowhere else in the crate.
//!
//! # One environment per path per process
//!
//! heed (0.22) keeps a process-wide table of the environments it has open, keyed by canonical
//! path. While an `Env` for a path is alive, every other open of that path fails with
//! [`heed::Error::EnvAlreadyOpened`] — whatever the flags, even identical ones — because LMDB
//! forbids opening one environment twice in a process (two maps of one file, and closing either
//! drops the other's POSIX locks). heed hands out no existing `Env` by path either: a second
//! handle can only be a clone of the first. The entry is removed, and the path can be opened
//! again, when the last clone is dropped and `mdb_env_close` has returned.
//!
//! So [`open_env`] keeps its own table of the environments it opened, holding only weak
//! references: a second open of a path whose environment is alive returns the same
//! environment, and once every handle is dropped the environment closes and the next open maps
//! the files afresh.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use heed::{Env, EnvFlags, EnvOpenOptions, WithoutTls};

use crate::{Error, Result};

/// The environments [`open_env`] has handed out, by canonical path. Weak, so they close when
/// their last handle is dropped; the lock also makes an open and its registration one step.
static OPEN: Mutex<BTreeMap<PathBuf, Weak<Env<WithoutTls>>>> = Mutex::new(BTreeMap::new());

/// How long [`open_env`] waits for an environment whose last handle was just dropped to finish
/// closing. Closing takes microseconds (an `munmap` and two `close`s); this only bounds a wait
/// for a handle that is not being dropped after all.
const CLOSING_WAIT: Duration = Duration::from_secs(5);

/// Opens the LMDB environment of the published dataset in directory `path` for reading, or
/// returns the one this process already has open there.
///
/// The flags are the reader's: read-only and without the lock file (a published dataset is never
/// written again, and so it also reads from read-only and shared mounts), readahead off (see the
/// [module docs](super#cold-reads)), read transactions not tied to a thread (`WithoutTls`, so a
/// [`super::LmdbDataset`] is `Send + Sync`).
///
/// Every reader of LMDB in the process should open through this function, because heed allows
/// one handle per environment per process (see `reader/src/lmdb/env.rs`): two
/// [`crate::open`]s of one path, a dataset read while `pack verify` checks it, a merge reading a
/// part it just listed — each gets a clone of the same environment instead of
/// [`heed::Error::EnvAlreadyOpened`]. Clone the returned `Arc` to share it; do not clone the
/// `Env` out of it, or it stays open after the `Arc`s are gone. When the last handle is dropped
/// the environment closes, and the next call opens the files afresh: drop every handle before
/// replacing a dataset's files, and reopen after.
///
/// # Errors
///
/// [`Error::NotADataset`] naming `path` when it holds no `data.mdb`; [`Error::Io`] when it cannot
/// be resolved; [`Error::Lmdb`] when LMDB refuses it — with [`heed::Error::EnvAlreadyOpened`]
/// when something in this process opened it without this function (a writer, say) and still
/// holds it.
///
/// # Example
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("train.lmdb");
/// # imgpack_reader::lmdb::write_example(&path)?;
/// let env = imgpack_reader::lmdb::open_env(&path)?;
/// let again = imgpack_reader::lmdb::open_env(&path)?; // no EnvAlreadyOpened: the same environment
/// assert!(std::sync::Arc::ptr_eq(&env, &again));
/// let txn = env.read_txn()?;
/// let db: heed::Database<heed::types::Bytes, heed::types::Bytes> = env.open_database(&txn, None)?.unwrap();
/// assert!(db.get(&txn, b"__meta__")?.is_some());
/// # Ok(()) }
/// ```
pub fn open_env(path: &Path) -> Result<Arc<Env<WithoutTls>>> {
    if !path.join("data.mdb").is_file() {
        return Err(Error::NotADataset {
            path: path.to_path_buf(),
            reason: "no data.mdb inside, so no LMDB environment; pass the directory that `pack --to lmdb -o` created"
                .into(),
        });
    }
    // heed keys its table by canonical path; so does this one, so that `a/../a` and a symbolic
    // link to `a` find the environment `a` opened.
    let canonical = path.canonicalize().map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    let lmdb_err = |source| Error::Lmdb { path: path.to_path_buf(), source };
    let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    let known = open.get(&canonical).cloned();
    if let Some(env) = known.as_ref().and_then(Weak::upgrade) {
        return Ok(env);
    }
    // Forget the environments that are closed. Not those merely unreferenced: heed holds one
    // until its close returns, and the entry is how a later open here knows to wait for that
    // close rather than report someone else's environment (another path's open must not make
    // this path's closing environment look foreign).
    open.retain(|path, env| env.strong_count() > 0 || heed::env_closing_event(path).is_some());
    let started = std::time::Instant::now();
    let env = loop {
        match open_read_only(&canonical) {
            // This function opened it and its last handle is gone, but heed's entry goes only
            // when `mdb_env_close` returns: another thread is dropping it right now. Wait for
            // that. Between the last `Arc` going and heed announcing the close there is a
            // moment with no closing event to wait on yet: then try again shortly.
            Err(heed::Error::EnvAlreadyOpened) if known.is_some() && started.elapsed() < CLOSING_WAIT => {
                match heed::env_closing_event(&canonical) {
                    Some(closing) => {
                        closing.wait_timeout(CLOSING_WAIT.saturating_sub(started.elapsed()));
                    }
                    None => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            opened => break opened,
        }
    }
    .map_err(lmdb_err)?;
    let env = Arc::new(env);
    open.insert(canonical, Arc::downgrade(&env));
    Ok(env)
}

/// heed's open with the reader's flags, for [`open_env`] alone, which makes sure it runs once per
/// environment at a time.
fn open_read_only(path: &Path) -> heed::Result<Env<WithoutTls>> {
    let mut options = EnvOpenOptions::new().read_txn_without_tls();
    // SAFETY: the flags make LMDB map the file read-only and skip the lock file. A dataset is
    // immutable once `pack` has published it, so no writer changes the pages under us (which is
    // what NO_LOCK requires); a file truncated or rewritten by someone else is the one hazard, as
    // with any memory map. heed itself refuses a second open of the path in this process.
    unsafe {
        options.flags(EnvFlags::READ_ONLY | EnvFlags::NO_LOCK | EnvFlags::NO_READ_AHEAD);
        options.open(path)
    }
}

/// Creates (or opens) the LMDB environment in directory `path` for writing, with a map of
/// `map_size` bytes: for this crate's examples and tests, which write small datasets to read
/// back. The directory must be one that nothing else writes or maps meanwhile.
pub(crate) fn create(path: &Path, map_size: usize) -> heed::Result<Env> {
    // SAFETY: callers pass a directory of their own that nothing else opens while they write
    // it, and drop the environment before reading it through `open_env`.
    unsafe { EnvOpenOptions::new().map_size(map_size).open(path) }
}

#[cfg(test)]
mod tests {
    use heed::types::Bytes;
    use heed::Database;

    use super::*;

    fn put(path: &Path, key: &[u8], value: &[u8]) {
        let env = create(path, 1 << 20).unwrap();
        let mut txn = env.write_txn().unwrap();
        let db: Database<Bytes, Bytes> = env.create_database(&mut txn, None).unwrap();
        db.put(&mut txn, key, value).unwrap();
        txn.commit().unwrap();
    }

    fn get(env: &Env<WithoutTls>, key: &[u8]) -> Option<Vec<u8>> {
        let txn = env.read_txn().unwrap();
        let db: Database<Bytes, Bytes> = env.open_database(&txn, None).unwrap().unwrap();
        db.get(&txn, key).unwrap().map(<[u8]>::to_vec)
    }

    #[test]
    fn a_second_open_while_the_first_is_alive_shares_its_environment() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), b"k", b"v");
        let first = open_env(dir.path()).unwrap();
        // heed alone refuses this second open, whatever the flags.
        assert!(matches!(open_read_only(dir.path()), Err(heed::Error::EnvAlreadyOpened)));
        let second = open_env(dir.path()).unwrap();
        // The same directory by another spelling is the same environment.
        let third = open_env(&dir.path().join(".")).unwrap();
        assert!(Arc::ptr_eq(&first, &second) && Arc::ptr_eq(&first, &third));
        drop(first);
        assert_eq!(get(&second, b"k").as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn dropping_every_handle_closes_and_the_next_open_sees_new_files() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), b"k", b"old");
        let (a, b) = (open_env(dir.path()).unwrap(), open_env(dir.path()).unwrap());
        assert_eq!(get(&a, b"k").as_deref(), Some(&b"old"[..]));
        drop((a, b));
        let canonical = dir.path().canonicalize().unwrap();
        assert!(heed::env_closing_event(&canonical).is_none(), "heed still has it open");
        // Replace the files; a writer can open the path again only because it was closed.
        std::fs::remove_dir_all(dir.path()).unwrap();
        std::fs::create_dir(dir.path()).unwrap();
        put(dir.path(), b"k", b"new");
        assert_eq!(get(&open_env(dir.path()).unwrap(), b"k").as_deref(), Some(&b"new"[..]));
    }

    #[test]
    fn opens_and_drops_racing_on_threads_all_succeed() {
        // A last handle dropped on one thread while another opens: the registry's entry is dead
        // but heed's is still there until the close returns.
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), b"k", b"v");
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..200 {
                        let env = open_env(dir.path()).unwrap();
                        assert_eq!(get(&env, b"k").as_deref(), Some(&b"v"[..]));
                    }
                });
            }
        });
    }

    #[test]
    fn an_environment_still_closing_is_waited_for_after_other_paths_were_opened() {
        // The last handle is gone but heed still holds the environment, as in the moment before
        // its close returns (here kept so by a clone of the `Env`, closed shortly on a thread).
        // Opening another path meanwhile must not make this one's open fail with
        // EnvAlreadyOpened instead of waiting for the close.
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        put(a.path(), b"k", b"a");
        put(b.path(), b"k", b"b");
        let env = open_env(a.path()).unwrap();
        let closing = Env::clone(&env);
        drop(env);
        assert_eq!(get(&open_env(b.path()).unwrap(), b"k").as_deref(), Some(&b"b"[..]));
        std::thread::scope(|scope| {
            scope.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                drop(closing);
            });
            let again = open_env(a.path()).expect("waits for the close, then opens afresh");
            assert_eq!(get(&again, b"k").as_deref(), Some(&b"a"[..]));
        });
    }

    #[test]
    fn a_path_without_data_mdb_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        for path in [dir.path().to_path_buf(), dir.path().join("missing")] {
            let err = open_env(&path).unwrap_err();
            assert!(matches!(&err, Error::NotADataset { path: p, .. } if *p == path), "{err:?}");
            let message = err.to_string();
            assert!(message.starts_with(&format!("{}: ", path.display())), "{message}");
            assert!(message.contains("no data.mdb"), "{message}");
        }
    }

    #[test]
    fn an_environment_opened_elsewhere_in_the_process_is_reported_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), b"k", b"v");
        let writer = create(dir.path(), 1 << 20).unwrap();
        let started = std::time::Instant::now();
        let err = open_env(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Lmdb { source: heed::Error::EnvAlreadyOpened, .. }), "{err:?}");
        assert!(started.elapsed() < CLOSING_WAIT / 2, "waited for a close that was not coming");
        drop(writer);
        assert!(open_env(dir.path()).is_ok());
    }
}
