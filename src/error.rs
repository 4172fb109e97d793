//! The writer's error type. Every variant carries the path it is about, and every message says
//! what to do next, because the person reading it is in the middle of a long packing job.

use std::path::PathBuf;

/// Result alias for the writer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that stops a `pack` run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file system refused an operation.
    #[error("{}: {source}{}", path.display(), space_hint(source.raw_os_error()).unwrap_or_default())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The source is not an ImageFolder tree.
    #[error("{}: {reason}", path.display())]
    BadSource {
        /// The source root.
        path: PathBuf,
        /// What is wrong and what to pass instead.
        reason: String,
    },
    /// The source's file system went away mid-run (a FUSE mount whose daemon stopped answers
    /// `ENOTCONN` for every file): the run stops rather than skip every later file.
    #[error("{}: {source}: the file system holding the source is gone (its mount's daemon or server stopped); mount it again, then run the same command with --resume to continue", path.display())]
    SourceGone {
        /// The file that met it.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The output exists and `--overwrite` was not given.
    #[error("{}: already exists; pass --overwrite to replace it, or choose another -o", path.display())]
    OutputExists {
        /// The output path.
        path: PathBuf,
    },
    /// The store prefix given as output holds objects and `--overwrite` was not given.
    #[error("{url}: already exists: holds {objects} object{} ({}); pass --overwrite to delete them and pack anew, or choose another -o", if *objects == 1 { "" } else { "s" }, if *dataset { "a dataset: imgpack.json is there" } else { "but no imgpack.json: not a complete dataset, perhaps what a killed run left" })]
    StoreOutputExists {
        /// The prefix (`s3://bucket/prefix/`).
        url: String,
        /// How many objects are under it.
        objects: usize,
        /// Whether one of them is `imgpack.json`.
        dataset: bool,
    },
    /// Another run holds the lease on a store prefix ([`crate::store::lock`]) and renews it.
    #[error("{url}: another pack run is writing it right now ({holder} holds its lock {lock}, and renewed it while this run watched); wait for that run to finish, or stop it, then run this again (a run that was killed is taken over once its lock goes {:.0} s without renewal)", stale.as_secs_f64())]
    StoreBusy {
        /// The prefix.
        url: String,
        /// The lock object.
        lock: String,
        /// Who holds it: "pid 123 on host node07".
        holder: String,
        /// How often the holder renews it.
        renew: std::time::Duration,
        /// How long without renewal makes it stale.
        stale: std::time::Duration,
    },
    /// This run's lease on its store prefix was lost: it writes nothing more there.
    #[error("{url}: this run lost its lock on the prefix ({reason}), so it stopped writing there and left the prefix to the run that holds the lock now; if no other run should be writing it, run this again")]
    StoreLockLost {
        /// The lock object.
        url: String,
        /// How it was lost.
        reason: String,
    },
    /// Another run is writing the same output right now.
    #[error("{}: another pack run is writing it right now ({}it holds the lock {}); wait for that run to finish, or stop it, then run this again", path.display(), pid.map_or(String::new(), |p| format!("pid {p}; ")), lock.display())]
    Busy {
        /// The output.
        path: PathBuf,
        /// The lock file the other run holds.
        lock: PathBuf,
        /// The process holding it, as it wrote in the lock file (if it could be read).
        pid: Option<u32>,
    },
    /// LMDB refused an operation.
    #[error("{}: LMDB error: {source}{hint}", path.display())]
    Lmdb {
        /// The LMDB environment being written.
        path: PathBuf,
        /// The underlying error.
        source: heed::Error,
        /// What to do about it, if we know (starts with "; ").
        hint: String,
    },
    /// A sample could not be packed and `--on-error fail` was given.
    #[error("{}: {reason}; fix or remove the file, or drop `--on-error fail` to skip such files and list them in the summary", path.display())]
    BadSample {
        /// The source file.
        path: PathBuf,
        /// Why it could not be packed.
        reason: String,
    },
    /// The command line asks for something that cannot be done as written: options that
    /// contradict each other or are out of range, or paths that name the wrong kind of thing.
    /// The fix is always a different command line; `pack` exits with 2 for this and only this.
    #[error("{0}")]
    Usage(String),
    /// An output cannot be written as the source asks (a class name that is no folder name, a
    /// sample name too long for a tar header).
    #[error("{}: {reason}", path.display())]
    BadOutput {
        /// The output.
        path: PathBuf,
        /// What cannot be written, and what to do.
        reason: String,
    },
    /// A thread of the run panicked: a bug in `pack`, reported instead of aborting.
    #[error("{}: the {thread} thread stopped on an internal error (a bug in pack); nothing was published; please report it with the command that ran", path.display())]
    Panicked {
        /// What the thread was working on.
        path: PathBuf,
        /// Which thread.
        thread: String,
    },
    /// The worker threads could not be started.
    #[error("cannot start {threads} worker threads: {reason}; pass a smaller --threads")]
    Threads {
        /// How many were asked for.
        threads: usize,
        /// What the system said.
        reason: String,
    },
    /// The run was interrupted (SIGINT or SIGTERM): it stopped at a checkpoint, or, before the
    /// first one, with nothing kept. Nothing was published either way.
    #[error("{}", interrupted(temp, *kept))]
    Interrupted {
        /// The temporary directory holding the work done.
        temp: PathBuf,
        /// Samples kept at the last checkpoint, if there was one.
        kept: Option<u64>,
    },
    /// `--resume` cannot continue the interrupted run: its journal, saved listing or kept
    /// output is unreadable or does not match, or the run or the source changed.
    #[error("{}: cannot resume: {reason}; run without --resume to start over", path.display())]
    Resume {
        /// The output being resumed.
        path: PathBuf,
        /// What does not match, and what changed.
        reason: String,
    },
    /// `pack merge` was stopped (SIGINT or SIGTERM) before it published the merged dataset.
    /// A merge is run again to finish: what it did is redone or recognised as done.
    #[error(
        "{}: merge interrupted before the merged dataset was published; run `pack merge {}` again to finish it",
        path.display(),
        path.display()
    )]
    MergeInterrupted {
        /// The output holding the parts.
        path: PathBuf,
    },
    /// `pack merge` cannot merge the parts in an output.
    #[error("cannot merge {}: {reason}", path.display())]
    Merge {
        /// The output directory, or the part file at fault.
        path: PathBuf,
        /// What is missing, unfinished or foreign, and what to do.
        reason: String,
    },
    /// Reading a dataset back failed.
    #[error(transparent)]
    Reader(#[from] imgpack_reader::Error),
}

fn interrupted(temp: &std::path::Path, kept: Option<u64>) -> String {
    match kept {
        Some(packed) => format!(
            "interrupted: {packed} samples are safely {} {}; run the same command with --resume to continue",
            if crate::store::is_store_url(&temp.to_string_lossy()) { "stored under" } else { "on disk in" },
            temp.display()
        ),
        None => "interrupted before the first checkpoint: nothing was kept or published; run the same command again".into(),
    }
}

/// What to do when a write fails for want of space, by `errno`: the cause and the fix,
/// starting with "; ". An interrupted run keeps its checkpoints, hence `--resume`.
pub(crate) fn space_hint(errno: Option<i32>) -> Option<&'static str> {
    match errno? {
        libc::ENOSPC => Some(
            "; the disk is full: free space (or write the output to another disk with -o), then run the same command with --resume to continue",
        ),
        libc::EFBIG => Some(
            "; the file size limit was reached (`ulimit -f`, or the file system's largest file): raise it or use a smaller --shard-size, then run the same command with --resume",
        ),
        libc::EDQUOT => Some(
            "; the disk quota is exceeded: free space or raise the quota, then run the same command with --resume to continue",
        ),
        _ => None,
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}
