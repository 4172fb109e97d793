//! `pack verify` and checksums: intact outputs pass, and every single flipped byte — in sample
//! data, tar headers, indexes and metadata — is caught and the damaged sample named; the
//! reader's `verify_checksums` refuses a damaged sample and reads the others.

use std::fs;
use std::num::NonZeroUsize;
use std::path::Path;

use imgpack::progress::Silent;
use imgpack::verify::{verify, Verified, VerifyOptions};
use imgpack_reader::webdataset::{WebDataset, BLOCK};

use crate::util::{pack, Fixture};

const OPTIONS: VerifyOptions =
    VerifyOptions { decode: false, threads: NonZeroUsize::new(2).unwrap(), endpoint: None };

/// A small deterministic generator, so a failure names a flip that can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn packed(fx: &Fixture, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let out = fx.out(name);
    let tree = fx.tree();
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"imagefolder", &tree, &"-o", &out, &"-q"];
    for a in extra {
        args.push(a);
    }
    pack(&args).assert().code(0);
    out
}

fn check(path: &Path) -> Verified {
    verify(path, &OPTIONS, &Silent).unwrap()
}

/// XORs the byte at `at` of `file` with `mask` (applying it twice restores the file).
fn flip(file: &Path, at: usize, mask: u8) {
    let mut bytes = fs::read(file).unwrap();
    bytes[at] ^= mask;
    fs::write(file, bytes).unwrap();
}

/// Flips the byte, checks that verify reports it (naming `expect_place` if given, the place
/// otherwise being any), and restores it.
fn assert_caught(dataset: &Path, file: &Path, at: usize, mask: u8, expect_place: Option<&str>, what: &str) {
    assert_caught_all(dataset, file, &[at], mask, expect_place, what);
}

/// [`assert_caught`] for one change made at several places at once.
fn assert_caught_all(
    dataset: &Path,
    file: &Path,
    all: &[usize],
    mask: u8,
    expect_place: Option<&str>,
    what: &str,
) {
    let at = all[0];
    all.iter().for_each(|&at| flip(file, at, mask));
    let verified = check(dataset);
    all.iter().for_each(|&at| flip(file, at, mask));
    assert!(
        !verified.is_ok(),
        "{what}: flipping byte {at} of {} with {mask:#04x} went unnoticed",
        file.display()
    );
    if let Some(place) = expect_place {
        assert!(
            verified.problems.iter().any(|p| p.place == place),
            "{what}: byte {at} of {}: no problem names {place}: {:?}",
            file.display(),
            verified.problems
        );
    }
}

#[test]
fn intact_outputs_verify_clean_in_every_mode() {
    let fx = Fixture::new();
    for (name, extra) in [
        ("p.lmdb", &["--to", "lmdb"][..]),
        ("p.wds", &["--to", "webdataset", "--shard-size", "100kB"]),
        ("r.lmdb", &["--to", "lmdb", "--mode", "reencode", "--resize-shorter", "32"]),
        ("d.wds", &["--to", "webdataset", "--mode", "decode", "--compress", "zstd"]),
    ] {
        let out = packed(&fx, name, extra);
        let assert = pack(&[&"verify", &out, &"--decode"]).assert().code(0);
        let stdout = String::from_utf8_lossy(&assert.get_output().stdout).to_string();
        assert!(
            stdout.contains("31 samples of 31 checked") && stdout.contains("ok: no problem found"),
            "{name}: {stdout}"
        );
        let verified = verify(
            &out,
            &VerifyOptions { decode: true, threads: NonZeroUsize::MIN, endpoint: None },
            &Silent,
        )
        .unwrap();
        assert!(verified.is_ok() && verified.checked == 31, "{name}: {:?}", verified.problems);
    }
}

#[test]
fn every_flipped_byte_of_a_webdataset_is_caught() {
    let fx = Fixture::new();
    let out = packed(&fx, "w", &["--to", "webdataset", "--shard-size", "100kB"]);
    assert!(check(&out).is_ok());
    let ds = WebDataset::open(&out).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let shard_path = |i: u64| out.join(&ds.meta().shards[ds.entry(i).unwrap().shard as usize].name);
    for _ in 0..12 {
        let i = rng.below(ds.len() as usize) as u64;
        let key = format!("sample {}", ds.get(i).unwrap().key);
        let e = ds.entry(i).unwrap();
        let mask = 1 + rng.below(255) as u8;
        // A byte of the sample's first tar header, and of its data or padding.
        let header = e.offset as usize + rng.below(BLOCK as usize);
        assert_caught(&out, &shard_path(i), header, mask, Some(&key), "tar header");
        let data = e.offset as usize + BLOCK as usize + rng.below(e.len as usize - BLOCK as usize);
        assert_caught(&out, &shard_path(i), data, mask, Some(&key), "sample data");
        // Its index entry.
        let entry = 24 + 24 * i as usize + rng.below(24);
        assert_caught(&out, &out.join("imgpack.index"), entry, mask, None, "index entry");
    }
    // The end-of-archive blocks, the index header, and every small file, anywhere.
    for (shard, info) in ds.meta().shards.iter().enumerate() {
        let path = out.join(&info.name);
        let end = info.bytes as usize - 1024 + rng.below(1024);
        assert_caught(&out, &path, end, 0x01, Some(&info.name), "end blocks");
        let idx = out.join(format!("shard-{shard:06}.idx"));
        let len = fs::metadata(&idx).unwrap().len() as usize;
        assert_caught(&out, &idx, rng.below(len), 1 + rng.below(255) as u8, None, "DALI index");
    }
    for _ in 0..8 {
        assert_caught(
            &out,
            &out.join("imgpack.index"),
            rng.below(24),
            1 + rng.below(255) as u8,
            None,
            "index header",
        );
        for small in ["imgpack.json", "shardindex.json"] {
            let len = fs::metadata(out.join(small)).unwrap().len() as usize;
            assert_caught(&out, &out.join(small), rng.below(len), 1 + rng.below(255) as u8, None, small);
        }
    }
    assert!(check(&out).is_ok(), "every flip was undone");
}

/// Where `needle` occurs in `haystack`.
fn find_all(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    haystack.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect()
}

#[test]
fn every_flipped_byte_of_an_lmdb_value_key_or_table_is_caught() {
    let fx = Fixture::new();
    let out = packed(&fx, "l.lmdb", &["--to", "lmdb"]);
    assert!(check(&out).is_ok());
    let data = out.join("data.mdb");
    let file = fs::read(&data).unwrap();
    // LMDB allows one handle per environment and process: read everything first, then close it.
    let samples: Vec<_> =
        imgpack_reader::open(&out).unwrap().iter().unwrap().map(|s| s.unwrap().into_owned()).collect();
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for _ in 0..15 {
        let sample = &samples[rng.below(samples.len())];
        let place = format!("sample {}", sample.key);
        // Every field's value (the image, the label, the json record). LMDB copies pages on
        // write, so earlier versions of a leaf page may linger in free pages: the same byte is
        // flipped in every copy found, which includes the live one.
        for field in sample.fields.iter().filter(|f| f.data.len() >= 16) {
            let offset = rng.below(field.data.len());
            let at: Vec<usize> = find_all(&file, &field.data).iter().map(|start| start + offset).collect();
            let what = format!("{} value", field.ext);
            assert_caught_all(&out, &data, &at, 1 + rng.below(255) as u8, Some(&place), &what);
        }
        // The key, wherever LMDB stores it (leaf, branch pages, stale copies).
        let name = format!("{}.{}", sample.key, sample.fields[1].ext);
        let offset = rng.below(name.len());
        let at: Vec<usize> = find_all(&file, name.as_bytes()).iter().map(|start| start + offset).collect();
        assert_caught_all(&out, &data, &at, 1 + rng.below(255) as u8, None, "key");
    }
    for record in ["__checksums__", "__meta__"] {
        let txn_value = {
            let env = unsafe {
                heed::EnvOpenOptions::new()
                    .flags(heed::EnvFlags::READ_ONLY | heed::EnvFlags::NO_LOCK)
                    .open(&out)
                    .unwrap()
            };
            let rtxn = env.read_txn().unwrap();
            let db: heed::Database<heed::types::Bytes, heed::types::Bytes> =
                env.open_database(&rtxn, None).unwrap().unwrap();
            db.get(&rtxn, record.as_bytes()).unwrap().unwrap().to_vec()
        };
        let starts = find_all(&file, &txn_value);
        for _ in 0..10 {
            let offset = rng.below(txn_value.len());
            let at: Vec<usize> = starts.iter().map(|start| start + offset).collect();
            assert_caught_all(&out, &data, &at, 1 + rng.below(255) as u8, None, record);
        }
    }
    assert!(check(&out).is_ok(), "every flip was undone");
}

#[test]
fn damage_is_named_on_the_command_line_and_refused_by_the_reader() {
    let fx = Fixture::new();
    let wds = packed(&fx, "w", &["--to", "webdataset"]);
    let lmdb = packed(&fx, "l.lmdb", &["--to", "lmdb"]);
    // Damage sample 5's image in both.
    let entry = WebDataset::open(&wds).unwrap().entry(5).unwrap();
    let shard = wds.join("shard-000000.tar");
    flip(&shard, entry.offset as usize + entry.len as usize - 600, 0x40);
    let image = imgpack_reader::open(&lmdb).unwrap().get(5).unwrap().image().unwrap().1.to_vec();
    let data = lmdb.join("data.mdb");
    let at = find_all(&fs::read(&data).unwrap(), &image)[0];
    flip(&data, at + image.len() / 2, 0x40);

    for out in [&wds, &lmdb] {
        let assert = pack(&[&"verify", out]).assert().code(1);
        let stdout = String::from_utf8_lossy(&assert.get_output().stdout).to_string();
        assert!(stdout.contains("sample 00000005: CRC-32 is"), "{stdout}");
        assert!(stdout.contains("DAMAGED"), "{stdout}");
        let assert = pack(&[&"verify", out, &"--json"]).assert().code(1);
        let report: serde_json::Value = serde_json::from_slice(&assert.get_output().stdout).unwrap();
        assert_eq!(report["type"], "verify");
        assert!(
            report["problems"].as_array().unwrap().iter().any(|p| p["place"] == "sample 00000005"),
            "{report}"
        );

        let ds = imgpack_reader::open(out).unwrap().verify_checksums(true).unwrap();
        match ds.get(5) {
            Err(imgpack_reader::Error::Checksum { key, expected, actual, .. }) => {
                assert_eq!(key, "00000005");
                assert_ne!(expected, actual);
            }
            other => panic!("{}: damaged sample read as {other:?}", out.display()),
        }
        for i in (0..ds.len()).filter(|&i| i != 5) {
            ds.get(i).unwrap();
        }
        drop(ds);
        // Without verification the damaged bytes are returned as stored.
        imgpack_reader::open(out).unwrap().get(5).unwrap();
    }
    pack(&[&"verify", &fx.out("nothing")]).assert().code(1);
}

#[test]
fn converting_a_damaged_dataset_skips_the_damaged_sample_instead_of_hiding_it() {
    let fx = Fixture::new();
    let wds = packed(&fx, "w", &["--to", "webdataset"]);
    let entry = WebDataset::open(&wds).unwrap().entry(3).unwrap();
    flip(&wds.join("shard-000000.tar"), entry.offset as usize + entry.len as usize - 700, 0x01);
    let lmdb = fx.out("l.lmdb");
    let assert = pack(&[&wds, &"--to", &"lmdb", &"-o", &lmdb, &"--json"]).assert().code(3);
    let summary = crate::util::summary(&assert.get_output().stdout);
    assert_eq!((summary["packed"].as_u64(), summary["found"].as_u64()), (Some(30), Some(31)));
    let reason = summary["skipped"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("00000003") && reason.contains("CRC-32"), "{reason}");
    pack(&[&"verify", &lmdb]).assert().code(0);
}
