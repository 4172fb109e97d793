//! `pack plan`: a tree walked once into a plan file; `pack PLAN` then writes exactly what
//! `pack SRC` writes, in every order and format, from any working directory.

use std::fs;
use std::os::unix::ffi::OsStrExt;

use crate::util::{contents, expected_samples, pack, Fixture, ALL_EXTS};

#[test]
fn packing_a_plan_writes_what_packing_the_tree_writes() {
    let fx = Fixture::new();
    // A name that is not UTF-8 travels through the plan exactly.
    fs::copy(
        fx.tree().join("cat/chelsea_01.jpg"),
        fx.tree().join("cat").join(std::ffi::OsStr::from_bytes(b"caf\xe9.jpg")),
    )
    .unwrap();
    let elsewhere = fx.out("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    for (shuffle, to) in [(false, "webdataset"), (true, "webdataset"), (false, "lmdb"), (true, "lmdb")] {
        let tag = format!("{}-{to}", if shuffle { "shuffled" } else { "sorted" });
        let order: &[&str] = if shuffle { &["--shuffle", "--seed", "7"] } else { &[] };
        let plan = fx.out(&format!("{tag}.plan"));
        // Plan and pack directly from the tree's parent, with the root given relative to it...
        pack(&[&"plan", &"tree", &"-o", &plan, &"-q"])
            .current_dir(fx.dir.path())
            .args(order)
            .assert()
            .code(0);
        let direct = fx.out(&format!("{tag}-direct"));
        pack(&[&"imagefolder", &"tree", &"--to", &to, &"-o", &direct, &"-q"])
            .current_dir(fx.dir.path())
            .args(order)
            .assert()
            .code(0);
        // ...and pack the plan from another directory: the plan knows where the files are.
        let planned = fx.out(&format!("{tag}-planned"));
        pack(&[&plan, &"--to", &to, &"-o", &planned, &"-q"]).current_dir(&elsewhere).assert().code(0);
        let (a, b) = (contents(&direct), contents(&planned));
        assert_eq!(a.len(), b.len(), "{tag}");
        for (name, bytes) in &a {
            assert!(b.get(name) == Some(bytes), "{tag}: {name} differs");
        }
    }
}

#[test]
fn a_plan_lists_every_sample_in_order_with_its_size_and_time() {
    let fx = Fixture::new();
    let plan = fx.out("t.plan");
    let assert = pack(&[&"plan", &fx.tree(), &"-o", &plan, &"--json"]).assert().code(0);
    let summary: serde_json::Value = serde_json::from_slice(&assert.get_output().stdout).unwrap();
    assert_eq!((summary["type"].as_str(), summary["samples"].as_u64()), (Some("plan"), Some(31)));
    // The documented format, read without the crate: zstd, then JSON Lines.
    let text = String::from_utf8(zstd::stream::decode_all(&fs::read(&plan).unwrap()[..]).unwrap()).unwrap();
    let mut lines = text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    let header = lines.next().unwrap();
    assert_eq!((header["format"].as_str(), header["version"].as_u64()), (Some("imgpack-plan"), Some(1)));
    assert_eq!(header["classes"], serde_json::json!(["cat", "space", "still_life", "texture"]));
    assert_eq!(header["root_abs"].as_str().unwrap(), fx.tree().canonicalize().unwrap().to_str().unwrap());
    let samples: Vec<serde_json::Value> = lines.collect();
    let expected = expected_samples(&fx.tree(), &ALL_EXTS);
    assert_eq!(samples.len(), expected.len());
    let mut total = 0;
    for (line, (path, class)) in samples.iter().zip(&expected) {
        assert_eq!(
            (line["path"].as_str().unwrap(), line["class"].as_u64().unwrap()),
            (path.as_str(), *class as u64)
        );
        let meta = fs::metadata(fx.tree().join(path)).unwrap();
        assert_eq!(line["size"].as_u64().unwrap(), meta.len(), "{path}");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            line["mtime_ns"].as_i64().unwrap(),
            meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            "{path}"
        );
        total += meta.len();
    }
    assert_eq!(header["bytes"].as_u64(), Some(total));
    assert_eq!(header["samples"].as_u64(), Some(expected.len() as u64));
}

#[test]
fn plans_refuse_what_they_cannot_honour() {
    let fx = Fixture::new();
    let plan = fx.out("t.plan");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q"]).assert().code(0);
    let exists = pack(&[&"plan", &fx.tree(), &"-o", &plan]).assert().code(1);
    assert!(String::from_utf8_lossy(&exists.get_output().stderr).contains("--overwrite"));
    let shuffled = pack(&[&plan, &"--to", &"lmdb", &"-o", &fx.out("x"), &"--shuffle"]).assert().code(2);
    assert!(String::from_utf8_lossy(&shuffled.get_output().stderr).contains("make the plan with --shuffle"));
    let not_a_plan = fx.out("notes.txt");
    fs::write(&not_a_plan, "hello").unwrap();
    let refused = pack(&[&not_a_plan, &"--to", &"lmdb", &"-o", &fx.out("y")]).assert().code(1);
    assert!(String::from_utf8_lossy(&refused.get_output().stderr).contains("neither a plan"));
    // A damaged plan is named, not half-used.
    let mut bytes = fs::read(&plan).unwrap();
    bytes.truncate(bytes.len() / 2);
    fs::write(&plan, bytes).unwrap();
    let damaged = pack(&[&plan, &"--to", &"lmdb", &"-o", &fx.out("z")]).assert().code(1);
    assert!(String::from_utf8_lossy(&damaged.get_output().stderr).contains("t.plan"), "names the plan");
    assert!(!fx.out("z").exists());
}

#[test]
fn zero_threads_is_a_bad_command_line_for_every_command() {
    let fx = Fixture::new();
    let plan = fx.out("t.plan");
    let out = fx.out("x");
    for args in [
        vec![&"plan" as &dyn AsRef<std::ffi::OsStr>, &fx.tree(), &"-o", &plan, &"--threads", &"0"],
        vec![&fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--threads", &"0"],
        vec![&"verify", &fx.tree(), &"--threads", &"0"],
        vec![&"merge", &fx.tree(), &"--threads", &"0"],
    ] {
        let assert = pack(&args).assert().code(2);
        let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
        assert!(stderr.contains("--threads") && stderr.contains("1 or more"), "{stderr}");
    }
    assert!(!plan.exists() && !out.exists());
}
