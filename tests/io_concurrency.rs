//! Reads in flight (`--io-threads`) are separate from the CPU workers (`--threads`), and neither
//! count changes what a run does: the same bytes out, the same files skipped for the same
//! reasons, `--on-error fail` stopping at the first bad file in listing order even when later
//! files were read first, and an interrupted run checkpointing and resuming. No timing here:
//! the speed on a slow source is measured by `benches/slow_source.py`.

use std::ffi::{CString, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

/// (`--io-threads`, `--threads`) pairs run against the defaults: one reader, more readers
/// than samples, fewer readers than workers, and counts that share no factor.
const COUNTS: [(&str, &str); 4] = [("1", "1"), ("64", "1"), ("1", "4"), ("7", "3")];

/// A tree of 4 x the testdata images plus bad files spread over the classes and a dangling
/// symlink, so that reads fail and succeed in every chunk.
fn tree(dir: &Path) -> PathBuf {
    let root = big_tree(dir, 4);
    for (class, name) in [
        ("cat", "zero_bytes.jpg"),
        ("space", "truncated.jpg"),
        ("still_life", "html.jpg"),
        ("texture", "garbage.jpg"),
    ] {
        fs::copy(testdata().join("bad").join(name), root.join(class).join(format!("01_bad_{name}"))).unwrap();
    }
    symlink(root.join("nowhere.jpg"), root.join("space/02_dangling.jpg")).unwrap();
    root
}

/// Packs `src` into `out` with `more` arguments; its exit code and JSON summary.
fn pack_json(src: &Path, out: &Path, to: &str, more: &[&str]) -> (i32, serde_json::Value) {
    let mut args: Vec<OsString> = vec!["imagefolder".into(), src.into(), "-o".into(), out.into()];
    args.extend(["--to", to, "--json", "--overwrite"].map(OsString::from));
    if to == "webdataset" {
        args.extend(["--shard-size", "200kB"].map(OsString::from));
    }
    args.extend(more.iter().map(OsString::from));
    let output = Command::new(assert_cmd::cargo::cargo_bin("pack")).args(&args).output().unwrap();
    let code = output.status.code().expect("exited");
    (code, summary(&output.stdout))
}

/// The skipped files of a summary, as (path, reason) in the order listed.
fn skipped(summary: &serde_json::Value) -> Vec<(String, String)> {
    summary["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["path"].as_str().unwrap().to_string(), s["reason"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn outputs_and_skipped_files_are_the_same_whatever_the_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let src = tree(dir.path());
    for (to, mode) in [
        ("lmdb", &["--mode", "passthrough"][..]),
        ("webdataset", &["--mode", "passthrough"][..]),
        ("lmdb", &["--mode", "reencode", "--resize-shorter", "24"][..]),
    ] {
        let what = format!("--to {to} {}", mode.join(" "));
        let reference = dir.path().join(format!("ref-{to}"));
        // Small chunks and checkpoints: many chunk boundaries for the readers to run across.
        let common = [mode, &["--checkpoint-bytes", "50kB"]].concat();
        let (code, want) = pack_json(&src, &reference, to, &common);
        assert_eq!(code, 3, "{what}: finished with skipped files");
        let want_skipped = skipped(&want);
        assert_eq!(want_skipped.len(), 5, "{what}: {want_skipped:?}");
        let reasons: Vec<&str> = want_skipped.iter().map(|(_, r)| r.as_str()).collect();
        assert!(reasons[0] == "empty file (0 bytes)", "{what}: {reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("dangling symlink")), "{what}: {reasons:?}");
        for (io, threads) in COUNTS {
            let out = dir.path().join(format!("out-{to}-{io}-{threads}"));
            let args = [&common[..], &["--io-threads", io, "--threads", threads]].concat();
            let (code, got) = pack_json(&src, &out, to, &args);
            let what = format!("{what} --io-threads {io} --threads {threads}");
            assert_eq!(code, 3, "{what}");
            assert_eq!(skipped(&got), want_skipped, "{what}: skipped files or reasons differ");
            assert_eq!(got["packed"], want["packed"], "{what}");
            if to == "lmdb" {
                assert_eq!(dump(&out), dump(&reference), "{what}: samples differ key by key");
            }
            assert_eq!(contents(&out), contents(&reference), "{what}: outputs differ");
            fs::remove_dir_all(&out).unwrap();
        }
    }
}

#[test]
fn on_error_fail_stops_at_the_first_bad_file_in_listing_order() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 2);
    // The first bad file comes late in the first class; a second one early in the last class
    // is read long before it by a large readahead, and must not be the one reported.
    let first = src.join("cat/zz_html.jpg");
    let later = src.join("texture/00_garbage.jpg");
    fs::copy(testdata().join("bad/html.jpg"), &first).unwrap();
    fs::copy(testdata().join("bad/garbage.jpg"), &later).unwrap();
    for counts in
        [&[][..], &["--io-threads", "64", "--threads", "1"], &["--io-threads", "1", "--threads", "4"]]
    {
        let out = dir.path().join("fail.lmdb");
        let mut cmd = pack(&[&"imagefolder", &src, &"--to", &"lmdb", &"-o", &out, &"--on-error", &"fail"]);
        let assert = cmd.args(counts).assert().code(1);
        let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
        assert!(stderr.contains(&first.display().to_string()), "{counts:?}: {stderr}");
        assert!(!stderr.contains("00_garbage"), "{counts:?}: named a later file: {stderr}");
        assert!(!out.exists(), "{counts:?}: published after a failure");
    }
}

#[test]
fn io_threads_of_zero_is_refused() {
    let fx = Fixture::new();
    let out = fx.out("z.lmdb");
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--io-threads", &"0"])
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("--io-threads") && stderr.contains("pass 1 or more"), "{stderr}");
}

/// A named pipe posing as an image: a reader that opens it blocks until the test closes its
/// end, and then reads an empty file.
struct Stall {
    path: PathBuf,
}

impl Stall {
    fn new(path: PathBuf) -> Stall {
        let stall = Stall { path };
        stall.make_pipe();
        stall
    }

    fn make_pipe(&self) {
        let c = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", self.path.display());
    }

    /// Waits (at most a minute) until `pack` has opened the pipe, and returns the writing end:
    /// the run cannot finish until it is dropped.
    fn hold(&self) -> fs::File {
        use std::os::unix::fs::OpenOptionsExt;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&self.path) {
                Ok(pipe) => return pipe,
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("pack never opened {}: {e}", self.path.display()),
            }
        }
    }

    /// Replaces the pipe with an empty file of the same size (0) and modification time, which
    /// `--resume` sees as unchanged and which reads as the pipe did.
    fn to_empty_file(&self) {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(&self.path).unwrap();
        fs::remove_file(&self.path).unwrap();
        fs::write(&self.path, b"").unwrap();
        let mtime = libc::timespec { tv_sec: meta.mtime(), tv_nsec: meta.mtime_nsec() };
        let times = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, mtime];
        let c = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) }, 0);
    }
}

#[test]
fn an_interrupted_run_with_many_readers_checkpoints_and_resumes_with_other_counts() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 6);
    // About three quarters into the listing: what comes after it is left for --resume.
    let stall = Stall::new(src.join("still_life/zz_stall.jpg"));
    for to in ["lmdb", "webdataset"] {
        let out = dir.path().join(format!("out-{to}"));
        let mut args: Vec<OsString> =
            vec!["imagefolder".into(), src.as_os_str().into(), "-o".into(), out.clone().into()];
        let options =
            ["--to", to, "--mode", "reencode", "--resize-shorter", "40", "--checkpoint-bytes", "20kB"];
        args.extend(options.map(OsString::from));
        if to == "webdataset" {
            args.extend(["--shard-size", "60kB"].map(OsString::from));
        }
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("pack"))
            .args(&args)
            .args(["--io-threads", "64", "--threads", "1"])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Held at the stall: what comes before it is being written, with checkpoints.
        let held = stall.hold();
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        // Let the handler see the signal before the held read returns.
        std::thread::sleep(Duration::from_millis(200));
        drop(held);
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(130), "{to}: {stderr}");
        assert!(stderr.contains("error: interrupted:") && stderr.contains("--resume"), "{to}: {stderr}");
        assert!(!out.exists(), "{to}: an interrupted run published its output");
        let temp = out.with_file_name(format!(".out-{to}.imgpack-tmp"));
        assert!(temp.join("imgpack-resume.json").exists(), "{to}: no checkpoint kept");

        // Resumed with other counts (they are not part of what a run records), it finishes with
        // exactly what one uninterrupted run writes.
        stall.to_empty_file();
        let resumed = Command::new(assert_cmd::cargo::cargo_bin("pack"))
            .args(&args)
            .args(["--resume", "--json", "--io-threads", "3", "--threads", "2"])
            .output()
            .unwrap();
        assert_eq!(resumed.status.code(), Some(3), "{to}: {}", String::from_utf8_lossy(&resumed.stderr));
        let s = summary(&resumed.stdout);
        let (resumed, found) = (s["resumed"].as_u64().unwrap(), s["found"].as_u64().unwrap());
        assert!(resumed > 0 && resumed < found, "{to}: kept {resumed} of {found} at the checkpoint");
        let reference = dir.path().join(format!("ref-{to}"));
        let status = Command::new(assert_cmd::cargo::cargo_bin("pack"))
            .args(&args[..2])
            .args(["-o".as_ref(), reference.as_os_str()])
            .args(&args[4..])
            .args(["-q"])
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(3), "{to}: the reference run skips the empty file");
        assert_eq!(contents(&out), contents(&reference), "{to}: resumed output differs");
        // The next format's run needs the pipe again.
        fs::remove_file(&stall.path).unwrap();
        stall.make_pipe();
    }
}
