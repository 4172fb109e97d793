//! `slowfs SOURCE MOUNTPOINT`: a read-only FUSE passthrough of SOURCE that sleeps before it
//! answers chosen requests — by default 2 ms in each `open` and each `read` — so a local tree
//! behaves like one on NFS, Lustre or a busy disk, where every file costs round trips whatever
//! the CPU does. `benches/slow_source.py` mounts it and packs from it.
//!
//! ```text
//! slowfs SOURCE MOUNTPOINT [--latency-ms 2] [--ops open,read] [--threads 64]
//! ```
//!
//! `--ops` names the requests that wait: any of `open`, `read` (files), `opendir`, `readdir`
//! (directories), `lookup`, `getattr` (metadata), or `all`. `--threads` is how many requests are
//! served at once (each waits on its own thread, as a server answers many clients at once); the
//! kernel is allowed as many background requests (readahead), so the shim is not what limits
//! concurrency. The mount is read-only, attributes and entries are cached by the kernel for 1 s.
//!
//! It prints `mounted MOUNTPOINT` on stdout once the mount is in place, serves until SIGINT or
//! SIGTERM, then unmounts and prints how many requests of each kind waited, on stderr. Killed
//! harder, the mount is left for `fusermount3 -u MOUNTPOINT` (the script always runs that too).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, Request,
};

const TTL: Duration = Duration::from_secs(1);

/// The requests that can be made to wait, in the order their counts are printed.
const OPS: [&str; 6] = ["open", "read", "opendir", "readdir", "lookup", "getattr"];

/// How many requests of each of [`OPS`] were served (global, since fuser owns the filesystem).
static COUNTS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// A directory entry as listed at `opendir`: inode number, kind, name.
type DirEntry = (u64, FileType, OsString);

struct SlowFs {
    latency: Duration,
    /// Which of [`OPS`] wait.
    slow: [bool; 6],
    /// Inode number - 1 → path under the source; the root is inode 1.
    paths: RwLock<(Vec<PathBuf>, HashMap<PathBuf, u64>)>,
    files: Mutex<HashMap<u64, File>>,
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    next_handle: AtomicU64,
}

impl SlowFs {
    fn new(root: PathBuf, latency: Duration, slow: [bool; 6]) -> SlowFs {
        let mut by_path = HashMap::new();
        by_path.insert(root.clone(), 1);
        SlowFs {
            latency,
            slow,
            paths: RwLock::new((vec![root], by_path)),
            files: Mutex::default(),
            dirs: Mutex::default(),
            next_handle: AtomicU64::new(1),
        }
    }

    /// Counts a request of kind `OPS[op]` and waits if that kind is slow.
    fn wait(&self, op: usize) {
        COUNTS[op].fetch_add(1, Ordering::Relaxed);
        if self.slow[op] {
            std::thread::sleep(self.latency);
        }
    }

    fn path(&self, ino: INodeNo) -> Option<PathBuf> {
        let paths = self.paths.read().unwrap();
        paths.0.get((ino.0 as usize).checked_sub(1)?).cloned()
    }

    fn ino(&self, path: PathBuf) -> u64 {
        if let Some(&ino) = self.paths.read().unwrap().1.get(&path) {
            return ino;
        }
        let mut paths = self.paths.write().unwrap();
        if let Some(&ino) = paths.1.get(&path) {
            return ino;
        }
        paths.0.push(path.clone());
        let ino = paths.0.len() as u64;
        paths.1.insert(path, ino);
        ino
    }

    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}

fn kind(file_type: fs::FileType) -> FileType {
    if file_type.is_dir() {
        FileType::Directory
    } else if file_type.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn attr(ino: u64, meta: &Metadata) -> FileAttr {
    let time = |secs: i64, nsecs: i64| UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs as u32);
    FileAttr {
        ino: INodeNo(ino),
        size: meta.len(),
        blocks: meta.blocks(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind(meta.file_type()),
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for SlowFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Readahead requests are "background" ones, which the kernel caps at 12 by default.
        let threads = u16::try_from(threads()).unwrap_or(u16::MAX);
        let _ = config.set_max_background(threads);
        let _ = config.set_congestion_threshold(threads);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.wait(4);
        let Some(dir) = self.path(parent) else { return reply.error(Errno::ENOENT) };
        let path = dir.join(name);
        match fs::symlink_metadata(&path) {
            Ok(meta) => reply.entry(&TTL, &attr(self.ino(path), &meta), Generation(0)),
            Err(e) => reply.error(e.into()),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.wait(5);
        let Some(path) = self.path(ino) else { return reply.error(Errno::ENOENT) };
        match fs::symlink_metadata(&path) {
            Ok(meta) => reply.attr(&TTL, &attr(ino.0, &meta)),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let Some(path) = self.path(ino) else { return reply.error(Errno::ENOENT) };
        match fs::read_link(&path) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(e.into()),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.wait(0);
        let Some(path) = self.path(ino) else { return reply.error(Errno::ENOENT) };
        match File::open(&path) {
            Ok(file) => {
                let fh = self.handle();
                self.files.lock().unwrap().insert(fh, file);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e.into()),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.wait(1);
        let file = match self.files.lock().unwrap().get(&fh.0) {
            Some(file) => file.try_clone(),
            None => return reply.error(Errno::EBADF),
        };
        let mut buf = vec![0; size as usize];
        let mut filled = 0;
        let result = file.and_then(|file| {
            while filled < buf.len() {
                match file.read_at(&mut buf[filled..], offset + filled as u64)? {
                    0 => break,
                    n => filled += n,
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.data(&buf[..filled]),
            Err(e) => reply.error(e.into()),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.wait(2);
        let Some(path) = self.path(ino) else { return reply.error(Errno::ENOENT) };
        let parent = path.parent().map_or(ino.0, |p| self.ino(p.to_path_buf()));
        let read = fs::read_dir(&path).and_then(|entries| {
            let mut listed =
                vec![(ino.0, FileType::Directory, ".".into()), (parent, FileType::Directory, "..".into())];
            for entry in entries {
                let entry = entry?;
                let file_type = entry.file_type()?;
                listed.push((self.ino(entry.path()), kind(file_type), entry.file_name()));
            }
            Ok(listed)
        });
        match read {
            Ok(listed) => {
                let fh = self.handle();
                self.dirs.lock().unwrap().insert(fh, listed);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e.into()),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.wait(3);
        let dirs = self.dirs.lock().unwrap();
        let Some(listed) = dirs.get(&fh.0) else { return reply.error(Errno::EBADF) };
        for (i, (ino, kind, name)) in listed.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }
}

/// The `--threads` value, read again in `init` (which cannot be given arguments).
fn threads() -> usize {
    option("--threads").map_or(64, |t| t.parse().unwrap_or_else(|_| usage("--threads takes a number")))
}

fn option(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).map(|i| args.get(i + 1).cloned().unwrap_or_else(|| usage(name)))
}

fn usage(problem: &str) -> ! {
    eprintln!("slowfs: {problem}\nusage: slowfs SOURCE MOUNTPOINT [--latency-ms 2] [--ops open,read] [--threads 64]");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        if args[i].starts_with("--") {
            i += 2;
        } else {
            positional.push(PathBuf::from(&args[i]));
            i += 1;
        }
    }
    let [source, mountpoint] = positional.as_slice() else { usage("give SOURCE and MOUNTPOINT") };
    let latency_ms: f64 = option("--latency-ms")
        .map_or(2.0, |t| t.parse().unwrap_or_else(|_| usage("--latency-ms takes a number")));
    let mut slow = [false; 6];
    for op in option("--ops").unwrap_or_else(|| "open,read".into()).split(',') {
        match OPS.iter().position(|o| *o == op) {
            Some(i) => slow[i] = true,
            None if op == "all" => slow = [true; 6],
            None => usage(&format!("--ops: unknown request {op:?}; name some of {}, or all", OPS.join(","))),
        }
    }
    let source = fs::canonicalize(source).unwrap_or_else(|e| usage(&format!("{}: {e}", source.display())));

    // SIGINT and SIGTERM are taken by `sigwait` below: blocked here, before any thread starts,
    // so no serving thread is interrupted by them.
    // SAFETY: plain libc calls on a local, zero-initialised signal set.
    let signals = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };

    let fs = SlowFs::new(source.clone(), Duration::from_secs_f64(latency_ms / 1e3), slow);
    let mut config = Config::default();
    config.mount_options = vec![MountOption::RO, MountOption::FSName(format!("slowfs:{}", source.display()))];
    config.n_threads = Some(threads());
    config.clone_fd = true;
    let session = fuser::spawn_mount(fs, mountpoint, &config)
        .unwrap_or_else(|e| usage(&format!("cannot mount {}: {e}", mountpoint.display())));
    println!("mounted {}", Path::new(mountpoint).display());
    let mut signal = 0;
    // SAFETY: waits on the set built above.
    unsafe { libc::sigwait(&signals, &mut signal) };
    if let Err(e) = session.umount_and_join() {
        eprintln!("slowfs: unmounting {}: {e}", mountpoint.display());
    }
    let counts: Vec<String> =
        OPS.iter().zip(&COUNTS).map(|(op, n)| format!("{op} {}", n.load(Ordering::Relaxed))).collect();
    eprintln!("slowfs: served {}", counts.join(", "));
}
