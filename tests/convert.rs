//! Conversions: any source into any sink, and unpacking that never writes outside its tree.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::util::*;

/// Every file below `dir`, as (relative path bytes, contents).
fn tree_files(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
                out.push((rel, fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn imagefolder_to_lmdb_to_webdataset_to_imagefolder_is_byte_identical() {
    let fx = Fixture::new();
    // Nested folders, a name that is not UTF-8, spaces and dots survive the trip.
    fs::create_dir_all(fx.tree().join("cat/deep/er")).unwrap();
    fs::copy(fx.tree().join("cat/chelsea_01.jpg"), fx.tree().join("cat/deep/er/a b.c.jpg")).unwrap();
    let odd = fx.tree().join("space").join(OsStr::from_bytes(b"caf\xe9.jpg"));
    fs::copy(fx.tree().join("space/rocket_01.jpg"), &odd).unwrap();
    fs::create_dir(fx.tree().join("zz_empty")).unwrap();

    let lmdb = fx.out("a.lmdb");
    let wds = fx.out("b.wds");
    let back = fx.out("c.tree");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &lmdb, &"-q"]).assert().code(0);
    pack(&[&lmdb, &"--to", &"webdataset", &"-o", &wds, &"-q", &"--shard-size", &"200kB"]).assert().code(0);
    pack(&[&wds, &"--to", &"imagefolder", &"-o", &back, &"-q"]).assert().code(0);

    assert_eq!(tree_files(&fx.tree()), tree_files(&back));
    assert!(back.join("zz_empty").is_dir(), "empty classes come back as empty folders");
    let (lmdb_meta, lmdb_samples) = dump(&lmdb);
    let (wds_meta, wds_samples) = dump(&wds);
    assert_eq!(lmdb_samples, wds_samples, "same keys, same fields, same bytes");
    assert_eq!(lmdb_meta.classes, wds_meta.classes);
    assert_eq!(wds_meta.source.kind, "imgpack-lmdb");
}

#[test]
fn webdataset_converts_back_to_identical_shards() {
    let fx = Fixture::new();
    let wds = fx.out("w1");
    let lmdb = fx.out("l.lmdb");
    let wds2 = fx.out("w2");
    pack(&[
        &"imagefolder",
        &fx.tree(),
        &"--to",
        &"webdataset",
        &"-o",
        &wds,
        &"-q",
        &"--shard-size",
        &"150kB",
    ])
    .assert()
    .code(0);
    pack(&[&wds, &"--to", &"lmdb", &"-o", &lmdb, &"-q"]).assert().code(0);
    pack(&[&lmdb, &"--to", &"webdataset", &"-o", &wds2, &"-q", &"--shard-size", &"150kB"]).assert().code(0);
    for entry in fs::read_dir(&wds).unwrap() {
        let name = entry.unwrap().file_name();
        let (mut a, mut b) = (fs::read(wds.join(&name)).unwrap(), fs::read(wds2.join(&name)).unwrap());
        if name == "imgpack.json" {
            continue; // it names its source, which differs
        }
        if name == "imgpack.index" {
            // Bytes 12..16 hold the CRC-32 of imgpack.json, which differs; the rest may not.
            a[12..16].fill(0);
            b[12..16].fill(0);
        }
        assert!(a == b, "{name:?} differs");
    }
}

#[test]
fn unpacking_refuses_paths_that_leave_the_tree() {
    use heed::types::Bytes;
    let fx = Fixture::new();
    let lmdb = fx.out("evil.lmdb");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &lmdb, &"-q"]).assert().code(0);
    // Rewrite two samples' recorded paths as a hostile dataset would.
    {
        let env = unsafe { heed::EnvOpenOptions::new().open(&lmdb).unwrap() };
        let mut txn = env.write_txn().unwrap();
        let db: heed::Database<Bytes, Bytes> = env.open_database(&txn, None).unwrap().unwrap();
        db.put(&mut txn, b"00000000.json", br#"{"path":"../../escaped.jpg","class":"cat"}"#).unwrap();
        db.put(&mut txn, b"00000001.json", br#"{"path":"/tmp/absolute.jpg","class":"cat"}"#).unwrap();
        txn.commit().unwrap();
    }
    let tree = fx.out("unpacked");
    let assert = pack(&[&lmdb, &"--to", &"imagefolder", &"-o", &tree, &"--json"]).assert().code(3);
    let s = summary(&assert.get_output().stdout);
    let reasons: Vec<&str> =
        s["skipped"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("could escape the output; refused"), "{}", reasons[0]);
    assert!(reasons[1].contains("absolute path"), "{}", reasons[1]);
    assert!(!fx.dir.path().join("escaped.jpg").exists());
    assert!(!Path::new("/tmp/absolute.jpg").exists());
    assert_eq!(s["packed"].as_u64().unwrap() + 2, s["found"].as_u64().unwrap());

    let assert = pack(&[&lmdb, &"--to", &"imagefolder", &"-o", &fx.out("strict"), &"--on-error", &"fail"])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("evil.lmdb/00000000") && stderr.contains("refused"), "{stderr}");
}

#[test]
fn a_pre_decoded_dataset_converts_between_formats_unchanged() {
    let fx = Fixture::new();
    let lmdb = fx.out("d.lmdb");
    let wds = fx.out("d.wds");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &lmdb, &"-q"])
        .args(["--mode", "decode", "--resize-shorter", "32", "--compress", "zstd"])
        .assert()
        .code(0);
    pack(&[&lmdb, &"--to", &"webdataset", &"-o", &wds, &"-q"]).assert().code(0);
    let (a_meta, a) = dump(&lmdb);
    let (b_meta, b) = dump(&wds);
    assert_eq!(a, b, "same keys and bytes");
    assert_eq!(b_meta.fields, ["cls", "json", "npy.zst"]);
    assert_eq!(a_meta.classes, b_meta.classes);

    // Nothing to re-encode or unpack: refused before starting, once, with what would work;
    // nothing is published.
    for (extra, cannot) in [
        (&["--to", "webdataset", "--mode", "reencode"][..], "cannot be transcoded again"),
        (&["--to", "imagefolder"], "cannot be unpacked into an ImageFolder tree"),
    ] {
        let out = fx.out(&format!("x{}", extra.len()));
        let assert = pack(&[&lmdb, &"-o", &out, &"--json"]).args(extra).assert().code(2);
        let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
        assert!(stderr.contains("holds decoded pixels") && stderr.contains(cannot), "{stderr}");
        assert!(stderr.contains("without --mode"), "{stderr}");
        assert_eq!(stderr.matches("decoded pixels").count(), 1, "{stderr}");
        let temp = out.with_file_name(format!(".{}.imgpack-tmp", out.file_name().unwrap().to_string_lossy()));
        assert!(!out.exists() && !temp.exists(), "{extra:?}");
    }
}
