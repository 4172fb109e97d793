//! Writes the seed inputs in `seeds/<target>/` from real `pack` outputs, in the form each fuzz
//! target reads (see the crate docs):
//!
//! ```sh
//! pack imagefolder SRC --to webdataset -o /tmp/seed.wds --shard-samples 2
//! pack imagefolder SRC --to lmdb -o /tmp/seed.lmdb
//! cargo run --example make_seeds -- /tmp/seed.wds /tmp/seed.lmdb [MORE.wds...]
//! ```
//!
//! The first WebDataset and the LMDB dataset become whole-dataset seeds, so keep them small (a
//! few images); further WebDatasets only add their index files to the `index_parsers` seeds.

use std::fs;
use std::path::Path;

use heed::types::Bytes;
use heed::{Database, EnvFlags, EnvOpenOptions};
use imgpack_reader::checksum::TABLE_KEY;
use imgpack_reader::key::META_KEY;
use imgpack_reader::lmdb::LmdbDataset;
use imgpack_reader::webdataset::{WebDataset, META_FILE, SAMPLE_INDEX_FILE};
use imgpack_reader::Meta;
use imgpack_reader_fuzz::{flags, fresh_dir, join, write_lmdb, write_webdataset};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [wds, lmdb, more @ ..] = &args[..] else {
        panic!("usage: make_seeds WEBDATASET_DIR LMDB_DIR [MORE_WEBDATASET_DIRS...]");
    };
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let put = |target: &str, name: &str, bytes: &[u8]| {
        let dir = seeds.join(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(name), bytes).unwrap();
    };

    // WebDataset: the whole dataset, raw and with every repair flag; each shard for tar_member.
    let wds = Path::new(wds);
    let meta_bytes = fs::read(wds.join(META_FILE)).unwrap();
    let index = fs::read(wds.join(SAMPLE_INDEX_FILE)).unwrap();
    let meta: Meta = serde_json::from_slice(&meta_bytes).unwrap();
    let shards: Vec<Vec<u8>> = meta.shards.iter().map(|s| fs::read(wds.join(&s.name)).unwrap()).collect();
    let all = flags::FIX_SHARD_SIZES | flags::FIX_INDEX_LEN | flags::FIX_CRCS | flags::FIX_HEADER;
    for (name, f) in [("intact", 0), ("repaired", all), ("verified", all | flags::VERIFY)] {
        let flag = [f];
        let mut parts: Vec<&[u8]> = vec![&flag, &meta_bytes, &index];
        parts.extend(shards.iter().map(Vec::as_slice));
        put("webdataset", name, &join(&parts));
    }
    // The same dataset as a merge of one part would list it: shards in a part directory.
    let mut merged: serde_json::Value = serde_json::from_slice(&meta_bytes).unwrap();
    for (n, shard) in merged["shards"].as_array_mut().unwrap().iter_mut().enumerate() {
        shard["name"] = format!("part-0000-of-0001/shard-p0000-{n:06}.tar").into();
    }
    let merged = serde_json::to_vec(&merged).unwrap();
    let flag = [all | flags::VERIFY];
    let mut parts: Vec<&[u8]> = vec![&flag, &merged, &index];
    parts.extend(shards.iter().map(Vec::as_slice));
    put("webdataset", "merged", &join(&parts));
    for (n, shard) in shards.iter().enumerate() {
        put("tar_member", &format!("shard-{n}"), &[&[0, 0][..], shard].concat());
    }
    for dir in std::iter::once(wds).chain(more.iter().map(Path::new)) {
        let tag = dir.file_name().unwrap().to_string_lossy();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name == SAMPLE_INDEX_FILE || name.ends_with(".idx") {
                put("index_parsers", &format!("{tag}-{name}"), &fs::read(&path).unwrap());
            }
        }
    }

    // LMDB: every record; the checksum table for index_parsers; each sample's small fields.
    // SAFETY: a published dataset, opened read-only; nothing writes it while this runs.
    let env = unsafe {
        EnvOpenOptions::new().flags(EnvFlags::READ_ONLY | EnvFlags::NO_LOCK).open(Path::new(lmdb)).unwrap()
    };
    let txn = env.read_txn().unwrap();
    let db: Database<Bytes, Bytes> = env.open_database(&txn, None).unwrap().unwrap();
    let records: Vec<(Vec<u8>, Vec<u8>)> =
        db.iter(&txn).unwrap().map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap()).collect();
    let get = |key: &str| records.iter().find(|(k, _)| k == key.as_bytes()).map(|(_, v)| v.clone()).unwrap();
    let (meta_bytes, table) = (get(META_KEY), get(TABLE_KEY));
    put("index_parsers", "lmdb-checksums", &table);
    let samples: Vec<Vec<u8>> = records
        .iter()
        .filter(|(k, _)| k.contains(&b'.'))
        .map(|(k, v)| [&k[..], &[0], &v[..]].concat())
        .collect();
    for (name, f) in [("intact", 0), ("repaired", flags::FIX_CRCS | flags::FIX_HEADER | flags::VERIFY)] {
        let flag = [f];
        let mut parts: Vec<&[u8]> = vec![&flag, &meta_bytes, &table];
        parts.extend(samples.iter().map(Vec::as_slice));
        put("lmdb_records", name, &join(&parts));
    }
    let field = |key: &[u8], ext: &str| {
        records.iter().find(|(k, _)| k[..] == [key, b".", ext.as_bytes()].concat()).map(|(_, v)| v.clone())
    };
    for (k, _) in records.iter().filter(|(k, _)| k.ends_with(b".cls")) {
        let key = &k[..k.len() - 4];
        let (cls, json) = (field(key, "cls").unwrap(), field(key, "json").unwrap_or_default());
        put("sample_fields", &String::from_utf8_lossy(key), &join(&[&cls, &json, &meta_bytes]));
    }
    check_seeds(&seeds);
    println!("seeds written to {}", seeds.display());
}

/// Makes sure the whole-dataset seeds reach the readers' depths: written by the harness, each
/// opens and every sample reads back, checksums checked where the seed asks for it.
fn check_seeds(seeds: &Path) {
    for name in ["intact", "repaired", "verified", "merged"] {
        let data = fs::read(seeds.join("webdataset").join(name)).unwrap();
        let dir = fresh_dir("seed-wds").join("ds");
        fs::create_dir(&dir).unwrap();
        let f = write_webdataset(&dir, &data);
        let ds = WebDataset::open(&dir).unwrap().verify_checksums(f & flags::VERIFY != 0).unwrap();
        assert!(ds.iter().all(|s| s.is_ok()), "webdataset seed {name} reads back");
    }
    for name in ["intact", "repaired"] {
        let data = fs::read(seeds.join("lmdb_records").join(name)).unwrap();
        let dir = fresh_dir("seed-lmdb");
        let f = write_lmdb(&dir, &data);
        let ds = LmdbDataset::open(&dir).unwrap().verify_checksums(f & flags::VERIFY != 0).unwrap();
        assert!(ds.iter().unwrap().all(|s| s.is_ok()), "lmdb seed {name} reads back");
    }
}
