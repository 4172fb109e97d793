//! The command line as a user meets it: one meaning per flag in every subcommand (`--json`,
//! `-q`), errors as JSON, unknown commands, flags before SRC, `pack info` and `pack ls`, the
//! summary's formats and skipped groups, and the progress bar on a real terminal.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::util::*;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Every stdout line as JSON; each must parse and carry a `"type"`.
fn json_lines(output: &Output) -> Vec<Value> {
    let text = stdout(output);
    assert!(!text.trim().is_empty(), "no JSON on stdout; stderr: {}", stderr(output));
    text.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
            assert!(value["type"].is_string(), "no type: {line}");
            value
        })
        .collect()
}

/// A fixture tree packed as LMDB (source order) and as shuffled WebDataset shards of 7 samples.
struct Packed {
    fixture: Fixture,
}

impl Packed {
    fn new() -> Packed {
        let fixture = Fixture::new();
        let tree = fixture.tree();
        pack(&[&tree, &"--to", &"lmdb", &"-o", &fixture.out("a.lmdb"), &"-q"]).assert().success();
        pack(&[
            &tree,
            &"--to",
            &"webdataset",
            &"-o",
            &fixture.out("w"),
            &"--shuffle",
            &"--seed",
            &"5",
            &"--shard-samples",
            &"7",
            &"-q",
        ])
        .assert()
        .success();
        Packed { fixture }
    }
    fn lmdb(&self) -> std::path::PathBuf {
        self.fixture.out("a.lmdb")
    }
    fn wds(&self) -> std::path::PathBuf {
        self.fixture.out("w")
    }
}

#[test]
fn json_is_a_switch_in_every_subcommand_and_prints_typed_lines() {
    let p = Packed::new();
    let f = &p.fixture;
    let tree = f.tree();
    let (plan, j1, j2, lmdb, wds) = (f.out("t.plan"), f.out("j1"), f.out("j2"), p.lmdb(), p.wds());
    let runs: Vec<(Vec<&dyn AsRef<std::ffi::OsStr>>, &str)> = vec![
        (vec![&"imagefolder", &tree, &"--to", &"lmdb", &"-o", &j1], "summary"),
        (vec![&lmdb, &"--to", &"webdataset", &"-o", &j2], "summary"),
        (vec![&"plan", &tree, &"-o", &plan], "plan"),
        (vec![&"verify", &wds], "verify"),
        (vec![&"merge", &lmdb], "merge"),
        (vec![&"info", &lmdb], "info"),
        (vec![&"ls", &wds], "sample"),
        (vec![&"bench-read", &lmdb, &"--threads", &"1", &"--samples", &"5"], "measurement"),
    ];
    for (args, kind) in runs {
        let mut argv = args.clone();
        argv.push(&"--json");
        let out = pack(&argv).output().unwrap();
        assert!(out.status.success(), "{kind}: {}", stderr(&out));
        let lines = json_lines(&out);
        assert!(lines.iter().all(|l| l["type"] == kind), "{kind}: {lines:?}");
        // -q: no human summary, no table, no bar (stdout empty); JSON still wins with both.
        let mut quiet = args.clone();
        quiet.push(&"-q");
        if kind == "summary" || kind == "plan" {
            quiet.push(&"--overwrite");
        }
        let out = pack(&quiet).output().unwrap();
        assert!(out.status.success(), "{kind} -q: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{kind} -q prints nothing on stdout");
    }
    // The ls lines are the samples; bench-read's lines are one per (input, access, level).
    let ls = json_lines(&pack(&[&"ls", &p.wds(), &"--json"]).output().unwrap());
    assert_eq!(ls.len(), 31);
    let mut bench = pack(&[&"bench-read", &p.lmdb(), &"--threads", &"1,2", &"--samples", &"5", &"--json"]);
    let bench = json_lines(&bench.output().unwrap());
    assert_eq!(bench.len(), 4, "lmdb read two ways at two levels: {bench:?}");
}

#[test]
fn bench_read_saves_with_save_and_explains_an_old_json_file_argument() {
    let p = Packed::new();
    let saved = p.fixture.out("m.jsonl");
    let out = pack(&[&"bench-read", &p.lmdb(), &"--threads", &"1", &"--samples", &"5", &"--save", &saved])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("lmdb (reader)"), "the table is printed: {}", stdout(&out));
    let lines: Vec<Value> =
        fs::read_to_string(&saved).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l["type"] == "measurement" && l["samples"] == 5));
    // --save - puts the same lines on stdout, and nothing else.
    let out = pack(&[&"bench-read", &p.lmdb(), &"--threads", &"1", &"--samples", &"5", &"--save", &"-"])
        .output()
        .unwrap();
    assert_eq!(json_lines(&out).len(), 2);
    // The files --compare reads are the ones --save wrote.
    let out = pack(&[&"bench-read", &"--compare", &saved]).output().unwrap();
    assert!(out.status.success() && stdout(&out).contains("lmdb"), "{}", stderr(&out));
    // `--json FILE`, as before --json became a switch: FILE is not measured as a dataset.
    let out = pack(&[&"bench-read", &p.lmdb(), &"--json", &"nvme.json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("pass --save nvme.json"), "{}", stderr(&out));
}

#[test]
fn a_failed_run_under_json_prints_one_error_object() {
    let f = Fixture::new();
    let (tree, nothere, x) = (f.tree(), f.out("nothere"), f.out("x"));
    let cases: Vec<(Vec<&dyn AsRef<std::ffi::OsStr>>, i32, &str)> = vec![
        (vec![&"verify", &nothere], 1, "does not exist"),
        (vec![&tree, &"--to", &"lmdb"], 2, "--output"),
        (vec![&tree, &"--to", &"lmdb", &"-o", &x, &"--quality", &"80"], 2, "--quality"),
        (vec![&"info", &tree], 1, "not a complete imgpack dataset"),
        (vec![&"frobnicate"], 2, "unknown command 'frobnicate'"),
    ];
    for (mut args, code, needle) in cases {
        args.push(&"--json");
        let out = pack(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{needle}: {}", stderr(&out));
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["type"], "error");
        assert_eq!(lines[0]["exit_code"], code);
        let message = lines[0]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{needle} not in {message}");
        assert!(stderr(&out).contains(needle), "the message goes to stderr too");
        // Without --json, stdout stays empty.
        args.pop();
        assert_eq!(stdout(&pack(&args).output().unwrap()), "");
    }
}

#[test]
fn an_unknown_command_is_named_with_a_close_match_and_the_list() {
    let out = pack(&[&"inof", &"x.lmdb"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("unknown command 'inof'; did you mean 'info'?"), "{err}");
    assert!(err.contains("commands: imagefolder, bench-read, plan, verify, merge, info, ls"), "{err}");
    let err = stderr(&pack(&[&"frobnicate"]).output().unwrap());
    assert!(err.contains("unknown command 'frobnicate'") && !err.contains("did you mean"), "{err}");
    // A path that exists is a source, whatever it is called.
    let f = Fixture::new();
    let out = pack(&[&"tree", &"--to", &"lmdb", &"-o", &"o.lmdb", &"-q"])
        .current_dir(f.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn flags_before_src_work_as_after_it() {
    let f = Fixture::new();
    let (before, after) = (f.out("before.lmdb"), f.out("after.lmdb"));
    pack(&[&"--to", &"lmdb", &"-o", &before, &"--shuffle", &"-q", &f.tree()]).assert().success();
    pack(&[&f.tree(), &"--to", &"lmdb", &"-o", &after, &"--shuffle", &"-q"]).assert().success();
    let (a, b) = (dump(&before), dump(&after));
    assert_eq!(a.1.len(), 31);
    assert_eq!(a, b, "the same dataset key by key");
}

#[test]
fn usage_and_help_never_show_the_hidden_convert() {
    let f = Fixture::new();
    let outputs = [
        pack(&[&"--help"]).output().unwrap(),
        pack(&[&f.tree(), &"--bogus"]).output().unwrap(),
        pack(&[&f.tree(), &"--help"]).output().unwrap(),
        pack(&[&"--to", &"lmdb"]).output().unwrap(),
    ];
    for out in &outputs {
        let text = format!("{}{}", stdout(out), stderr(out));
        assert!(text.contains("Usage: pack <SRC> --to <FORMAT> -o <OUT>"), "{text}");
        assert!(!text.contains("pack convert"), "{text}");
    }
    let man = stdout(&pack(&[&"man"]).output().unwrap());
    assert!(!man.contains("PACK CONVERT") && man.contains("PACK INFO") && man.contains("PACK LS"));
}

/// Files per class of the fixture tree, counted by walking it.
fn class_counts(tree: &Path) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (path, _) in expected_samples(tree, &ALL_EXTS) {
        *counts.entry(path.split('/').next().unwrap().to_string()).or_default() += 1;
    }
    counts
}

#[test]
fn info_says_what_a_dataset_holds() {
    let p = Packed::new();
    let expected = class_counts(&p.fixture.tree());
    let total: u64 = expected.values().sum();
    for path in [p.lmdb(), p.wds()] {
        let info = &json_lines(&pack(&[&"info", &path, &"--json"]).output().unwrap())[0];
        assert_eq!(info["samples"], total);
        let classes: Vec<&str> =
            info["classes"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        assert_eq!(classes, expected.keys().map(String::as_str).collect::<Vec<_>>());
        let counts: Vec<u64> =
            info["class_counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
        assert_eq!(counts, expected.values().copied().collect::<Vec<_>>());
        assert_eq!(info["fields"]["cls"]["samples"], total);
        assert_eq!(info["fields"]["json"]["samples"], total);
        let image_bytes: u64 = expected_samples(&p.fixture.tree(), &ALL_EXTS)
            .iter()
            .map(|(rel, _)| fs::metadata(p.fixture.tree().join(rel)).unwrap().len())
            .sum();
        let stored: u64 = info["fields"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(ext, _)| *ext != "cls" && *ext != "json")
            .map(|(_, s)| s["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(stored, image_bytes, "passthrough stores the source bytes");
        assert_eq!(info["source_root"], p.fixture.tree().to_str().unwrap());
        assert_eq!(info["tool"], format!("imgpack {}", env!("CARGO_PKG_VERSION")));
        assert_eq!(info["checksum"], "crc32");
        assert_eq!(info["mode"], "passthrough");
        assert!(info["bytes_on_disk"].as_u64().unwrap() > image_bytes);
    }
    let lmdb = &json_lines(&pack(&[&"info", &p.lmdb(), &"--json"]).output().unwrap())[0];
    assert_eq!((lmdb["format"].as_str(), lmdb["shuffle"].as_bool()), (Some("lmdb"), Some(false)));
    assert!(lmdb["shards"].is_null());
    let wds = &json_lines(&pack(&[&"info", &p.wds(), &"--json"]).output().unwrap())[0];
    assert_eq!((wds["shuffle"].as_bool(), wds["seed"].as_u64()), (Some(true), Some(5)));
    let tars: Vec<u64> = fs::read_dir(p.wds())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .map(|p| fs::metadata(p).unwrap().len())
        .collect();
    let shards = &wds["shards"];
    assert_eq!(shards["count"], tars.len() as u64);
    assert_eq!(shards["min_bytes"], *tars.iter().min().unwrap());
    assert_eq!(shards["max_bytes"], *tars.iter().max().unwrap());
    assert_eq!((shards["min_samples"].as_u64(), shards["max_samples"].as_u64()), (Some(3), Some(7)));

    let text = stdout(&pack(&[&"info", &p.wds()]).output().unwrap());
    for needle in [
        &format!("WebDataset dataset (imgpack-webdataset version {})", imgpack_reader::FORMAT_VERSION),
        &format!("samples    {total} in {} classes", expected.len()),
        &format!("shards     {}", tars.len()),
        "order      shuffled with seed 5",
        "checksums  crc32 per sample, crc32 per shard",
        "mode       passthrough",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    // The largest class comes first in the histogram.
    let (largest, n) = expected.iter().max_by_key(|(name, n)| (**n, std::cmp::Reverse(*name))).unwrap();
    let first_row = text.lines().find(|l| l.starts_with("    ") && l.contains('#')).unwrap();
    assert!(first_row.contains(largest.as_str()) && first_row.contains(&n.to_string()), "{first_row}");
}

#[test]
fn info_counts_the_parts_a_webdataset_was_merged_from() {
    let f = Fixture::new();
    let plan = f.out("t.plan");
    pack(&[&"plan", &f.tree(), &"-o", &plan, &"-q"]).assert().success();
    for k in ["0/3", "1/3", "2/3"] {
        pack(&[&plan, &"--part", &k, &"--to", &"webdataset", &"-o", &f.out("m"), &"-q"]).assert().success();
    }
    pack(&[&"merge", &f.out("m"), &"-q"]).assert().success();
    let info = &json_lines(&pack(&[&"info", &f.out("m"), &"--json"]).output().unwrap())[0];
    assert_eq!(info["parts"], 3);
    assert!(stdout(&pack(&[&"info", &f.out("m")]).output().unwrap()).contains("merged from 3 parts"));
}

#[test]
fn ls_lists_every_sample_with_its_source_and_field_sizes() {
    let p = Packed::new();
    let tree = p.fixture.tree();
    let expected = expected_samples(&tree, &ALL_EXTS);
    let out = pack(&[&"ls", &p.lmdb()]).output().unwrap();
    let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), expected.len());
    for (i, (line, (rel, label))) in lines.iter().zip(&expected).enumerate() {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols[0], format!("{i:08}"));
        assert_eq!(cols[1], label.to_string());
        assert_eq!(cols[3], rel, "sample {i} is the torchvision sample");
        // The image is stored by its real format (a PNG named .JPEG is `png`), unchanged.
        let size = fs::metadata(tree.join(rel)).unwrap().len();
        let image: Vec<&str> =
            cols[4].split(' ').filter(|f| !f.starts_with("cls:") && !f.starts_with("json:")).collect();
        assert_eq!(image.len(), 1, "{line}");
        assert!(image[0].ends_with(&format!(":{size}")), "{line}");
    }
    let out = pack(&[&"ls", &p.wds(), &"--limit", &"3", &"--json"]).output().unwrap();
    let entries = json_lines(&out);
    assert_eq!(entries.len(), 3);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["index"], i as u64);
        let rel = e["path"].as_str().unwrap();
        let (_, label) = expected.iter().find(|(r, _)| r == rel).unwrap();
        assert_eq!(e["label"], *label);
        assert_eq!(e["class"], rel.split('/').next().unwrap());
        let image: u64 = e["fields"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(ext, _)| *ext != "cls" && *ext != "json")
            .map(|(_, n)| n.as_u64().unwrap())
            .sum();
        assert_eq!(image, fs::metadata(tree.join(rel)).unwrap().len());
    }
}

#[test]
fn the_summary_shows_formats_in_and_stored_and_groups_skipped_files() {
    let f = Fixture::new();
    for name in ["zero_bytes.jpg", "garbage.jpg", "html.jpg", "truncated.jpg"] {
        f.add_bad("cat", name);
    }
    let out = pack(&[&f.tree(), &"--to", &"lmdb", &"-o", &f.out("r.lmdb"), &"--mode", &"reencode"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let text = stdout(&out);
    let json = summary(
        &pack(&[&f.tree(), &"--to", &"lmdb", &"-o", &f.out("r2.lmdb"), &"--mode", &"reencode", &"--json"])
            .output()
            .unwrap()
            .stdout,
    );
    let packed = json["packed"].as_u64().unwrap();
    assert_eq!(json["stored"], serde_json::json!({ "jpg": packed }));
    assert!(json["formats"]["png"].as_u64().unwrap() > 0);
    assert!(text.contains(&format!(" in; stored as jpg {packed}\n")), "{text}");
    assert!(text.contains("    2  not an image of a known format\n"), "{text}");
    assert!(
        text.contains("    1  empty file\n") && text.contains("    1  corrupt or truncated jpg\n"),
        "{text}"
    );
    assert!(text.contains("zero_bytes.jpg: empty file (0 bytes)\n"), "{text}");
    assert_eq!(json["skipped"].as_array().unwrap().len(), 4);
}

#[test]
fn part_and_merge_summaries_name_files_as_the_plan_root_was_given() {
    let f = Fixture::new();
    f.add_bad("cat", "zero_bytes.jpg");
    pack(&[&"plan", &"tree", &"-o", &"t.plan", &"-q"]).current_dir(f.dir.path()).assert().success();
    // The parts run from elsewhere: files are read under the plan's absolute root.
    let elsewhere = tempfile::tempdir().unwrap();
    let mut texts = Vec::new();
    for k in ["0/2", "1/2"] {
        let out = pack(&[&f.out("t.plan"), &"--part", &k, &"--to", &"lmdb", &"-o", &f.out("p")])
            .current_dir(elsewhere.path())
            .output()
            .unwrap();
        assert!(out.status.code() == Some(0) || out.status.code() == Some(3), "{}", stderr(&out));
        texts.push(stdout(&out));
    }
    texts.push(stdout(&pack(&[&"merge", &f.out("p")]).output().unwrap()));
    let named: Vec<&str> =
        texts.iter().flat_map(|t| t.lines()).filter(|l| l.contains("zero_bytes.jpg")).collect();
    assert_eq!(named.len(), 2, "one part and the merge name it: {texts:?}");
    for line in named {
        assert_eq!(line.trim(), "tree/cat/zero_bytes.jpg: empty file (0 bytes)");
    }
}

#[test]
fn the_progress_bar_shows_one_rate_and_an_eta_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let tree = big_tree(dir.path(), 20);
    let out_dir = dir.path().join("o.wds");
    // `script` gives pack a pseudo-terminal for stderr, as a user's shell does.
    let command = format!(
        "{} {} --to webdataset -o {} --threads 1 --mode reencode --resize-shorter 32",
        assert_cmd::cargo::cargo_bin("pack").display(),
        tree.display(),
        out_dir.display()
    );
    let out = std::process::Command::new("script").args(["-qefc", &command, "/dev/null"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let screen = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    assert!(screen.contains("packed 620 of 620 files"), "{screen}");
    let frames: Vec<&str> = screen.lines().filter(|l| l.contains(" files ") && l.contains("ETA")).collect();
    assert!(!frames.is_empty(), "no bar drawn:\n{screen}");
    assert!(!screen.contains("0/0"), "no empty bar: {screen}");
    let rated: Vec<&&str> =
        frames.iter().filter(|l| l.contains("files/s, ") && l.contains(" MB/s")).collect();
    assert!(!rated.is_empty(), "the rate in files/s and MB/s: {frames:?}");
    for frame in rated {
        // One rate: "N files/s, M MB/s" once, and whole files per second.
        assert_eq!(frame.matches("/s").count(), 2, "{frame}");
        let rate = frame.split(" files/s").next().unwrap().rsplit(' ').next().unwrap();
        assert!(rate.replace(',', "").parse::<u64>().is_ok(), "{rate} in {frame}");
    }
}
