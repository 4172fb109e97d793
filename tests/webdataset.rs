//! ImageFolder -> WebDataset: shards within their size, indexes that agree with the tar
//! headers, byte-identical output whatever the thread count, and the reader reads it all back.

use std::fs;
use std::path::Path;

use imgpack_reader::webdataset::{parse_dali_index, parse_member, WidsIndex};
use md5::{Digest, Md5};

use crate::util::*;

fn pack_wds(fx: &Fixture, name: &str, extra: &[&str]) -> (std::path::PathBuf, serde_json::Value) {
    let out = fx.out(name);
    let mut cmd = pack(&[&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &out, &"--json"]);
    let assert = cmd.args(extra).assert().code(0);
    (out, summary(&assert.get_output().stdout))
}

fn shards(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    v.sort();
    v
}

#[test]
fn shards_round_trip_and_respect_the_size_limit() {
    let fx = Fixture::new();
    let (out, summary) = pack_wds(&fx, "wds", &["--shard-size", "100kB"]);
    let expected = expected_samples(&fx.tree(), &ALL_EXTS);
    assert_eq!(summary["packed"], expected.len());

    let shard_files = shards(&out);
    assert!(shard_files.len() >= 4, "100 kB shards of ~500 kB: {shard_files:?}");
    for (n, shard) in shard_files.iter().enumerate() {
        assert_eq!(shard.file_name().unwrap().to_string_lossy(), format!("shard-{n:06}.tar"));
        let len = fs::metadata(shard).unwrap().len();
        let samples =
            parse_dali_index(&fs::read_to_string(shard.with_extension("idx")).unwrap()).unwrap().len();
        assert!(samples >= 1, "no empty shard: {}", shard.display());
        // A sample larger than the limit stands alone; otherwise no shard exceeds it.
        assert!(len <= 100_000 || samples == 1, "{}: {len} bytes, {samples} samples", shard.display());
    }

    let ds = imgpack_reader::open(&out).unwrap();
    assert_eq!(ds.len(), expected.len() as u64);
    for (i, (rel, class)) in expected.iter().enumerate() {
        let sample = ds.get(i as u64).unwrap();
        assert_eq!(sample.image().unwrap().1, &fs::read(fx.tree().join(rel)).unwrap()[..], "{rel}");
        assert_eq!(sample.label().unwrap(), *class);
        assert_eq!(sample.info().unwrap().path, *rel);
    }
    let iterated: Vec<_> = ds.iter().unwrap().map(|s| s.unwrap().key.clone()).collect();
    assert_eq!(iterated, (0..expected.len()).map(|i| format!("{i:08}")).collect::<Vec<_>>());
}

#[test]
fn every_shard_has_a_crc32_and_an_md5_with_md5() {
    let fx = Fixture::new();
    for (name, extra) in [("plain", &[][..]), ("md5", &["--md5"][..])] {
        let mut args = vec!["--shard-size", "150kB"];
        args.extend_from_slice(extra);
        let (out, _) = pack_wds(&fx, name, &args);
        let meta = imgpack_reader::open(&out).unwrap().meta().clone();
        let wids: WidsIndex =
            serde_json::from_slice(&fs::read(out.join("shardindex.json")).unwrap()).unwrap();
        assert_eq!(meta.version, 3);
        assert!(meta.shards.len() > 1);
        for (shard, entry) in meta.shards.iter().zip(&wids.shardlist) {
            let bytes = fs::read(out.join(&shard.name)).unwrap();
            assert_eq!(shard.crc32, Some(crc32fast::hash(&bytes)), "{name}: CRC-32 of the whole shard");
            let md5: String = Md5::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
            let expected = (name == "md5").then_some(md5);
            assert_eq!((&shard.md5, &entry.md5sum), (&expected, &expected), "{name}");
        }
        let json: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join("imgpack.json")).unwrap()).unwrap();
        assert_eq!(
            json["options"]["md5"].as_bool(),
            (name == "md5").then_some(true),
            "recorded only when on"
        );
    }
}

#[test]
fn every_index_agrees_with_the_tar_headers() {
    let fx = Fixture::new();
    let (out, summary) = pack_wds(&fx, "wds", &["--shard-size", "150kB", "--prefix", "train"]);
    let wids: WidsIndex = serde_json::from_slice(&fs::read(out.join("shardindex.json")).unwrap()).unwrap();
    assert_eq!(wids.kind, "wids-shard-index-v1");
    let shard_files = shards(&out);
    assert_eq!(wids.shardlist.len(), shard_files.len());
    let mut total = 0;
    let mut next_key = 0u64;
    for (entry, shard) in wids.shardlist.iter().zip(&shard_files) {
        let bytes = fs::read(shard).unwrap();
        assert_eq!(entry.url, shard.file_name().unwrap().to_string_lossy());
        assert!(entry.url.starts_with("train-"));
        assert_eq!(entry.filesize, bytes.len() as u64);
        assert_eq!(entry.md5sum, None, "no MD5 without --md5");

        let idx = parse_dali_index(&fs::read_to_string(shard.with_extension("idx")).unwrap()).unwrap();
        assert_eq!(idx.len() as u64, entry.nsamples);
        // Walk the tar itself and check the index lists exactly its members, in order.
        let mut pos = 0;
        let mut listed = idx.iter().flatten();
        while bytes[pos..pos + 512].iter().any(|&b| b != 0) {
            let member = parse_member(&bytes, pos).unwrap();
            let c = listed.next().expect("every member is in the index");
            assert_eq!(
                (c.name.as_str(), c.offset, c.size),
                (member.name, pos as u64 + 512, member.data.len() as u64)
            );
            assert_eq!(c.name, format!("{}.{}", member.name.split('.').next().unwrap(), c.ext));
            pos = member.next;
        }
        assert!(listed.next().is_none(), "the index lists no member the tar lacks");
        assert_eq!(bytes.len(), pos + 1024, "the archive ends with exactly two zero blocks");
        for sample in &idx {
            let key = sample[0].name.split('.').next().unwrap();
            assert_eq!(key, format!("{next_key:08}"), "samples in key order across shards");
            assert!(
                sample.iter().all(|c| c.name.starts_with(&format!("{key}."))),
                "fields of a sample are adjacent"
            );
            let exts: Vec<_> = sample.iter().map(|c| c.ext.clone()).collect();
            let mut sorted = exts.clone();
            sorted.sort();
            assert_eq!(exts, sorted, "fields sorted by extension");
            next_key += 1;
        }
        total += entry.nsamples;
    }
    assert_eq!(total, summary["packed"].as_u64().unwrap());
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("imgpack.json")).unwrap()).unwrap();
    assert_eq!(meta["format"], "imgpack-webdataset");
    assert_eq!(meta["shards"].as_array().unwrap().len(), shard_files.len());
}

#[test]
fn output_is_byte_identical_whatever_the_thread_count() {
    let fx = Fixture::new();
    fx.add_bad("space", "html.jpg");
    let outs: Vec<_> = ["1", "2", "8"]
        .iter()
        .map(|threads| {
            let out = fx.out(&format!("t{threads}"));
            pack(&[
                &"imagefolder",
                &fx.tree(),
                &"--to",
                &"webdataset",
                &"-o",
                &out,
                &"--shard-size",
                &"120kB",
            ])
            .args(["--threads", threads, "-q"])
            .assert()
            .code(3);
            out
        })
        .collect();
    let files = |dir: &Path| {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (p.file_name().unwrap().to_owned(), fs::read(&p).unwrap())
            })
            .collect();
        v.sort();
        v
    };
    let first = files(&outs[0]);
    assert!(first.len() > 5);
    for other in &outs[1..] {
        assert!(first == files(other), "{} differs from {}", other.display(), outs[0].display());
    }
}

#[test]
fn an_oversized_sample_gets_its_own_shard_and_a_warning() {
    let fx = Fixture::new();
    let out = fx.out("big");
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &out, &"--shard-size", &"20kB"])
            .assert()
            .code(0);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("more than --shard-size 20000; it has a shard of its own"), "{stderr}");
    for shard in shards(&out) {
        let len = fs::metadata(&shard).unwrap().len();
        let samples =
            parse_dali_index(&fs::read_to_string(shard.with_extension("idx")).unwrap()).unwrap().len();
        assert!(len <= 20_000 || samples == 1, "{}: {len} bytes, {samples} samples", shard.display());
        assert!(samples >= 1);
    }
}

#[test]
fn shard_samples_caps_the_count() {
    let fx = Fixture::new();
    let (out, summary) = pack_wds(&fx, "n", &["--shard-samples", "4"]);
    let packed = summary["packed"].as_u64().unwrap();
    let shard_files = shards(&out);
    assert_eq!(shard_files.len() as u64, packed.div_ceil(4));
    let counts: Vec<usize> = shard_files
        .iter()
        .map(|s| parse_dali_index(&fs::read_to_string(s.with_extension("idx")).unwrap()).unwrap().len())
        .collect();
    assert!(counts[..counts.len() - 1].iter().all(|&c| c == 4), "{counts:?}");
}

#[test]
fn shard_flags_are_refused_for_other_formats() {
    let fx = Fixture::new();
    let out = fx.out("x.lmdb");
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--prefix", &"a"])
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("--prefix applies to --to webdataset only"), "{stderr}");
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &out, &"--shard-size", &"1QB"])
            .assert()
            .code(2);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("unknown unit"), "{stderr}");
}

#[test]
fn shards_in_class_order_come_with_one_note_on_shuffling() {
    let fx = Fixture::new();
    let note = "pass --shuffle --seed N";
    let run = |args: &[&dyn AsRef<std::ffi::OsStr>]| {
        let assert = pack(args).assert().code(0);
        let out = assert.get_output();
        (String::from_utf8_lossy(&out.stderr).into_owned(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (stderr, _) = run(&[&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &fx.out("plain")]);
    assert_eq!(stderr.matches(note).count(), 1, "{stderr}");
    let (_, json) =
        run(&[&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &fx.out("json"), &"--json"]);
    let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(summary["notes"][0].as_str().unwrap().contains(note), "{summary}");
    assert_eq!(summary["warnings"], serde_json::json!([]), "a note is no warning: {summary}");
    for args in [
        vec![
            &"imagefolder" as &dyn AsRef<std::ffi::OsStr>,
            &fx.tree(),
            &"--to",
            &"webdataset",
            &"-o",
            &fx.out("shuf"),
            &"--shuffle",
        ],
        vec![&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &fx.out("x.lmdb")],
        vec![&fx.out("plain"), &"--to", &"webdataset", &"-o", &fx.out("converted")],
        vec![&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &fx.out("quiet"), &"-q"],
    ] {
        let (stderr, _) = run(&args);
        assert!(!stderr.contains(note), "{stderr}");
    }
}
