//! `pack bench-read` end to end on `testdata/`: every format detected and measured, byte counts
//! that match the source, cold runs that really evict, and `--json` / `--compare` / `--plot`.
//! No assertion is about speed.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::{copy_tree, pack, testdata};

/// A temporary directory on the build disk: `/tmp` may be tmpfs, which cannot be evicted.
fn disk_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

struct Packed {
    _dir: tempfile::TempDir,
    tree: PathBuf,
    lmdb: PathBuf,
    wds: PathBuf,
}

fn packed() -> Packed {
    let dir = disk_tempdir();
    let tree = dir.path().join("tree");
    copy_tree(&testdata().join("imagefolder"), &tree);
    let lmdb = dir.path().join("t.lmdb");
    let wds = dir.path().join("t.wds");
    pack(&[&"imagefolder", &tree, &"--to", &"lmdb", &"-o", &lmdb, &"-q"]).assert().success();
    pack(&[&"imagefolder", &tree, &"--to", &"webdataset", &"-o", &wds, &"-q"]).assert().success();
    Packed { _dir: dir, tree, lmdb, wds }
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The bytes of every image file under `tree`.
fn tree_bytes(tree: &Path) -> (u64, usize) {
    let mut total = 0;
    let mut count = 0;
    for class in fs::read_dir(tree).unwrap() {
        for file in fs::read_dir(class.unwrap().path()).unwrap() {
            total += file.unwrap().metadata().unwrap().len();
            count += 1;
        }
    }
    (total, count)
}

#[test]
fn measures_every_format_in_one_run_with_exact_byte_counts() {
    let p = packed();
    let (tree_total, n) = tree_bytes(&p.tree);
    let json = p.tree.parent().unwrap().join("run.json");
    let svg = p.tree.parent().unwrap().join("run.svg");
    let samples = n.to_string();
    let out = pack(&[
        &"bench-read",
        &p.tree,
        &p.lmdb,
        &p.wds,
        &"--threads",
        &"1,2",
        &"--samples",
        &samples,
        &"--save",
        &json,
        &"--plot",
        &svg,
    ])
    .assert()
    .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for kind in ["files (open+read)", "lmdb (map faults)", "lmdb (reader)", "webdataset (pread)"] {
        assert!(stdout.contains(kind), "{kind} missing from:\n{stdout}");
    }
    assert!(stdout.contains("knee:"), "{stdout}");

    let ms = read_jsonl(&json);
    assert_eq!(ms.len(), 8, "4 inputs x 2 levels");
    let kinds: Vec<(String, String, u64)> = ms
        .iter()
        .map(|m| {
            (
                m["format"].as_str().unwrap().into(),
                m["access"].as_str().unwrap().into(),
                m["threads"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(kinds[0], ("files".into(), "open+read".into(), 1));
    assert_eq!(kinds[1], ("files".into(), "open+read".into(), 2));
    assert_eq!(kinds[2].0, "lmdb");
    assert_eq!(kinds[4].1, "reader");
    assert_eq!(kinds[6], ("webdataset".into(), "pread".into(), 1));

    // One pass over every sample: the raw-file reads add up to the tree's bytes exactly, and
    // the packed formats read at least the image bytes (plus labels and tar headers).
    let wds_meta: Value = serde_json::from_slice(&fs::read(p.wds.join("imgpack.json")).unwrap()).unwrap();
    let shard_bytes: u64 =
        wds_meta["shards"].as_array().unwrap().iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    for m in &ms {
        assert_eq!(m["samples"].as_u64().unwrap(), n as u64, "{m}");
        assert_eq!(m["pattern"], "random");
        assert_eq!(m["cache"], "warm");
        let bytes = m["bytes"].as_u64().unwrap();
        match m["format"].as_str().unwrap() {
            "files" => assert_eq!(bytes, tree_total),
            "lmdb" => assert!(bytes > tree_total && bytes < tree_total + 200 * n as u64, "{bytes}"),
            _ => assert!(bytes > tree_total && bytes < shard_bytes, "{bytes} vs shards {shard_bytes}"),
        }
        let lat = &m["latency_us"];
        let (p50, p99, max) =
            (lat["p50"].as_f64().unwrap(), lat["p99"].as_f64().unwrap(), lat["max"].as_f64().unwrap());
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{lat}");
        assert!(lat["p99.9"].as_f64().unwrap() <= max);
        assert!(m["samples_per_s"].as_f64().unwrap() > 0.0);
        assert!(m["resident_before"].as_f64().unwrap() > 0.95, "warm-up leaves the files cached: {m}");
        assert!(!m["device"]["filesystem"].as_str().unwrap().is_empty());
        // The memory floor: the same reads summing copies, summarised like the reads, and the
        // ratio the table prints. Nothing about speed: only that it is there and consistent.
        let floor = &m["floor_us"];
        let (f50, f99, fmax) =
            (floor["p50"].as_f64().unwrap(), floor["p99"].as_f64().unwrap(), floor["max"].as_f64().unwrap());
        assert!(0.0 < f50 && f50 <= f99 && f99 <= fmax, "{floor}");
        assert!(floor["mean"].as_f64().unwrap() > 0.0, "{floor}");
        let x = m["x_floor"].as_f64().unwrap();
        assert!((x - p50 / f50).abs() <= 1e-9 * x, "x_floor {x} is not p50 {p50} / floor p50 {f50}");
        // Every sample fits in the copies here, so no read went without a floor.
        assert!(!m["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("floor")), "{m}");
    }
    assert!(stdout.contains("×floor") && stdout.contains("floor µs"), "{stdout}");
    let svg = fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("t.lmdb"), "plot names the datasets");
}

#[test]
fn cold_runs_evict_and_verify_with_mincore() {
    let p = packed();
    let json = p.tree.parent().unwrap().join("cold.json");
    pack(&[
        &"bench-read",
        &p.tree,
        &p.lmdb,
        &p.wds,
        &"--threads",
        &"1",
        &"--cache",
        &"cold",
        &"--save",
        &json,
        &"-q",
    ])
    .assert()
    .success();
    let ms = read_jsonl(&json);
    assert_eq!(ms.len(), 4);
    for m in &ms {
        assert_eq!(m["cache"], "cold");
        let after = m["resident_before"].as_f64().unwrap();
        assert!(after <= 0.05, "eviction left {after} of the pages cached: {m}");
        assert!(m["resident_before_eviction"].as_f64().is_some());
        assert!(
            !m["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("did not take")),
            "{m}"
        );
    }
}

#[test]
fn compare_reads_json_from_several_runs() {
    let p = packed();
    let dir = p.tree.parent().unwrap();
    let (a, b) = (dir.join("a.json"), dir.join("b.json"));
    for (json, threads) in [(&a, "1"), (&b, "1,2")] {
        pack(&[&"bench-read", &p.lmdb, &"--threads", &threads, &"--samples", &"20", &"--save", json, &"-q"])
            .assert()
            .success();
    }
    let out = pack(&[&"bench-read", &"--compare", &a, &b]).assert().success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(stdout.contains("[1] ") && stdout.contains("a.json") && stdout.contains("b.json"), "{stdout}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("t.lmdb, lmdb (reader)")).collect();
    assert_eq!(rows.len(), 2, "one row per thread level:\n{stdout}");
    // The 2-thread row has a cell only in the second run.
    assert!(rows[1].split_whitespace().any(|w| w == "-"), "{stdout}");
    // Each cell ends with the ratio to the memory floor.
    assert!(stdout.contains("×floor"), "{stdout}");
    let ratio = rows[0].rsplit(" | ").next().unwrap().trim();
    assert!(ratio.parse::<f64>().unwrap() > 0.0, "{stdout}");
    // --compare output is itself valid input for --plot.
    let svg = dir.join("cmp.svg");
    pack(&[&"bench-read", &"--compare", &a, &b, &"--plot", &svg]).assert().success();
    assert!(fs::read_to_string(svg).unwrap().contains("<svg"));
}

#[test]
fn compare_reads_files_saved_before_the_memory_floor() {
    let p = packed();
    let dir = p.tree.parent().unwrap();
    let (old, new) = (dir.join("old.json"), dir.join("new.json"));
    pack(&[&"bench-read", &p.lmdb, &"--threads", &"1", &"--samples", &"10", &"--save", &new, &"-q"])
        .assert()
        .success();
    // The same run as an older `pack` wrote it: no floor fields.
    let stripped: String = read_jsonl(&new)
        .into_iter()
        .map(|mut m| {
            let object = m.as_object_mut().unwrap();
            assert!(object.remove("floor_us").is_some() && object.remove("x_floor").is_some());
            format!("{m}\n")
        })
        .collect();
    fs::write(&old, stripped).unwrap();
    let out = pack(&[&"bench-read", &"--compare", &old, &new]).assert().success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let row = stdout.lines().find(|l| l.starts_with("t.lmdb, lmdb (reader)")).unwrap();
    let cells: Vec<&str> = row.split(" | ").collect();
    assert_eq!(cells.len(), 7, "two cells of four figures: {row}");
    assert_eq!(cells[3].split_whitespace().next(), Some("-"), "no ratio for the old file: {row}");
    assert!(cells[6].trim().parse::<f64>().is_ok(), "a ratio for the new one: {row}");
    // And --json passes them through with the fields absent as null.
    let out = pack(&[&"bench-read", &"--compare", &old, &"--json"]).assert().success();
    let line = String::from_utf8_lossy(&out.get_output().stdout).lines().next().unwrap().to_string();
    let m: Value = serde_json::from_str(&line).unwrap();
    assert!(m["floor_us"].is_null() && m["x_floor"].is_null(), "{m}");
}

#[test]
fn file_mode_reads_aligned_blocks_directly() {
    let dir = disk_tempdir();
    let file = dir.path().join("blocks.bin");
    fs::write(&file, vec![7u8; 64 * 1024]).unwrap();
    let json = dir.path().join("f.json");
    pack(&[
        &"bench-read",
        &"--file",
        &file,
        &"--block-size",
        &"4KiB",
        &"--direct",
        &"--threads",
        &"1",
        &"--samples",
        &"16",
        &"--save",
        &json,
        &"-q",
    ])
    .assert()
    .success();
    let ms = read_jsonl(&json);
    assert_eq!(ms.len(), 1);
    let m = &ms[0];
    assert_eq!((m["format"].as_str(), m["access"].as_str()), (Some("file"), Some("block pread")));
    assert_eq!(m["samples"], 16);
    assert_eq!(m["bytes"], 16 * 4096, "16 distinct 4 KiB blocks");
    assert_eq!(m["direct"], true);
    assert_eq!(m["cache"], "bypassed");
}

#[test]
fn bad_paths_are_named_with_what_to_do() {
    let dir = disk_tempdir();
    let file = dir.path().join("x.bin");
    fs::write(&file, b"data").unwrap();
    let out = pack(&[&"bench-read", &file]).assert().code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains("x.bin") && stderr.contains("--file"), "{stderr}");

    let missing = dir.path().join("nope");
    let out = pack(&[&"bench-read", &missing]).assert().code(1);
    assert!(String::from_utf8_lossy(&out.get_output().stderr).contains("nope"));

    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let out = pack(&[&"bench-read", &empty]).assert().failure();
    assert!(String::from_utf8_lossy(&out.get_output().stderr).contains("ImageFolder"));

    let bad_json = dir.path().join("bad.json");
    fs::write(&bad_json, "not json\n").unwrap();
    let out = pack(&[&"bench-read", &"--compare", &bad_json]).assert().failure();
    assert!(String::from_utf8_lossy(&out.get_output().stderr).contains("line 1"));

    pack(&[&"bench-read", &dir.path(), &"--threads", &"0"]).assert().code(2);
}
