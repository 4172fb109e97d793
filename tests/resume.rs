//! Crash safety and `--resume`: a run killed (SIGKILL) at any moment leaves no output that
//! looks complete, and `--resume` finishes it into exactly what an uninterrupted run writes,
//! keeping the shards already written; Ctrl-C stops at a checkpoint with exit 130; a changed
//! source is refused with what changed; a full disk (a file size limit here) is reported with
//! its cause and fix and nothing is published.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{big_tree, contents, pack, wait_for};

/// The arguments of one run: re-encoding makes it slow enough to kill halfway.
fn args(src: &Path, out: &Path, to: &str) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> =
        vec!["imagefolder".into(), src.into(), "-o".into(), out.into(), "-q".into()];
    for a in ["--to", to, "--mode", "reencode", "--resize-shorter", "40", "--threads", "2"] {
        args.push(a.into());
    }
    if to == "webdataset" {
        args.extend(["--shard-size".into(), "120kB".into()]);
    }
    // Small chunks and LMDB checkpoints, so there are many moments to interrupt.
    args.extend(["--checkpoint-bytes".into(), "20kB".into()]);
    args
}

fn command(args: &[std::ffi::OsString]) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("pack"));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn temp_of(out: &Path) -> PathBuf {
    out.with_file_name(format!(".{}.imgpack-tmp", out.file_name().unwrap().to_string_lossy()))
}

/// (inode, mtime in ns) of each shard the journal in `temp` lists as finished.
fn journaled_shards(temp: &Path) -> Vec<(String, (u64, i64))> {
    let Ok(raw) = fs::read(temp.join("imgpack-resume.json")) else { return Vec::new() };
    let journal: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    journal["progress"]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let name = s["name"].as_str().unwrap().to_string();
            let m = fs::metadata(temp.join(&name)).unwrap();
            (name, (m.ino(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))
        })
        .collect()
}

#[test]
fn killed_at_random_moments_then_resumed_gives_the_uninterrupted_output() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 4);
    for to in ["webdataset", "lmdb"] {
        let reference = dir.path().join(format!("ref-{to}"));
        let started = Instant::now();
        assert!(command(&args(&src, &reference, to)).status().unwrap().success());
        let full = started.elapsed();
        let expected = contents(&reference);
        // Kill points spread over the run, from its very start to past its end, and two
        // right after a checkpoint (the first, and the second journal written).
        let mut kept_total = 0;
        let points =
            [Some(0.02), Some(0.2), Some(0.4), Some(0.6), Some(0.8), Some(0.97), Some(1.1), None, None];
        for (n, fraction) in points.into_iter().enumerate() {
            let out = dir.path().join(format!("out-{to}-{n}"));
            let temp = temp_of(&out);
            let mut child = command(&args(&src, &out, to)).spawn().unwrap();
            match fraction {
                Some(fraction) => std::thread::sleep(full.mul_f64(fraction)),
                None => {
                    let journal = temp.join("imgpack-resume.json");
                    let seen = |j: &Path| fs::metadata(j).map(|m| (m.ino(), m.mtime_nsec())).ok();
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let mut journals = 0;
                    let mut last = None;
                    while journals < n - 6 && Instant::now() < deadline {
                        let now = seen(&journal);
                        if now.is_some() && now != last {
                            journals += 1;
                            last = now;
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
            // Nothing that looks complete: either no output at all, or the whole of it.
            if out.exists() {
                assert_eq!(contents(&out), expected, "{to} kill {n}: a published output must be complete");
                assert!(!temp.exists(), "{to} kill {n}: published, yet a temporary is left");
                continue;
            }
            if temp.exists() {
                assert!(
                    imgpack_reader::open(&temp).is_err(),
                    "{to} kill {n}: the temporary opens as a dataset"
                );
            }
            let kept = journaled_shards(&temp);
            kept_total += kept.len();
            let mut resume = args(&src, &out, to);
            resume.push("--resume".into());
            let result = command(&resume).output().unwrap();
            assert!(result.status.success(), "{to} kill {n}: {}", String::from_utf8_lossy(&result.stderr));
            assert_eq!(contents(&out), expected, "{to} kill {n}: resumed output differs");
            for (name, stamp) in kept {
                let m = fs::metadata(out.join(&name)).unwrap();
                let now = (m.ino(), m.mtime() * 1_000_000_000 + m.mtime_nsec());
                assert_eq!(now, stamp, "{to} kill {n}: finished shard {name} was rewritten");
            }
            assert!(!temp.exists());
            pack(&[&"verify", &out]).assert().code(0);
        }
        if to == "webdataset" {
            assert!(kept_total > 0, "no kill landed after a finished shard; the run is too short to test");
        }
    }
}

/// Runs until the journal shows a checkpoint, then sends `signal`.
fn interrupt_after_a_checkpoint(
    args: &[std::ffi::OsString],
    out: &Path,
    signal: i32,
) -> std::process::Output {
    let child = command(args).spawn().unwrap();
    let journal = temp_of(out).join("imgpack-resume.json");
    wait_for(&journal);
    unsafe { libc::kill(child.id() as i32, signal) };
    child.wait_with_output().unwrap()
}

#[test]
fn ctrl_c_stops_at_a_checkpoint_with_exit_130_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 4);
    for to in ["webdataset", "lmdb"] {
        let reference = dir.path().join(format!("ref-{to}"));
        assert!(command(&args(&src, &reference, to)).status().unwrap().success());
        let out = dir.path().join(format!("out-{to}"));
        let stopped = interrupt_after_a_checkpoint(&args(&src, &out, to), &out, libc::SIGINT);
        let stderr = String::from_utf8_lossy(&stopped.stderr);
        assert_eq!(stopped.status.code(), Some(130), "{to}: {stderr}");
        assert!(stderr.contains("interrupted:") && stderr.contains("--resume"), "{stderr}");
        assert!(!out.exists(), "an interrupted run published its output");
        let mut resume = args(&src, &out, to);
        resume.push("--resume".into());
        resume.push("--json".into());
        let done = command(&resume).output().unwrap();
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
        let summary = crate::util::summary(&done.stdout);
        assert!(summary["resumed"].as_u64().unwrap() > 0, "{summary}");
        assert_eq!(summary["packed"], 31 * 4);
        assert_eq!(contents(&out), contents(&reference), "{to}");
    }
}

#[test]
fn resume_refuses_a_changed_source_or_other_options_and_says_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 3);
    let out = dir.path().join("out");
    let run = args(&src, &out, "webdataset");
    let stopped = interrupt_after_a_checkpoint(&run, &out, libc::SIGTERM);
    assert_eq!(stopped.status.code(), Some(130));
    let mut resume = run.clone();
    resume.push("--resume".into());

    // Other options.
    let mut other = resume.clone();
    other.push("--shuffle".into());
    let refused = command(&other).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot resume") && stderr.contains("options.shuffle: false -> true"),
        "{stderr}"
    );

    // A file added, one removed, one modified.
    fs::copy(src.join("cat/00_chelsea_01.jpg"), src.join("cat/zz_new.jpg")).unwrap();
    fs::remove_file(src.join("space/01_alpha.png")).unwrap();
    let modified = src.join("texture/02_brick_01.jpg");
    let mut bytes = fs::read(&modified).unwrap();
    bytes.extend_from_slice(b"tail");
    fs::write(&modified, bytes).unwrap();
    let refused = command(&resume).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    for expected in [
        "source changed",
        "1 added (cat/zz_new.jpg)",
        "1 removed (space/01_alpha.png)",
        "1 modified (texture/02_brick_01.jpg)",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in {stderr}");
    }
    assert!(!out.exists());
    // Without --resume the leftover is discarded, with a warning, and the run starts over.
    let mut fresh = run.clone();
    fresh.retain(|a| a != "-q");
    let done = command(&fresh).output().unwrap();
    assert!(done.status.success());
    assert!(String::from_utf8_lossy(&done.stderr).contains("discarded the unfinished run"));
    pack(&[&"verify", &out]).assert().code(0);
}

#[test]
fn a_file_size_limit_is_named_with_its_fix_and_resume_finishes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 2);
    for to in ["webdataset", "lmdb"] {
        // WebDataset: one shard, larger than the limit.
        let sized = |out: &Path| {
            let mut run = args(&src, out, to);
            if let Some(at) = run.iter().position(|a| a == "120kB") {
                run[at] = "10MB".into();
            }
            run
        };
        let reference = dir.path().join(format!("ref-{to}"));
        assert!(command(&sized(&reference)).status().unwrap().success());
        let out = dir.path().join(format!("out-{to}"));
        let mut run = sized(&out);
        let mut limited = command(&run);
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            limited.pre_exec(|| {
                let limit = libc::rlimit { rlim_cur: 64_000, rlim_max: libc::RLIM_INFINITY };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let failed = limited.output().unwrap();
        let stderr = String::from_utf8_lossy(&failed.stderr);
        assert_eq!(failed.status.code(), Some(1), "{to}: {stderr}");
        assert!(stderr.contains("file size limit") && stderr.contains("--resume"), "{to}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!out.exists(), "{to}: a failed run published its output");
        run.push("--resume".into());
        let done = command(&run).output().unwrap();
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
        assert_eq!(contents(&out), contents(&reference), "{to}");
        pack(&[&"verify", &out]).assert().code(0);
    }
}

#[test]
fn ctrl_c_while_unpacking_publishes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 20);
    let lmdb = dir.path().join("all.lmdb");
    pack(&[&"imagefolder", &src, &"--to", &"lmdb", &"-o", &lmdb, &"-q"]).assert().code(0);
    let out = dir.path().join("tree");
    let child = command(&[
        lmdb.into_os_string(),
        "--to".into(),
        "imagefolder".into(),
        "-o".into(),
        out.clone().into_os_string(),
        "--threads".into(),
        "1".into(),
    ])
    .spawn()
    .unwrap();
    // The temporary appears once the handler is installed and the run has started.
    let temp = temp_of(&out);
    wait_for(&temp);
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let stopped = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("nothing was kept or published"), "{stderr}");
    assert!(!out.exists(), "an interrupted unpack published a partial tree");
    assert!(!temp.exists(), "an unpack has no checkpoints to keep");
}

#[test]
fn resume_of_a_finished_run_is_already_complete_and_writes_nothing() {
    let fx = crate::util::Fixture::new();
    for to in ["lmdb", "webdataset"] {
        let out = fx.out(&format!("done-{to}"));
        let run: Vec<std::ffi::OsString> = [
            "imagefolder".as_ref(),
            fx.tree().as_os_str(),
            "--to".as_ref(),
            to.as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ]
        .iter()
        .map(|a| a.to_os_string())
        .collect();
        assert!(command(&run).output().unwrap().status.success());
        let before = contents(&out);
        let modified = |p: &Path| fs::metadata(p).unwrap().modified().unwrap();
        let meta_file = if to == "lmdb" { out.join("data.mdb") } else { out.join("imgpack.json") };
        let stamp = modified(&meta_file);

        let mut resume = run.clone();
        resume.push("--resume".into());
        let again = command(&resume).output().unwrap();
        let stdout = String::from_utf8_lossy(&again.stdout);
        assert_eq!(again.status.code(), Some(0), "{to}: {}", String::from_utf8_lossy(&again.stderr));
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
        assert!(stdout.contains("is already complete") && stdout.contains("nothing was written"), "{stdout}");
        assert_eq!(contents(&out), before, "{to}");
        assert_eq!(modified(&meta_file), stamp, "{to}: rewritten");

        let mut json = resume.clone();
        json.push("--json".into());
        let summary = crate::util::summary(&command(&json).output().unwrap().stdout);
        assert_eq!(summary["nothing_done"], true, "{summary}");
        assert_eq!(summary["packed"], summary["found"]);

        // Made by another command: refused, saying what differs, and left as it is.
        let mut other = resume.clone();
        other.push("--shuffle".into());
        let refused = command(&other).output().unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("another command made") && stderr.contains("shuffle"), "{stderr}");
        assert!(stderr.contains("--overwrite"), "{stderr}");
        assert_eq!(contents(&out), before);
    }
}

#[test]
fn resume_refuses_a_kept_shard_that_was_cut_short_or_removed_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_tree(dir.path(), 4);
    let out = dir.path().join("out");
    let temp = temp_of(&out);
    // Interrupted once the journal lists a closed shard, so there is one to keep.
    let child = command(&args(&src, &out, "webdataset")).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while journaled_shards(&temp).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let stopped = child.wait_with_output().unwrap();
    assert_eq!(stopped.status.code(), Some(130), "{}", String::from_utf8_lossy(&stopped.stderr));
    let (shard, _) = journaled_shards(&temp).into_iter().next().expect("a shard was kept");
    let len = fs::metadata(temp.join(&shard)).unwrap().len();

    let mut resume = args(&src, &out, "webdataset");
    resume.push("--resume".into());
    fs::OpenOptions::new().write(true).open(temp.join(&shard)).unwrap().set_len(len - 512).unwrap();
    let refused = command(&resume).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    let cut = format!("{shard} is {} bytes, the journal says {len}", len - 512);
    assert!(stderr.contains("cannot resume") && stderr.contains(&cut), "{stderr}");
    assert!(stderr.contains("run without --resume to start over"), "{stderr}");

    fs::remove_file(temp.join(&shard)).unwrap();
    let refused = command(&resume).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&format!("{shard} is missing, the journal lists it with {len} bytes")),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is published");
}
