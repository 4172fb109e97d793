//! Signals and the output lock, with the real binary: a signal delivered twice (to the child,
//! then to its process group, as `timeout -s INT` does) is one request and still ends with a
//! checkpoint and exit 130; a second signal later stops at once, still exit 130, publishing
//! nothing; a lock file left by `kill -9` never blocks the next run, which removes it; a lock
//! held by a live process is refused naming its file.
//!
//! To stop a run at a known moment, its tree holds a named pipe posing as an image
//! ([`Stall`]): the loader blocks reading it until the test writes an image into it, so a run
//! can be held "in the middle of a chunk" for as long as a test needs, whatever the machine's
//! speed.

use std::ffi::{CString, OsString};
use std::fs;
use std::io::{BufRead, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::util::{big_tree, contents, pack, testdata};

const PLEASE_WAIT: &str = "pack: stopping at the next checkpoint, please wait";
const STOPPING_NOW: &str = "pack: stopping now;";

/// Re-encoding with small checkpoints (and small shards): many checkpoints before the stall.
fn args(src: &Path, out: &Path, to: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["imagefolder".into(), src.into(), "-o".into(), out.into()];
    for a in ["--to", to, "--mode", "reencode", "--resize-shorter", "40", "--threads", "2"] {
        args.push(a.into());
    }
    if to == "webdataset" {
        args.extend(["--shard-size".into(), "60kB".into()]);
    }
    args.extend(["--checkpoint-bytes".into(), "20kB".into()]);
    args
}

fn with(args: &[OsString], more: &[&str]) -> Vec<OsString> {
    args.iter().cloned().chain(more.iter().map(OsString::from)).collect()
}

fn temp_of(out: &Path) -> PathBuf {
    out.with_file_name(format!(".{}.imgpack-tmp", out.file_name().unwrap().to_string_lossy()))
}

fn lock_of(out: &Path) -> PathBuf {
    out.with_file_name(format!(".{}.imgpack-lock", out.file_name().unwrap().to_string_lossy()))
}

/// A named pipe at `still_life/zz_stall.jpg`, about three quarters into the listing: `pack`
/// blocks reading it until [`Stall::feed`] (or a [`Feeder`]) writes a real image into it.
struct Stall {
    path: PathBuf,
    image: Vec<u8>,
    mtime: libc::timespec,
}

impl Stall {
    fn new(tree: &Path) -> Stall {
        let path = tree.join("still_life/zz_stall.jpg");
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
        let image = fs::read(testdata().join("imagefolder/still_life/coffee_01.jpg")).unwrap();
        let mtime = Stall::mtime(&path);
        Stall { path, image, mtime }
    }

    fn mtime(path: &Path) -> libc::timespec {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).unwrap();
        libc::timespec { tv_sec: m.mtime(), tv_nsec: m.mtime_nsec() }
    }

    /// Waits until `pack` opens the pipe (its loader is then blocked on it), for at most a
    /// minute, and keeps it blocked until [`Held::release`]. A reader waiting in `open` counts
    /// as one: a writer that does not wait gets in then, and the reader waits for data instead.
    fn hold(&self) -> Held<'_> {
        use std::os::unix::fs::OpenOptionsExt;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&self.path) {
                Ok(pipe) => return Held { stall: self, pipe },
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("pack never opened {}: {e}", self.path.display()),
            }
        }
    }

    fn restore_mtime(&self) {
        let c = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        let times = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, self.mtime];
        assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) }, 0);
    }

    /// Feeds the pipe every time a run opens it, until dropped.
    fn feeder(self: &Arc<Self>) -> Feeder {
        let stop = Arc::new(AtomicBool::new(false));
        let (stall, stopping) = (Arc::clone(self), Arc::clone(&stop));
        let thread = std::thread::spawn(move || loop {
            let Ok(mut pipe) = fs::OpenOptions::new().write(true).open(&stall.path) else { return };
            if stopping.load(Ordering::SeqCst) {
                return;
            }
            let _ = pipe.write_all(&stall.image);
            drop(pipe);
            stall.restore_mtime();
        });
        Feeder { stall: Arc::clone(self), stop, thread: Some(thread) }
    }
}

/// A run blocked reading a [`Stall`]. Dropped without [`Held::release`], it reads an empty
/// file (for runs that are killed meanwhile).
struct Held<'a> {
    stall: &'a Stall,
    pipe: fs::File,
}

impl Held<'_> {
    /// Lets the run go on: the image, then the end of the file. (The image is smaller than a
    /// pipe's buffer, so the write that does not wait writes all of it.)
    fn release(mut self) {
        self.pipe.write_all(&self.stall.image).unwrap();
        drop(self.pipe);
        self.stall.restore_mtime();
    }
}

/// A thread feeding a [`Stall`] to every run that reads it.
struct Feeder {
    stall: Arc<Stall>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // A reader that does not wait lets the feeder's blocked open return; it then stops.
        let c = CString::new(self.stall.path.as_os_str().as_bytes()).unwrap();
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK) };
        let _ = self.thread.take().unwrap().join();
        unsafe { libc::close(fd) };
        self.stall.restore_mtime();
    }
}

/// A `pack` run in a process group of its own, its stderr read line by line as it comes.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
}

impl Running {
    fn start(args: &[OsString]) -> Running {
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("pack"))
            .args(args)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines() {
                if tx.send(line.unwrap_or_default()).is_err() {
                    return;
                }
            }
        });
        Running { child, lines, stderr: Vec::new() }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process (`group`: to its process group).
    fn signal(&self, signal: i32, group: bool) {
        let pid = self.pid() as i32;
        assert_eq!(unsafe { libc::kill(if group { -pid } else { pid }, signal) }, 0);
    }

    /// What the process is doing, for a failure's message: whether it has exited, and else its
    /// state, where it waits in the kernel and which signals it blocks, catches and has pending.
    fn state(&mut self) -> String {
        if let Ok(Some(status)) = self.child.try_wait() {
            return format!("pack exited: {status}");
        }
        let proc = PathBuf::from(format!("/proc/{}", self.pid()));
        let status = fs::read_to_string(proc.join("status")).unwrap_or_default();
        let fields: Vec<&str> = status
            .lines()
            .filter(|l| {
                ["State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt", "Threads"].iter().any(|f| l.starts_with(f))
            })
            .collect();
        let wchan = fs::read_to_string(proc.join("wchan")).unwrap_or_default();
        format!("pack is running: {}; wchan {wchan}", fields.join(", "))
    }

    /// Waits for a line of stderr holding `text`, for at most a minute.
    fn wait_for_line(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.stderr.iter().any(|l| l.contains(text)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.stderr.push(line),
                Err(_) => {
                    let state = self.state();
                    panic!("no {text:?} on stderr: {:?}; {state}", self.stderr)
                }
            }
        }
    }

    /// Waits for the process to end: its exit code and all of its stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        self.stderr.extend(self.lines.iter());
        (status.code(), self.stderr.join("\n"))
    }
}

/// Runs `pack` to the end, feeding the stall: its exit code, stdout and stderr.
fn run(stall: &Arc<Stall>, args: &[OsString]) -> (Option<i32>, String, String) {
    let _feeder = stall.feeder();
    let out = Command::new(assert_cmd::cargo::cargo_bin("pack")).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// A finished run: exit 0, nothing left beside the output but the output.
fn assert_finished(result: &(Option<i32>, String, String), out: &Path, what: &str) {
    assert_eq!(result.0, Some(0), "{what}: {}", result.2);
    assert!(out.exists(), "{what}: no output");
    assert!(!lock_of(out).exists(), "{what}: the lock file is left");
    assert!(!temp_of(out).exists(), "{what}: the temporary is left");
}

/// `--json`'s summary of a finished run.
fn summary(stdout: &str) -> serde_json::Value {
    crate::util::summary(stdout.as_bytes())
}

/// An interrupted run left its checkpoint and published nothing.
fn assert_stopped_unpublished(out: &Path, what: &str) {
    assert!(!out.exists(), "{what}: an interrupted run published its output");
    let temp = temp_of(out);
    assert!(temp.join("imgpack-resume.json").exists(), "{what}: no checkpoint kept in {}", temp.display());
    assert!(imgpack_reader::open(&temp).is_err(), "{what}: the temporary opens as a dataset");
}

#[test]
fn a_signal_sent_to_the_child_and_then_its_group_is_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 6);
    let stall = Arc::new(Stall::new(&src));
    // Back to back, as `timeout` sends them (the kernel often merges the two), and the second
    // only once the first was handled (what kills a run whose handler is reset after one).
    for (to, handled_first) in [("webdataset", false), ("lmdb", true), ("webdataset", true), ("lmdb", false)]
    {
        let what = format!("{to}, second signal after the first was handled: {handled_first}");
        let reference = dir.path().join(format!("ref-{to}"));
        if !reference.exists() {
            assert_finished(&run(&stall, &args(&src, &reference, to)), &reference, &what);
        }
        let out = dir.path().join(format!("out-{to}-{handled_first}"));
        let mut running = Running::start(&args(&src, &out, to));
        let held = stall.hold();
        running.signal(libc::SIGINT, false);
        if handled_first {
            running.wait_for_line(PLEASE_WAIT);
        }
        running.signal(libc::SIGINT, true);
        // The run is held in its chunk; the stop happens once the chunk is loaded.
        running.wait_for_line(PLEASE_WAIT);
        std::thread::sleep(Duration::from_millis(100));
        held.release();
        let (code, stderr) = running.finish();
        assert_eq!(code, Some(130), "{what}: {stderr}");
        assert_eq!(stderr.matches(PLEASE_WAIT).count(), 1, "{what}: {stderr}");
        assert!(!stderr.contains(STOPPING_NOW), "{what}: a repeat within a second stopped at once: {stderr}");
        assert!(stderr.contains("error: interrupted:") && stderr.contains("--resume"), "{what}: {stderr}");
        assert_stopped_unpublished(&out, &what);
        assert!(!lock_of(&out).exists(), "{what}: a run stopped at a checkpoint left its lock file");

        let resumed = run(&stall, &with(&args(&src, &out, to), &["--resume", "--json"]));
        assert_finished(&resumed, &out, &what);
        assert!(summary(&resumed.1)["resumed"].as_u64().unwrap() > 0, "{what}: {}", resumed.1);
        assert_eq!(contents(&out), contents(&reference), "{what}: resumed output differs");
    }
}

#[test]
fn a_second_signal_a_moment_later_stops_at_once_and_resume_finishes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 6);
    let stall = Arc::new(Stall::new(&src));
    for (to, second) in [("webdataset", libc::SIGINT), ("lmdb", libc::SIGTERM)] {
        let reference = dir.path().join(format!("ref-{to}"));
        assert_finished(&run(&stall, &args(&src, &reference, to)), &reference, to);
        let out = dir.path().join(format!("out-{to}"));
        let mut running = Running::start(&args(&src, &out, to));
        // Held in the middle of a chunk, so the first stop cannot finish before the second
        // signal: as a slow checkpoint on a busy disk would be.
        let held = stall.hold();
        running.signal(libc::SIGINT, false);
        running.wait_for_line(PLEASE_WAIT);
        std::thread::sleep(Duration::from_millis(1500));
        running.signal(second, false);
        let (code, stderr) = running.finish();
        drop(held);
        assert_eq!(code, Some(130), "{to}: {stderr}");
        assert!(stderr.contains(STOPPING_NOW) && stderr.contains("--resume"), "{to}: {stderr}");
        assert!(!stderr.contains("error:"), "{to}: the run went on after 'stopping now': {stderr}");
        assert_stopped_unpublished(&out, to);
        // Like a kill: the lock is gone with the process, its file is left for the next run.
        assert!(lock_of(&out).exists(), "{to}: expected the lock file a stopped-at-once run leaves");

        let resumed = run(&stall, &with(&args(&src, &out, to), &["--resume", "--json"]));
        assert_finished(&resumed, &out, to);
        assert!(summary(&resumed.1)["resumed"].as_u64().unwrap() > 0, "{to}: {}", resumed.1);
        assert_eq!(contents(&out), contents(&reference), "{to}: resumed output differs");
        pack(&[&"verify", &out]).assert().code(0);
    }
}

/// Starts a run, waits until it is held at the stall, and kills it with SIGKILL.
fn kill_at_the_stall(stall: &Stall, args: &[OsString], out: &Path) {
    let running = Running::start(args);
    let held = stall.hold();
    running.signal(libc::SIGKILL, false);
    let pid = running.pid();
    let (code, _) = running.finish();
    assert_eq!(code, None, "killed");
    drop(held);
    let lock = lock_of(out);
    assert_eq!(fs::read_to_string(&lock).unwrap().trim(), pid.to_string(), "the lock file names its run");
}

#[test]
fn a_lock_file_left_by_kill_9_is_taken_over_by_the_next_run_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 6);
    let stall = Arc::new(Stall::new(&src));
    let reference = dir.path().join("ref");
    assert_finished(&run(&stall, &args(&src, &reference, "webdataset")), &reference, "reference");
    let expected = contents(&reference);

    // A fresh run, and one that replaces an output (--overwrite), after a killed one.
    let out = dir.path().join("fresh");
    kill_at_the_stall(&stall, &args(&src, &out, "webdataset"), &out);
    let again = run(&stall, &args(&src, &out, "webdataset"));
    assert_finished(&again, &out, "fresh run after kill -9");
    assert!(again.2.contains("discarded the unfinished run"), "{}", again.2);
    assert_eq!(contents(&out), expected);
    let overwrite = args(&src, &out, "webdataset");
    let overwrite = with(&overwrite, &["--overwrite"]);
    kill_at_the_stall(&stall, &overwrite, &out);
    assert_eq!(contents(&out), expected, "a killed --overwrite run changed the old output");
    assert_finished(&run(&stall, &overwrite), &out, "--overwrite after kill -9");
    assert_eq!(contents(&out), expected);

    // --resume after a killed run, for both formats.
    for to in ["webdataset", "lmdb"] {
        let reference = dir.path().join(format!("ref-{to}"));
        if !reference.exists() {
            assert_finished(&run(&stall, &args(&src, &reference, to)), &reference, to);
        }
        let out = dir.path().join(format!("resumed-{to}"));
        kill_at_the_stall(&stall, &args(&src, &out, to), &out);
        let resumed = run(&stall, &with(&args(&src, &out, to), &["--resume"]));
        assert_finished(&resumed, &out, &format!("{to}: --resume after kill -9"));
        assert_eq!(contents(&out), contents(&reference), "{to}");
    }
}

#[test]
fn stale_lock_files_do_not_stop_part_runs_merge_or_verify() {
    let fx = crate::util::Fixture::new();
    let plan = fx.out("plan.zst");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q"]).assert().code(0);
    let out = fx.out("parts");
    fs::create_dir(&out).unwrap();
    // Every lock a part run and a merge take, left by killed runs (pids that are gone).
    let parts = ["part-0000-of-0002", "part-0001-of-0002"];
    let mut stale: Vec<PathBuf> = parts.iter().map(|p| lock_of(&out.join(p))).collect();
    stale.push(lock_of(&out));
    for lock in &stale {
        fs::write(lock, b"4194304\n").unwrap();
    }
    for part in ["0/2", "1/2"] {
        pack(&[&plan, &"--part", &part, &"--to", &"webdataset", &"-o", &out, &"-q"]).assert().code(0);
    }
    pack(&[&"merge", &out, &"-q"]).assert().code(0);
    pack(&[&"verify", &out, &"-q"]).assert().code(0);
    for lock in &stale {
        assert!(!lock.exists(), "{} is left", lock.display());
    }
    assert_eq!(crate::util::dump(&out).1.len(), 31, "the merged dataset holds every sample");
}

/// Holds the lock of `out` as a live `pack` would: the lock file, with our pid, locked.
fn hold_lock(out: &Path) -> fs::File {
    let mut file = fs::OpenOptions::new().create(true).truncate(true).write(true).open(lock_of(out)).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    assert_eq!(unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) }, 0);
    writeln!(file, "{}", std::process::id()).unwrap();
    file
}

#[test]
fn a_lock_held_by_a_live_process_is_refused_naming_the_lock_file() {
    let fx = crate::util::Fixture::new();
    let out = fx.out("out");
    let lock = lock_of(&out);
    let held = hold_lock(&out);
    for extra in [&[][..], &["--resume"], &["--overwrite"]] {
        let mut cmd = pack(&[&fx.tree(), &"--to", &"lmdb", &"-o", &out]);
        cmd.args(extra);
        let refused = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(stderr.contains("another pack run is writing it"), "{extra:?}: {stderr}");
        assert!(
            stderr.contains(&lock.display().to_string()),
            "{extra:?}: the lock file is not named: {stderr}"
        );
        assert!(!out.exists() && !temp_of(&out).exists(), "{extra:?}: the refused run wrote something");
        assert!(lock.exists(), "{extra:?}: the refused run removed the holder's lock file");
    }
    // `pack merge OUT` takes the same lock as a run writing OUT.
    fs::create_dir(&out).unwrap();
    let refused = pack(&[&"merge", &out]).output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("another pack run is writing it"));
    fs::remove_dir(&out).unwrap();
    // Once the holder is gone, its file is taken over and removed.
    drop(held);
    pack(&[&fx.tree(), &"--to", &"lmdb", &"-o", &out, &"-q"]).assert().code(0);
    assert!(!lock.exists());
}
