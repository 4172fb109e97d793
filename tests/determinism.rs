//! Determinism: the same source and options give the same bytes, whatever the thread count,
//! the run, or where on disk the source sits and in which order its directories list their
//! entries; and no output carries the host name, the path of the run or a timestamp.
//!
//! Two sources: a copy of `testdata/imagefolder`, and a generated tree of ~300 small images in
//! six classes (nested folders, grey and RGBA images, a truncated JPEG, an empty file and an
//! HTML page among them), whose first class holds a few large files so that the LMDB output is
//! written in several transactions. Each is packed in every mode, with and without
//! `--shuffle`, to both formats, with `--threads` 1, 2 and 8; WebDataset outputs are compared
//! file by file and byte by byte, LMDB outputs record by record (every key and value,
//! `__meta__` included).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use heed::types::Bytes;
use heed::{Database, EnvFlags, EnvOpenOptions};

use crate::util::*;

const THREADS: [&str; 3] = ["1", "2", "8"];
const SEED: &str = "7";

/// The three modes, each with the options that shape it.
const MODES: [&[&str]; 3] = [
    &["--mode", "passthrough"],
    &["--mode", "reencode", "--resize-shorter", "24", "--quality", "85"],
    &["--mode", "decode", "--center-crop", "40", "--compress", "zstd:3"],
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Source {
    Testdata,
    Generated,
}

#[test]
fn testdata_passthrough_is_deterministic() {
    matrix(Source::Testdata, 0);
}

#[test]
fn testdata_reencode_is_deterministic() {
    matrix(Source::Testdata, 1);
}

#[test]
fn testdata_decode_is_deterministic() {
    matrix(Source::Testdata, 2);
}

#[test]
fn generated_passthrough_is_deterministic() {
    matrix(Source::Generated, 0);
}

#[test]
fn generated_reencode_is_deterministic() {
    matrix(Source::Generated, 1);
}

#[test]
fn generated_decode_is_deterministic() {
    matrix(Source::Generated, 2);
}

#[test]
fn leak_check_helpers_find_what_they_look_for() {
    assert!(holds_word("{\"host\":\"vm\"}", "vm") && holds_word("vm:/tmp/x", "vm"));
    assert!(!holds_word("a_big/evm_1.jpg", "vm") && !holds_word("vm2", "vm"));
    assert!(
        contains(b"..../tmp/.tmpAbC/src....", b"/tmp/.tmpAbC") && !contains(b"/tmp/.tmpAb", b"/tmp/.tmpAbC")
    );
    assert_eq!(civil_year(0), 1970);
    assert_eq!(civil_year(951_782_400), 2000, "2000-02-29");
    assert_eq!(civil_year(1_798_761_599), 2026, "2026-12-31 23:59:59");
    assert_eq!(civil_year(1_798_761_600), 2027);
    let meta = serde_json::json!({"shards": [{"md5": "d41d8cd98f00b204e9800998ecf8427e", "bytes": 2026}]});
    check_no_time(&meta, 1_790_000_000, "2026", "no false alarm");
    for leak in [
        serde_json::json!({"t": 1_790_000_100}),
        serde_json::json!({"t": 1_790_000_100_000u64}),
        serde_json::json!(["2026-11-30"]),
    ] {
        let caught = std::panic::catch_unwind(|| check_no_time(&leak, 1_790_000_000, "2026", "leak"));
        assert!(caught.is_err(), "{leak} is caught");
    }
}

/// Everything an output holds, by name: a WebDataset's files, or an LMDB's records.
type Contents = BTreeMap<Vec<u8>, Vec<u8>>;

/// Packs `source` in mode `m` with and without `--shuffle`, to both formats, with every thread
/// count, and once more from a second copy of the source elsewhere; every output of one
/// configuration must be identical to the others.
fn matrix(source: Source, m: usize) {
    let dir = tempfile::tempdir().unwrap();
    source.write(&dir.path().join("src"), false);
    let mode = MODES[m][1];
    let mut orders = Vec::new();
    for shuffle in [false, true] {
        for format in ["lmdb", "webdataset"] {
            let config =
                format!("{source:?} --mode {mode} --to {format}{}", if shuffle { " --shuffle" } else { "" });
            let mut reference: Option<(String, Contents)> = None;
            for threads in THREADS {
                let name = format!(
                    "determinism-output-{mode}-{format}-{}-threads{threads}",
                    if shuffle { "shuffled" } else { "ordered" }
                );
                let out = pack_in(dir.path(), &name, source, m, format, shuffle, threads);
                let contents = contents(&out, format);
                if threads == "1" {
                    check_preconditions(&out, &contents, source, m, format, shuffle, &config);
                    check_no_leaks(&out, &contents, format, dir.path(), &name, &config);
                    if format == "lmdb" {
                        orders.push(sample_paths(&out));
                    }
                }
                match &reference {
                    None => reference = Some((format!("--threads {threads}"), contents)),
                    Some((with, expected)) => assert_same(
                        expected,
                        &contents,
                        &format!("{config}: --threads {threads} against {with}"),
                    ),
                }
            }
            // The same tree written elsewhere, its files created in the opposite order, and
            // packed from there gives the same output (once per mode, one format each).
            if !shuffle && format == ["lmdb", "webdataset", "lmdb"][m] {
                let elsewhere = tempfile::tempdir().unwrap();
                source.write(&elsewhere.path().join("src"), true);
                let out = pack_in(elsewhere.path(), "moved", source, m, format, shuffle, "2");
                let (_, expected) = reference.as_ref().unwrap();
                assert_same(
                    expected,
                    &contents(&out, format),
                    &format!("{config}: packed from a copy elsewhere"),
                );
            }
        }
    }
    let (ordered, shuffled) = (&orders[0], &orders[1]);
    assert_ne!(ordered, shuffled, "{source:?} --mode {mode}: --shuffle changes the order");
    let (mut a, mut b) = (ordered.clone(), shuffled.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "{source:?} --mode {mode}: --shuffle packs the same samples");
}

/// Runs `pack` from `cwd` on `src` (relative, as a user would type it) into `outs/{name}`.
fn pack_in(
    cwd: &Path,
    name: &str,
    source: Source,
    m: usize,
    format: &str,
    shuffle: bool,
    threads: &str,
) -> std::path::PathBuf {
    let out = Path::new("outs").join(name);
    fs::create_dir_all(cwd.join("outs")).unwrap();
    let mut cmd =
        pack(&[&"imagefolder", &"src", &"--to", &format, &"-o", &out, &"-q", &"--threads", &threads]);
    cmd.current_dir(cwd).args(MODES[m]);
    if format == "webdataset" {
        cmd.args(source.shard_args());
    }
    if shuffle {
        cmd.args(["--shuffle", "--seed", SEED]);
    }
    let assert = cmd.assert().code(source.exit_code());
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    cwd.join(out)
}

impl Source {
    /// Writes the tree at `to`, creating its files in sorted order or, `reversed`, in the
    /// opposite one, so that the directories of two copies list their entries in different
    /// orders on most file systems.
    fn write(self, to: &Path, reversed: bool) {
        let mut files: Vec<(String, Vec<u8>)> = match self {
            Source::Testdata => files_below(&testdata().join("imagefolder"), ""),
            Source::Generated => generated().to_vec(),
        };
        files.sort();
        if reversed {
            files.reverse();
        }
        for (rel, bytes) in files {
            let path = to.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, bytes).unwrap();
        }
    }

    /// Small shards, so that every output has several.
    fn shard_args(self) -> [&'static str; 4] {
        match self {
            Source::Testdata => ["--shard-size", "100kB", "--shard-samples", "8"],
            Source::Generated => ["--shard-size", "100kB", "--shard-samples", "40"],
        }
    }

    /// The generated tree holds an empty file and an HTML page, skipped in every mode.
    fn exit_code(self) -> i32 {
        match self {
            Source::Testdata => 0,
            Source::Generated => 3,
        }
    }
}

/// Every file below `dir`: (path relative to the walk's root, bytes).
fn files_below(dir: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let rel = format!("{prefix}{}", entry.file_name().into_string().unwrap());
        if entry.file_type().unwrap().is_dir() {
            files.extend(files_below(&entry.path(), &format!("{rel}/")));
        } else {
            files.push((rel, fs::read(entry.path()).unwrap()));
        }
    }
    files
}

// --------------------------------------------------------------------------- reading outputs

/// A WebDataset output's files by name, or an LMDB output's records by key.
fn contents(out: &Path, format: &str) -> Contents {
    if format == "webdataset" {
        let mut files = Contents::new();
        for entry in fs::read_dir(out).unwrap() {
            let entry = entry.unwrap();
            assert!(entry.file_type().unwrap().is_file(), "{}: only files", entry.path().display());
            files.insert(entry.file_name().into_encoded_bytes(), fs::read(entry.path()).unwrap());
        }
        files
    } else {
        let (records, _) = lmdb_records(out);
        records
    }
}

/// Every record of an LMDB output, and its last transaction id (how many write transactions
/// built it).
fn lmdb_records(out: &Path) -> (Contents, usize) {
    let mut options = EnvOpenOptions::new();
    // SAFETY: read-only and without the lock file, on a finished output that nothing writes
    // any more; the environment is dropped before this function returns.
    let env = unsafe {
        options.flags(EnvFlags::READ_ONLY | EnvFlags::NO_LOCK);
        options.open(out)
    }
    .unwrap();
    let txn = env.read_txn().unwrap();
    let db: Database<Bytes, Bytes> = env.open_database(&txn, None).unwrap().expect("the main database");
    let records = db.iter(&txn).unwrap().map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap()).collect();
    let txns = env.info().last_txn_id;
    drop(txn);
    (records, txns)
}

/// The source paths of the samples, in sample order.
fn sample_paths(out: &Path) -> Vec<String> {
    let ds = imgpack_reader::open(out).unwrap();
    ds.iter().unwrap().map(|s| s.unwrap().info().unwrap().path).collect()
}

fn assert_same(expected: &Contents, actual: &Contents, context: &str) {
    let names = |c: &Contents| c.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect::<Vec<_>>();
    assert_eq!(names(expected), names(actual), "{context}: the same files / keys");
    for (name, bytes) in expected {
        let other = &actual[name];
        if bytes != other {
            let at =
                bytes.iter().zip(other).position(|(a, b)| a != b).unwrap_or(bytes.len().min(other.len()));
            panic!(
                "{context}: {} differs: {} bytes against {}, first difference at byte {at}",
                String::from_utf8_lossy(name),
                bytes.len(),
                other.len()
            );
        }
    }
}

// --------------------------------------------------------------------------- checks

/// The configurations really exercise what they are meant to: several shards, and for the
/// generated tree in passthrough several LMDB write transactions.
fn check_preconditions(
    out: &Path,
    contents: &Contents,
    source: Source,
    m: usize,
    format: &str,
    shuffle: bool,
    config: &str,
) {
    if format == "webdataset" {
        let shards = contents.keys().filter(|k| k.ends_with(b".tar")).count();
        assert!(shards >= 3, "{config}: several shards, got {shards}");
    } else if source == Source::Generated && m == 0 && !shuffle {
        // One transaction creates the database, one per batch of samples writes them, one
        // writes the metadata: at least two batches.
        let (_, txns) = lmdb_records(out);
        assert!(txns >= 4, "{config}: several LMDB batches, got {txns} write transactions");
    }
}

/// No output holds the host name, the directory of the run, the output's name or temporary
/// name, or a timestamp (tar headers included).
fn check_no_leaks(out: &Path, contents: &Contents, format: &str, run_dir: &Path, name: &str, config: &str) {
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert!(!hostname.is_empty(), "/proc/sys/kernel/hostname is empty");
    let real_dir = fs::canonicalize(run_dir).unwrap();
    let forbidden: [&[u8]; 4] = [
        run_dir.as_os_str().as_encoded_bytes(),
        real_dir.as_os_str().as_encoded_bytes(),
        name.as_bytes(),
        b".imgpack-tmp",
    ];
    // An LMDB's files are checked whole too: free pages can hold bytes no record shows.
    let mut raw = Vec::new();
    if format == "lmdb" {
        for entry in fs::read_dir(out).unwrap() {
            let entry = entry.unwrap();
            raw.push((entry.file_name().into_encoded_bytes(), fs::read(entry.path()).unwrap()));
        }
        assert!(raw.iter().any(|(name, _)| name == b"data.mdb"), "{config}: data.mdb was read");
    }
    for (key, bytes) in contents.iter().chain(raw.iter().map(|(k, v)| (k, v))) {
        for needle in forbidden {
            assert!(
                !contains(bytes, needle),
                "{config}: {} holds {:?}",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(needle)
            );
        }
    }
    // Text: metadata, indexes and every sample's json record.
    let mut texts: Vec<(String, Vec<u8>)> = contents
        .iter()
        .filter(|(k, _)| k.as_slice() == b"__meta__" || k.ends_with(b".json") || k.ends_with(b".idx"))
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
        .collect();
    if format == "webdataset" {
        let ds = imgpack_reader::open(out).unwrap();
        for sample in ds.iter().unwrap() {
            let sample = sample.unwrap();
            texts.push((format!("{}.json", sample.key), sample.field("json").unwrap().to_vec()));
        }
        check_tar_headers(out, contents, config);
    }
    assert!(texts.len() > 10, "{config}: the text records were found");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let year = civil_year(now).to_string();
    for (key, text) in &texts {
        let text = std::str::from_utf8(text).unwrap_or_else(|_| panic!("{config}: {key} is UTF-8"));
        assert!(!holds_word(text, &hostname), "{config}: {key} holds the host name {hostname:?}");
        if key == "__meta__" || !key.starts_with(|c: char| c.is_ascii_digit()) && key.ends_with(".json") {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            check_no_time(&value, now, &year, &format!("{config}: {key}"));
        }
    }
}

/// Tar members carry no time, owner or user name.
fn check_tar_headers(out: &Path, contents: &Contents, config: &str) {
    for shard in contents.keys().filter(|k| k.ends_with(b".tar")) {
        let shard = out.join(String::from_utf8(shard.clone()).unwrap());
        let mut archive = tar::Archive::new(fs::File::open(&shard).unwrap());
        for entry in archive.entries().unwrap().raw(true) {
            let entry = entry.unwrap();
            let h = entry.header();
            let context = format!(
                "{config}: {} member {:?}",
                shard.display(),
                String::from_utf8_lossy(&h.path_bytes())
            );
            assert_eq!(h.mtime().unwrap(), 0, "{context}");
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0), "{context}");
            assert_eq!(h.username_bytes().unwrap_or_default(), b"", "{context}");
            assert_eq!(h.groupname_bytes().unwrap_or_default(), b"", "{context}");
        }
    }
}

/// No number within two days of now (as seconds, milliseconds, microseconds or nanoseconds
/// since the epoch), no string holding this year (long hex digests aside).
fn check_no_time(value: &serde_json::Value, now: u64, year: &str, context: &str) {
    match value {
        serde_json::Value::Number(n) => {
            if let Some(v) = n.as_u64() {
                for scale in [1, 1_000, 1_000_000, 1_000_000_000] {
                    let t = v / scale;
                    assert!(t.abs_diff(now) > 2 * 86_400, "{context}: {v} looks like a timestamp");
                }
            }
        }
        serde_json::Value::String(s) => {
            let digest = s.len() >= 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
            assert!(digest || !s.contains(year), "{context}: {s:?} holds the year {year}");
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| check_no_time(v, now, year, context)),
        serde_json::Value::Object(map) => map.values().for_each(|v| check_no_time(v, now, year, context)),
        _ => {}
    }
}

/// The Gregorian year of a Unix time (Howard Hinnant's `civil_from_days`).
fn civil_year(secs: u64) -> i64 {
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    yoe + era * 400 + i64::from(month <= 2)
}

/// Whether `word` occurs in `text` other than inside a longer word or number: a short host
/// name such as `vm` must not match inside a file name, while `vm`, `"vm"` or `vm:/tmp` do.
fn holds_word(text: &str, word: &str) -> bool {
    let inner = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric());
    text.match_indices(word).any(|(at, _)| {
        !inner(text[..at].chars().next_back()) && !inner(text[at + word.len()..].chars().next())
    })
}

/// Whether `needle` occurs in `haystack`, with glibc's `memmem`: outputs reach tens of MB,
/// too much for a byte loop in a debug build.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    assert!(!needle.is_empty());
    // SAFETY: both pointers and lengths come from live slices; memmem only reads them.
    let found = unsafe {
        libc::memmem(haystack.as_ptr().cast(), haystack.len(), needle.as_ptr().cast(), needle.len())
    };
    !found.is_null()
}

// --------------------------------------------------------------------------- the generated tree

/// ~300 small images in six classes, made once per test process: (relative path, bytes).
fn generated() -> &'static [(String, Vec<u8>)] {
    static TREE: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut state = 0x1234_5678_9ABC_DEF1u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut files = Vec::new();
        // Eight JPEGs of 1.5 MB (trailing bytes after the image, as some cameras append): in
        // passthrough the first batch of samples is then large, so the following ones are
        // shorter and the LMDB output takes several transactions.
        for i in 0..8 {
            let mut bytes = image_bytes(48, 40, 3, image::ImageFormat::Jpeg, i);
            bytes.resize(1_500_000, (i * 37) as u8);
            files.push((format!("a_big/big_{i}.jpg"), bytes));
        }
        let classes = [("b_birds", 61), ("c_cars", 48), ("d_dogs", 55), ("e_elms", 70), ("f_figs", 66)];
        for (c, (class, count)) in classes.into_iter().enumerate() {
            for i in 0..count {
                let (w, h) = (12 + next(33) as u32, 12 + next(33) as u32);
                let seed = (c * 1000 + i) as u64;
                let (channels, format, ext) = match next(10) {
                    0..=5 => (3, image::ImageFormat::Jpeg, "jpg"),
                    6 => (1, image::ImageFormat::Jpeg, "jpeg"),
                    7 => (3, image::ImageFormat::Png, "png"),
                    8 => (4, image::ImageFormat::Png, "png"),
                    _ => (1, image::ImageFormat::Png, "PNG"),
                };
                let sub = if i % 7 == 3 { "nested/" } else { "" };
                files.push((
                    format!("{class}/{sub}img_{i:03}.{ext}"),
                    image_bytes(w, h, channels, format, seed),
                ));
            }
        }
        files.push(("c_cars/empty.jpg".into(), Vec::new()));
        files.push(("d_dogs/page.jpg".into(), b"<!DOCTYPE html><html><body>404</body></html>".to_vec()));
        let whole = image_bytes(64, 64, 3, image::ImageFormat::Jpeg, 99);
        files.push(("e_elms/cut.jpg".into(), whole[..whole.len() / 2].to_vec()));
        files
    })
}

/// An image of smooth gradients and a little noise, encoded as `format`.
fn image_bytes(width: u32, height: u32, channels: u8, format: image::ImageFormat, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let pixel = |x: u32, y: u32, k: u32, state: &mut u64| {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        ((x * 255 / width + y * 97 / height + k * 60 + seed as u32) as u8).wrapping_add((*state & 15) as u8)
    };
    let image = match channels {
        1 => image::DynamicImage::ImageLuma8(image::GrayImage::from_fn(width, height, |x, y| {
            image::Luma([pixel(x, y, 0, &mut state)])
        })),
        3 => image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([0, 1, 2].map(|k| pixel(x, y, k, &mut state)))
        })),
        _ => image::DynamicImage::ImageRgba8(image::RgbaImage::from_fn(width, height, |x, y| {
            image::Rgba([0, 1, 2, 3].map(|k| pixel(x, y, k, &mut state)))
        })),
    };
    let mut out = Vec::new();
    image.write_to(&mut std::io::Cursor::new(&mut out), format).unwrap();
    out
}
