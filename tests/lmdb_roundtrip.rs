//! ImageFolder -> LMDB: every sample comes back byte for byte with its label, in order.

use std::fs;

use imgpack_reader::{ImageFormat, Sample};

use crate::util::*;

#[test]
fn every_sample_round_trips_bytes_labels_and_count() {
    let fx = Fixture::new();
    let out = fx.out("train.lmdb");
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--json"]).assert().code(0);
    let summary = summary(&assert.get_output().stdout);

    let expected = expected_samples(&fx.tree(), &ALL_EXTS);
    assert!(expected.len() >= 20, "testdata should hold a real tree");
    assert_eq!(summary["found"], expected.len());
    assert_eq!(summary["packed"], expected.len());
    assert_eq!(summary["skipped"].as_array().unwrap().len(), 0);

    let ds = imgpack_reader::open(&out).unwrap();
    assert_eq!(ds.len(), expected.len() as u64);
    assert_eq!(ds.classes(), ["cat", "space", "still_life", "texture"]);
    let samples: Vec<Sample> = ds.iter().unwrap().map(Result::unwrap).collect();
    assert_eq!(samples.len(), expected.len());
    for (i, (sample, (rel, class))) in samples.iter().zip(&expected).enumerate() {
        assert_eq!(sample.key, format!("{i:08}"));
        let source = fs::read(fx.tree().join(rel)).unwrap();
        let (format, bytes) = sample.image().unwrap();
        assert_eq!(bytes, &source[..], "bytes of {rel}");
        assert_eq!(Some(format), ImageFormat::sniff(&source), "format of {rel}");
        assert_eq!(sample.label().unwrap(), *class, "label of {rel}");
        let info = sample.info().unwrap();
        assert_eq!(info.path, *rel);
        assert_eq!(info.class, ds.classes()[*class as usize]);
        assert_eq!(sample, &ds.get(i as u64).unwrap(), "get({i}) agrees with iter()");
    }
    let formats = &summary["formats"];
    let total: u64 = formats.as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(total, expected.len() as u64);
}

#[test]
fn image_field_is_named_by_content_not_file_name() {
    let fx = Fixture::new();
    let out = fx.out("o.lmdb");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"-q"]).assert().code(0);
    let ds = imgpack_reader::open(&out).unwrap();
    let sample = ds
        .iter()
        .unwrap()
        .map(Result::unwrap)
        .find(|s| s.info().unwrap().path == "cat/png_named.JPEG")
        .expect("png_named.JPEG is packed");
    assert!(sample.field("png").is_some(), "a PNG named .JPEG is stored as png: {:?}", sample.fields);
    assert!(sample.field("jpg").is_none());
}

#[test]
fn output_is_identical_key_by_key_whatever_the_thread_count() {
    let fx = Fixture::new();
    fx.add_bad("cat", "zero_bytes.jpg");
    let mut dumps = Vec::new();
    for threads in ["1", "2", "8"] {
        let out = fx.out(&format!("t{threads}.lmdb"));
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--threads", &threads, &"-q"])
            .assert()
            .code(3);
        dumps.push(dump(&out));
    }
    assert_eq!(dumps[0], dumps[1]);
    assert_eq!(dumps[0], dumps[2]);
}

#[test]
fn shuffle_permutes_deterministically() {
    let fx = Fixture::new();
    let run = |name: &str, extra: &[&str]| {
        let out = fx.out(name);
        let mut cmd = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"-q"]);
        cmd.args(extra).assert().code(0);
        dump(&out)
    };
    let plain = run("plain.lmdb", &[]);
    let a = run("a.lmdb", &["--shuffle", "--seed", "7"]);
    let b = run("b.lmdb", &["--shuffle", "--seed", "7"]);
    let c = run("c.lmdb", &["--shuffle", "--seed", "8"]);
    assert_eq!(a, b, "same seed, same dataset");
    assert_ne!(a.1, c.1, "another seed, another order");
    assert_ne!(plain.1, a.1);
    let contents = |d: &Dump| {
        let mut v: Vec<_> = d.1.iter().map(|(_, fields)| fields.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(contents(&plain), contents(&a), "a permutation: same samples, same labels");
    assert_eq!(a.0.options["seed"], 7);
    assert_eq!(a.0.options["shuffle"], true);
}

#[test]
fn metadata_records_what_the_dataset_holds() {
    let fx = Fixture::new();
    let out = fx.out("m.lmdb");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"-q", &"--extensions", &"jpg,PNG"])
        .assert()
        .code(0);
    let ds = imgpack_reader::open(&out).unwrap();
    let meta = ds.meta();
    assert_eq!(meta.format, "imgpack-lmdb");
    assert_eq!(meta.key_width, 8);
    assert_eq!(meta.samples, expected_samples(&fx.tree(), &["jpg", "png"]).len() as u64);
    assert_eq!(meta.fields, ["cls", "jpg", "json", "png"]);
    assert_eq!(meta.options["extensions"], serde_json::json!(["jpg", "png"]));
    assert_eq!(meta.options["mode"], "passthrough");
    assert!(meta.tool.starts_with("imgpack "));
    assert_eq!(meta.source.root, fx.tree().to_string_lossy());
}

#[test]
fn empty_class_keeps_its_index_and_is_warned_about() {
    let fx = Fixture::new();
    fs::create_dir(fx.tree().join("aaa_empty")).unwrap();
    let out = fx.out("e.lmdb");
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out]).assert().code(0);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("warning: class \"aaa_empty\" has no images"), "{stderr}");
    let ds = imgpack_reader::open(&out).unwrap();
    assert_eq!(ds.classes()[0], "aaa_empty");
    assert_eq!(ds.get(0).unwrap().label().unwrap(), 1, "the first real class is index 1");
}

#[test]
fn summary_is_printed_and_no_progress_bar_when_stderr_is_not_a_terminal() {
    let fx = Fixture::new();
    let out = fx.out("s.lmdb");
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out]).assert().code(0);
    let output = assert.get_output();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let n = expected_samples(&fx.tree(), &ALL_EXTS).len();
    assert!(stdout.starts_with(&format!("packed {n} of {n} files into")), "{stdout}");
    assert!(output.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
}
