//! Packing on many machines: a plan packed as 1 part and as 4 parts (separate processes, two
//! at once, one killed and run again), merged, reads exactly like a single run of the plan —
//! the same samples under the same keys, with the same bytes and labels — even when files
//! before a part's range were skipped. Merging refuses missing, foreign and unfinished parts by
//! name; a finished part run again does nothing; `--part auto` reads Slurm and Kubernetes.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::{big_tree, contents, dump, pack, testdata, wait_for, Dump, Fixture};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("pack")
}

/// `pack PLAN --part K/N --to FORMAT -o OUT` with options that give several shards per part
/// and many checkpoints.
fn part_command(plan: &Path, part: &str, to: &str, out: &Path) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg(plan).args(["--part", part, "--to", to, "-o"]).arg(out).args(["-q", "--json"]);
    cmd.args([
        "--mode",
        "reencode",
        "--resize-shorter",
        "40",
        "--threads",
        "1",
        "--checkpoint-bytes",
        "20kB",
    ]);
    if to == "webdataset" {
        // Small shards: each is a checkpoint, so a part can be killed after one, early on.
        cmd.args(["--shard-size", "60kB", "--shard-samples", "4"]);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Runs a command to completion; returns its exit code and JSON summary line.
fn finish(mut cmd: Command) -> (i32, serde_json::Value) {
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.lines().last().map_or(serde_json::Value::Null, |l| serde_json::from_str(l).unwrap());
    let code = out.status.code().unwrap();
    assert!(code == 0 || code == 3, "exit {code}: {}", String::from_utf8_lossy(&out.stderr));
    (code, json)
}

/// The samples of a dataset and the metadata that must not depend on how it was packed.
fn comparable(path: &Path) -> (serde_json::Value, Vec<(String, crate::util::Fields)>) {
    let (meta, samples): Dump = dump(path);
    let meta = serde_json::json!({
        "samples": meta.samples, "key_width": meta.key_width, "classes": meta.classes,
        "fields": meta.fields, "source": meta.source, "options": meta.options,
        "format": meta.format, "version": meta.version, "checksum": meta.checksum,
    });
    (meta, samples)
}

/// A tree of 16 copies of the test images (so a part outlasts its first chunk of 64 samples) with two corrupt files at the very start of the
/// plan (so every later part's keys must move down) and one in the last class.
fn tree_with_skips(dir: &Path) -> PathBuf {
    let root = big_tree(dir, 16);
    fs::copy(testdata().join("bad/zero_bytes.jpg"), root.join("cat/000_zero_bytes.jpg")).unwrap();
    fs::copy(testdata().join("bad/garbage.jpg"), root.join("cat/000_garbage.jpg")).unwrap();
    fs::copy(testdata().join("bad/truncated.jpg"), root.join("texture/99_truncated.jpg")).unwrap();
    root
}

#[test]
fn four_parts_merged_read_exactly_like_one_part_and_like_a_single_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = tree_with_skips(dir.path());
    let plan = dir.path().join("train.plan");
    pack(&[&"plan", &root, &"-o", &plan, &"-q"]).assert().code(0);
    for to in ["webdataset", "lmdb"] {
        // The single-machine reference: the plan packed in one run.
        let single = dir.path().join(format!("single-{to}"));
        let mut cmd = part_command(&plan, "0/1", to, &single);
        let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        // Same arguments without --part.
        cmd = Command::new(bin());
        let mut skip = 0;
        for a in &args {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if a == "--part" {
                skip = 1;
                continue;
            }
            cmd.arg(a);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let (code, summary) = finish(cmd);
        assert_eq!((code, summary["skipped"].as_array().unwrap().len()), (3, 3), "{to}");

        let one = dir.path().join(format!("one-{to}"));
        finish(part_command(&plan, "0/1", to, &one));
        let merged = pack(&[&"merge", &one, &"--json"]).assert().code(3);
        let report: serde_json::Value = serde_json::from_slice(&merged.get_output().stdout).unwrap();
        assert_eq!((report["parts"].as_u64(), report["skipped"].as_array().unwrap().len()), (Some(1), 3));

        let four = dir.path().join(format!("four-{to}"));
        // Parts 0 and 1 at the same time.
        let a = part_command(&plan, "0/4", to, &four).spawn().unwrap();
        let b = part_command(&plan, "1/4", to, &four).spawn().unwrap();
        for child in [a, b] {
            let out = child.wait_with_output().unwrap();
            assert!(matches!(out.status.code(), Some(0 | 3)), "{}", String::from_utf8_lossy(&out.stderr));
        }
        // Part 2 killed after its first checkpoint, then run again with the same command.
        let temp = four.join(".part-0002-of-0004.imgpack-tmp");
        let mut child = part_command(&plan, "2/4", to, &four).spawn().unwrap();
        wait_for(&temp.join("imgpack-resume.json"));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!four.join("part-0002-of-0004").exists(), "{to}: part 2 finished before it was killed");
        let refused = pack(&[&"merge", &four]).assert().code(1);
        let err = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
        assert!(err.contains("part 2 of 4 is still being written, or was interrupted"), "{to}: {err}");
        let (_, again) = finish(part_command(&plan, "2/4", to, &four));
        assert!(again["resumed"].as_u64().unwrap() > 0, "{to}: the killed part started over: {again}");
        finish(part_command(&plan, "3/4", to, &four));
        let merged = pack(&[&"merge", &four, &"--json"]).assert().code(3);
        let report: serde_json::Value = serde_json::from_slice(&merged.get_output().stdout).unwrap();
        assert_eq!(report["parts"].as_u64(), Some(4));
        assert_eq!(report["renumbered_parts"].as_u64(), Some(3), "{to}: parts 1-3 follow the skipped files");
        assert_eq!(
            report["packed"].as_u64().unwrap() + report["skipped"].as_array().unwrap().len() as u64,
            report["found"].as_u64().unwrap()
        );

        let reference = comparable(&single);
        assert_eq!(reference.1.len() as u64, report["packed"].as_u64().unwrap());
        for merged in [&one, &four] {
            let got = comparable(merged);
            assert_eq!(got.0, reference.0, "{to}: metadata of {}", merged.display());
            assert_eq!(got.1.len(), reference.1.len(), "{to}");
            for (g, r) in got.1.iter().zip(&reference.1) {
                assert!(g == r, "{to}: sample {} differs from the single run's {}", g.0, r.0);
            }
            pack(&[&"verify", merged]).assert().code(0);
        }
        if to == "lmdb" {
            // The parts were copied into one database and deleted.
            let left: Vec<_> = fs::read_dir(&four).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(left.len(), 2, "{left:?}");
        } else {
            // Four parts, each of several shards, listed in part order.
            let meta = dump(&four).0;
            assert!(meta.shards.len() >= 8, "{}", meta.shards.len());
            assert!(meta.shards[0].name.starts_with("part-0000-of-0004/"));
            assert!(meta.shards.last().unwrap().name.starts_with("part-0003-of-0004/"));
        }
        // Merging again changes nothing.
        let before = fs::metadata(four.join(if to == "lmdb" { "data.mdb" } else { "imgpack.json" })).unwrap();
        let again = pack(&[&"merge", &four, &"--json"]).assert().code(0);
        let report: serde_json::Value = serde_json::from_slice(&again.get_output().stdout).unwrap();
        assert_eq!(report["already_merged"].as_bool(), Some(true));
        let after = fs::metadata(four.join(if to == "lmdb" { "data.mdb" } else { "imgpack.json" })).unwrap();
        assert_eq!((before.ino(), before.mtime_nsec()), (after.ino(), after.mtime_nsec()));
    }
}

#[test]
fn merge_names_missing_unfinished_and_foreign_parts_and_publishes_nothing() {
    let fx = Fixture::new();
    let plan = fx.out("a.plan");
    let other = fx.out("b.plan");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q"]).assert().code(0);
    pack(&[&"plan", &fx.tree(), &"-o", &other, &"-q", &"--shuffle", &"--seed", &"3"]).assert().code(0);
    let out = fx.out("wds");
    let part = |plan: &Path, k: &str| {
        pack(&[&plan, &"--part", &k, &"--to", &"webdataset", &"-o", &out, &"-q"]).assert().code(0);
    };
    let merge_error = || {
        let assert = pack(&[&"merge", &out]).assert().code(1);
        String::from_utf8_lossy(&assert.get_output().stderr).into_owned()
    };
    fs::create_dir(&out).unwrap();
    let err = merge_error();
    assert!(err.contains("holds no parts"), "{err}");
    part(&plan, "0/3");
    part(&plan, "2/3");
    let err = merge_error();
    assert!(err.contains("part 1 of 3 is missing") && err.contains("--part 1/3"), "{err}");
    // A part being written (its temporary directory) is not a missing part.
    fs::create_dir(out.join(".part-0001-of-0003.imgpack-tmp")).unwrap();
    let err = merge_error();
    assert!(err.contains("part 1 of 3 is still being written, or was interrupted"), "{err}");
    fs::remove_dir(out.join(".part-0001-of-0003.imgpack-tmp")).unwrap();
    // A part from another plan (a shuffled one of the same tree).
    part(&other, "1/3");
    let err = merge_error();
    assert!(err.contains("part 1 of 3") && err.contains("another plan"), "{err}");
    assert!(!out.join("imgpack.json").exists() && imgpack_reader::open(&out).is_err());
    // Parts of different splits.
    part(&plan, "1/2");
    let err = merge_error();
    assert!(err.contains("different numbers of parts (N = 2, 3)"), "{err}");
    // A part alone is not a dataset, and the unmerged directory says what to do.
    let err = imgpack_reader::open(out.join("part-0000-of-0003")).unwrap_err().to_string();
    assert!(err.contains("part 0 of 3") && err.contains("pack merge"), "{err}");
    let err = imgpack_reader::open(&out).unwrap_err().to_string();
    assert!(err.contains("not merged yet"), "{err}");
    let converted = pack(&[&out, &"--to", &"lmdb", &"-o", &fx.out("converted")]).assert().code(1);
    let err = String::from_utf8_lossy(&converted.get_output().stderr).into_owned();
    assert!(err.contains("not merged yet") && err.contains("pack merge"), "{err}");
    // The right part replaces the foreign one with --overwrite; the other split goes.
    pack(&[&plan, &"--part", &"1/3", &"--to", &"webdataset", &"-o", &out, &"-q", &"--overwrite"])
        .assert()
        .code(0);
    fs::remove_dir_all(out.join("part-0001-of-0002")).unwrap();
    pack(&[&"merge", &out, &"-q"]).assert().code(0);
    assert_eq!(imgpack_reader::open(&out).unwrap().len(), 31);
    // Once merged, a part is not re-packed behind the merged files' back.
    let assert = pack(&[&plan, &"--part", &"1/3", &"--to", &"webdataset", &"-o", &out, &"--overwrite"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(err.contains("already holds the dataset merged from its parts"), "{err}");
    pack(&[&"verify", &out, &"-q"]).assert().code(0);
}

#[test]
fn a_finished_part_run_again_does_nothing_and_other_options_are_refused() {
    let fx = Fixture::new();
    let plan = fx.out("t.plan");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q"]).assert().code(0);
    let out = fx.out("lmdb");
    let run = |extra: &[&str]| {
        pack(&[&plan, &"--part", &"1/2", &"--to", &"lmdb", &"-o", &out, &"--json"]).args(extra).assert()
    };
    run(&[]).code(0);
    let data = out.join("part-0001-of-0002/data.mdb");
    let stamp = |p: &Path| fs::metadata(p).map(|m| (m.ino(), m.mtime_nsec())).unwrap();
    let before = stamp(&data);
    let again = run(&[]).code(0);
    let stderr = String::from_utf8_lossy(&again.get_output().stderr);
    assert!(stderr.contains("already packed by an earlier run"), "{stderr}");
    assert_eq!(stamp(&data), before);
    let err = run(&["--mode", "reencode"]).code(2);
    let stderr = String::from_utf8_lossy(&err.get_output().stderr);
    assert!(stderr.contains("other options") && stderr.contains("--overwrite"), "{stderr}");
    assert_eq!(stamp(&data), before);
}

#[test]
fn part_numbers_come_from_slurm_or_kubernetes() {
    let fx = Fixture::new();
    let plan = fx.out("t.plan");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q"]).assert().code(0);
    let out = fx.out("wds");
    let run = |vars: &[(&str, &str)], part: &str| {
        let mut cmd = pack(&[&plan, &"--part", &part, &"--to", &"webdataset", &"-o", &out, &"-q"]);
        cmd.env_remove("SLURM_ARRAY_TASK_ID").env_remove("JOB_COMPLETION_INDEX");
        cmd.envs(vars.iter().copied());
        cmd.assert()
    };
    // A Slurm array numbered from 1 (--array=1-3).
    run(
        &[("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "3")],
        "auto",
    )
    .code(0);
    run(
        &[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "3")],
        "auto",
    )
    .code(0);
    // A Kubernetes Indexed Job.
    run(&[("JOB_COMPLETION_INDEX", "1")], "auto/3").code(0);
    for k in 0..3 {
        assert!(out.join(format!("part-{k:04}-of-0003")).is_dir(), "part {k}");
    }
    let err = run(&[], "auto/3").code(2);
    assert!(String::from_utf8_lossy(&err.get_output().stderr).contains("JOB_COMPLETION_INDEX"));
    pack(&[&"merge", &out, &"-q"]).assert().code(0);
    assert_eq!(imgpack_reader::open(&out).unwrap().len(), 31);
    // --part needs a plan.
    let err = pack(&[&"imagefolder", &fx.tree(), &"--part", &"0/2", &"--to", &"lmdb", &"-o", &fx.out("x")])
        .assert()
        .code(2);
    assert!(String::from_utf8_lossy(&err.get_output().stderr).contains("pack plan"));
}

#[test]
fn more_parts_than_samples_gives_empty_parts_that_merge() {
    let fx = Fixture::new();
    let tiny = fx.out("tiny");
    fs::create_dir_all(tiny.join("a")).unwrap();
    fs::create_dir_all(tiny.join("b")).unwrap();
    fs::copy(fx.tree().join("cat/chelsea_01.jpg"), tiny.join("a/x.jpg")).unwrap();
    fs::copy(fx.tree().join("cat/chelsea_02.jpg"), tiny.join("b/y.jpg")).unwrap();
    let plan = fx.out("tiny.plan");
    pack(&[&"plan", &tiny, &"-o", &plan, &"-q"]).assert().code(0);
    for to in ["webdataset", "lmdb"] {
        let out = fx.out(&format!("five-{to}"));
        for k in 0..5 {
            let part = format!("{k}/5");
            pack(&[&plan, &"--part", &part, &"--to", &to, &"-o", &out, &"-q"]).assert().code(0);
        }
        pack(&[&"merge", &out, &"-q"]).assert().code(0);
        let ds = imgpack_reader::open(&out).unwrap();
        assert_eq!(ds.len(), 2, "{to}");
        let labels: Vec<Vec<u8>> =
            (0..2).map(|i| ds.get(i).unwrap().field("cls").unwrap().to_vec()).collect();
        assert_eq!(labels, [b"0".to_vec(), b"1".to_vec()], "{to}");
        pack(&[&"verify", &out, &"-q"]).assert().code(0);
    }
}

#[test]
fn an_interrupted_part_run_again_differently_starts_over_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    // Big enough that the run is still going when the first checkpoint lands, even on a busy machine.
    let root = big_tree(dir.path(), 16);
    let plan = dir.path().join("t.plan");
    pack(&[&"plan", &root, &"-o", &plan, &"-q"]).assert().code(0);
    let out = dir.path().join("wds");
    let temp = out.join(".part-0000-of-0002.imgpack-tmp");
    let mut child = part_command(&plan, "0/2", "webdataset", &out).spawn().unwrap();
    wait_for(&temp.join("imgpack-resume.json"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(temp.join("imgpack-resume.json").exists() && !out.join("part-0000-of-0002").exists());
    let mut again = part_command(&plan, "0/2", "webdataset", &out);
    again.args(["--quality", "50"]);
    let result = again.output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("started the part over, as the interrupted run was made differently"),
        "{stderr}"
    );
    assert!(stderr.contains("quality"), "{stderr}");
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("part-0000-of-0002/imgpack.json")).unwrap()).unwrap();
    assert_eq!(meta["options"]["quality"].as_u64(), Some(50));
    assert!(!temp.exists());
}

#[test]
fn the_same_part_started_twice_at_once_is_written_by_one_run_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = big_tree(dir.path(), 8);
    let plan = dir.path().join("t.plan");
    pack(&[&"plan", &root, &"-o", &plan, &"-q"]).assert().code(0);
    let out = dir.path().join("wds");
    let temp = out.join(".part-0000-of-0002.imgpack-tmp");
    let first = part_command(&plan, "0/2", "webdataset", &out).spawn().unwrap();
    wait_for(&temp);
    let second = part_command(&plan, "0/2", "webdataset", &out).output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("another pack run is writing it right now"), "{stderr}");
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", String::from_utf8_lossy(&first.stderr));
    let left: Vec<_> = fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["part-0000-of-0002"], "no lock or temporary left behind");
}

#[test]
fn a_merge_interrupted_while_rewriting_headers_is_finished_by_running_it_again() {
    let fx = Fixture::new();
    fx.add_bad("cat", "garbage.jpg"); // early in the plan: the later parts' keys move down
    let plan = fx.out("t.plan");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q"]).assert().code(0);
    let out = fx.out("wds");
    for k in 0..3 {
        let part = format!("{k}/3");
        pack(&[
            &plan,
            &"--part",
            &part,
            &"--to",
            &"webdataset",
            &"-o",
            &out,
            &"-q",
            &"--shard-samples",
            &"3",
        ])
        .assert()
        .code(if k == 0 { 3 } else { 0 });
    }
    let before = fx.out("before-merge");
    crate::util::copy_tree(&out, &before);
    pack(&[&"merge", &out, &"-q"]).assert().code(3);
    let merged = dump(&out);
    let meta_bytes = fs::read(out.join("imgpack.json")).unwrap();
    // As if killed halfway through: part 2's first shard and its .idx still as packed, the
    // others rewritten, and no imgpack.json yet.
    let part2 = "part-0002-of-0003";
    let shard = fs::read_dir(out.join(part2))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.ends_with("-000000.tar"))
        .unwrap();
    let idx = shard.replace(".tar", ".idx");
    for name in [&shard, &idx] {
        let (old, now) = (before.join(part2).join(name), out.join(part2).join(name));
        assert_ne!(fs::read(&old).unwrap(), fs::read(&now).unwrap(), "{name} was rewritten by the merge");
        fs::copy(old, now).unwrap();
    }
    fs::remove_file(out.join("imgpack.json")).unwrap();
    assert!(imgpack_reader::open(&out).is_err());
    pack(&[&"merge", &out, &"-q"]).assert().code(3);
    assert_eq!(fs::read(out.join("imgpack.json")).unwrap(), meta_bytes);
    assert!(dump(&out) == merged, "the second merge gives the first one's dataset");
    pack(&[&"verify", &out, &"-q"]).assert().code(0);
}

#[test]
fn a_shuffled_plan_packed_in_parts_merges_into_the_shuffled_single_run() {
    let fx = Fixture::new();
    let plan = fx.out("shuffled.plan");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q", &"--shuffle", &"--seed", &"11"]).assert().code(0);
    let single = fx.out("single");
    pack(&[&plan, &"--to", &"lmdb", &"-o", &single, &"-q"]).assert().code(0);
    let out = fx.out("parts");
    for k in ["2/3", "0/3", "1/3"] {
        pack(&[&plan, &"--part", &k, &"--to", &"lmdb", &"-o", &out, &"-q"]).assert().code(0);
    }
    pack(&[&"merge", &out, &"-q"]).assert().code(0);
    assert_eq!(crate::util::contents(&out), crate::util::contents(&single), "identical key by key");
}

#[test]
fn merging_a_single_runs_output_says_there_is_nothing_to_merge() {
    let fx = Fixture::new();
    for to in ["lmdb", "webdataset"] {
        let out = fx.out(&format!("single-{to}"));
        pack(&[&"imagefolder", &fx.tree(), &"--to", &to, &"-o", &out, &"-q"]).assert().code(0);
        let before = contents(&out);
        let merged = pack(&[&"merge", &out]).assert().code(0);
        let stdout = String::from_utf8_lossy(&merged.get_output().stdout).into_owned();
        assert!(stdout.contains("no parts in it") && stdout.contains("nothing to merge"), "{to}: {stdout}");
        assert!(!stdout.contains("already merged"), "{stdout}");
        let json = pack(&[&"merge", &out, &"--json"]).assert().code(0);
        let summary: serde_json::Value = serde_json::from_slice(&json.get_output().stdout).unwrap();
        assert_eq!((summary["parts"].as_u64(), summary["already_merged"].as_bool()), (Some(0), Some(true)));
        assert_eq!(contents(&out), before, "{to}: merge wrote into a single run's output");
    }
}
