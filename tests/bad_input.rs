//! Bad input: every bad file is skipped and listed (or stops the run), totals add up, and an
//! output appears only when complete.

use std::fs;
use std::os::unix::fs::symlink;

use crate::util::*;

const BAD: [&str; 4] = ["zero_bytes.jpg", "truncated_header.jpg", "html.jpg", "garbage.jpg"];

#[test]
fn bad_files_are_skipped_listed_and_totals_add_up() {
    let fx = Fixture::new();
    let bad: Vec<_> = BAD.iter().map(|name| fx.add_bad("space", name)).collect();
    symlink(fx.tree().join("nowhere.jpg"), fx.tree().join("cat/dangling.jpg")).unwrap();
    let out = fx.out("b.lmdb");
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--json"]).assert().code(3);
    let s = summary(&assert.get_output().stdout);
    let skipped = s["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 5);
    assert_eq!(s["found"].as_u64().unwrap(), s["packed"].as_u64().unwrap() + 5);
    let reason_of = |path: &std::path::Path| -> String {
        let entry = skipped.iter().find(|e| e["path"] == path.to_string_lossy().as_ref());
        entry.unwrap_or_else(|| panic!("{} not listed in {skipped:?}", path.display()))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(reason_of(&bad[0]), "empty file (0 bytes)");
    assert!(reason_of(&bad[1]).starts_with("corrupt or truncated jpg header"), "{}", reason_of(&bad[1]));
    assert!(reason_of(&bad[2]).contains("HTML page"), "{}", reason_of(&bad[2]));
    assert!(reason_of(&bad[3]).starts_with("not an image of a known format"), "{}", reason_of(&bad[3]));
    assert!(reason_of(&fx.tree().join("cat/dangling.jpg")).contains("dangling symlink"));

    let ds = imgpack_reader::open(&out).unwrap();
    assert_eq!(ds.len(), s["packed"].as_u64().unwrap());
    // Keys stay contiguous: the packed samples are the good files in order.
    let mut good = expected_samples(&fx.tree(), &ALL_EXTS);
    good.retain(|(rel, _)| !BAD.iter().any(|b| rel.ends_with(b)) && !rel.ends_with("dangling.jpg"));
    for (i, (rel, class)) in good.iter().enumerate() {
        let sample = ds.get(i as u64).unwrap();
        assert_eq!(sample.image().unwrap().1, &fs::read(fx.tree().join(rel)).unwrap()[..]);
        assert_eq!(sample.label().unwrap(), *class);
    }
}

#[test]
fn on_error_fail_stops_names_the_file_and_publishes_nothing() {
    let fx = Fixture::new();
    let bad = fx.add_bad("texture", "html.jpg");
    let out = fx.out("f.lmdb");
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--on-error", &"fail"])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains(&bad.display().to_string()), "{stderr}");
    assert!(stderr.contains("--on-error fail"), "the message says how to carry on: {stderr}");
    assert!(!out.exists(), "no output after a failed run");
    let leftovers: Vec<_> = fs::read_dir(fx.dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, ["tree"], "nothing but the source is left");
}

#[test]
fn existing_output_is_refused_unless_overwrite() {
    let fx = Fixture::new();
    let out = fx.out("x.lmdb");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("keep"), b"mine").unwrap();
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out]).assert().code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("already exists; pass --overwrite"), "{stderr}");
    assert_eq!(fs::read(out.join("keep")).unwrap(), b"mine");

    pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--overwrite", &"-q"])
        .assert()
        .code(0);
    assert!(!out.join("keep").exists());
    assert!(imgpack_reader::open(&out).is_ok());
}

#[test]
fn source_problems_name_the_path_and_the_fix() {
    let fx = Fixture::new();
    let out = fx.out("y.lmdb");
    let missing = fx.out("missing");
    let assert = pack(&[&"imagefolder", &missing, &"--to", &"lmdb", &"-o", &out]).assert().code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains(&format!("{}: does not exist", missing.display())), "{stderr}");
    let file = testdata().join("imagefolder/cat/chelsea_01.jpg");
    let assert = pack(&[&"imagefolder", &file, &"--to", &"lmdb", &"-o", &out]).assert().code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains(&format!("{}: is a file, neither a plan", file.display())), "{stderr}");
    let assert = pack(&[&"plan", &missing, &"-o", &fx.out("p.plan")]).assert().code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains(&format!("{}: does not exist", missing.display())), "{stderr}");
    let assert = pack(&[&"verify", &missing]).assert().code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(
        stderr.contains(&format!("{}: not a complete imgpack dataset: does not exist", missing.display())),
        "{stderr}"
    );

    let flat = fx.out("flat");
    fs::create_dir(&flat).unwrap();
    fs::copy(testdata().join("imagefolder/cat/chelsea_01.jpg"), flat.join("a.jpg")).unwrap();
    let assert = pack(&[&"imagefolder", &flat, &"--to", &"lmdb", &"-o", &out]).assert().code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("holds 1 image file but no class folders"), "{stderr}");
    assert!(stderr.contains("pass the directory above it"), "{stderr}");
    fs::remove_file(flat.join("a.jpg")).unwrap();
    let assert = pack(&[&"imagefolder", &flat, &"--to", &"lmdb", &"-o", &out]).assert().code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("has no class folders"), "{stderr}");

    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--extensions", &"gif"])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("no files with extensions gif"), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn symlinked_files_are_followed_and_loops_reported() {
    let fx = Fixture::new();
    let target = fx.tree().join("cat/chelsea_01.jpg");
    fs::create_dir(fx.tree().join("space/nested")).unwrap();
    symlink(&target, fx.tree().join("space/nested/link.jpg")).unwrap();
    symlink(fx.tree().join("space"), fx.tree().join("space/nested/loop")).unwrap();
    let out = fx.out("l.lmdb");
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--json"]).assert().code(0);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("symlink loop"), "{stderr}");
    let ds = imgpack_reader::open(&out).unwrap();
    let linked = ds
        .iter()
        .unwrap()
        .map(Result::unwrap)
        .find(|s| s.info().unwrap().path == "space/nested/link.jpg")
        .expect("the symlinked file is a sample");
    assert_eq!(linked.image().unwrap().1, &fs::read(&target).unwrap()[..]);
}

#[test]
fn images_directly_in_the_root_are_counted_in_a_warning() {
    let fx = Fixture::new();
    for name in ["stray_1.jpg", "stray_2.png"] {
        fs::copy(testdata().join("imagefolder/cat/chelsea_04.png"), fx.tree().join(name)).unwrap();
    }
    fs::write(fx.tree().join("notes.txt"), "not an image").unwrap();
    let out = fx.out("w.lmdb");
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--json"]).assert().code(0);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("2 image files directly in it are not samples"), "{stderr}");
    assert!(stderr.contains("pass the directory above it"), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&assert.get_output().stdout).unwrap();
    let warnings = summary["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w.as_str().unwrap().contains("2 image files directly in it")),
        "{summary}"
    );
    // The strays are no samples: the count is the tree's, as torchvision's.
    assert_eq!(summary["found"], summary["packed"]);
}

#[test]
fn an_empty_class_is_warned_about_once_where_the_tree_is_read_and_both_summaries_agree() {
    let fx = Fixture::new();
    fs::create_dir(fx.tree().join("zz_empty")).unwrap();
    let warning = "class \"zz_empty\" has no images";
    let run = |args: &[&dyn AsRef<std::ffi::OsStr>]| {
        let assert = pack(args).assert().code(0);
        let out = assert.get_output();
        (String::from_utf8_lossy(&out.stderr).into_owned(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let lmdb = fx.out("e.lmdb");
    let (stderr, human) = run(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &lmdb]);
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    assert!(human.contains("warnings  1 (listed above)"), "{human}");
    let (_, json) = run(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &fx.out("j.lmdb"), &"--json"]);
    let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(summary["warnings"].as_array().unwrap().len(), 1, "{summary}");
    assert!(summary["warnings"][0].as_str().unwrap().contains(warning), "{summary}");
    assert_eq!(summary["empty_classes"], serde_json::json!(["zz_empty"]));

    // Converting, planning and packing the plan: said where the tree is walked, and only there.
    let (stderr, json) =
        run(&[&lmdb, &"--to", &"webdataset", &"-o", &fx.out("c.wds"), &"--shuffle", &"--json"]);
    assert!(!stderr.contains(warning), "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(summary["warnings"], serde_json::json!([]), "{summary}");
    assert_eq!(summary["empty_classes"], serde_json::json!(["zz_empty"]), "still listed");
    let plan = fx.out("e.plan");
    let (stderr, _) = run(&[&"plan", &fx.tree(), &"-o", &plan]);
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    let (stderr, _) = run(&[&plan, &"--to", &"lmdb", &"-o", &fx.out("p.lmdb")]);
    assert!(!stderr.contains(warning), "{stderr}");
    for k in 0..2 {
        let (stderr, _) =
            run(&[&plan, &"--part", &format!("{k}/2"), &"--to", &"lmdb", &"-o", &fx.out("parts")]);
        assert!(!stderr.contains(warning), "{stderr}");
    }
}
