//! Shared helpers: temporary ImageFolder trees built from `testdata/`, running `pack`, and
//! reading the source the way torchvision does.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use assert_cmd::Command;

/// The bundled real ImageFolder.
pub fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

/// A temporary directory with a copy of `testdata/imagefolder` at `tree/`.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Fixture {
        let fixture = Fixture { dir: tempfile::tempdir().unwrap() };
        copy_tree(&testdata().join("imagefolder"), &fixture.tree());
        fixture
    }

    pub fn tree(&self) -> PathBuf {
        self.dir.path().join("tree")
    }

    pub fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Copies `testdata/bad/{name}` into class `class` of the tree.
    pub fn add_bad(&self, class: &str, name: &str) -> PathBuf {
        let dest = self.tree().join(class).join(name);
        fs::copy(testdata().join("bad").join(name), &dest).unwrap();
        dest
    }
}

pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            fs::copy(entry.path(), dest).unwrap();
        }
    }
}

/// `pack` with the given arguments.
pub fn pack(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Command {
    let mut cmd = Command::cargo_bin("pack").unwrap();
    for a in args {
        cmd.arg(a);
    }
    cmd
}

/// The source samples in torchvision order for a tree whose class folders hold files directly
/// (no nesting): (path relative to root, class index). Independent of the code under test.
pub fn expected_samples(root: &Path, exts: &[&str]) -> Vec<(String, u32)> {
    let mut classes: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    classes.sort();
    let mut out = Vec::new();
    for (i, class) in classes.iter().enumerate() {
        let mut files: Vec<String> = fs::read_dir(root.join(class))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| exts.iter().any(|e| n.to_lowercase().ends_with(&format!(".{e}"))))
            .collect();
        files.sort();
        out.extend(files.into_iter().map(|f| (format!("{class}/{f}"), i as u32)));
    }
    out
}

pub const ALL_EXTS: [&str; 9] = ["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"];

/// The JSON summary printed by `pack --json`.
pub fn summary(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .find(|l| l.contains("\"type\":\"summary\""))
        .unwrap_or_else(|| panic!("no summary in {text}"));
    serde_json::from_str(line).unwrap()
}

/// A sample's fields as (extension, bytes) pairs.
pub type Fields = Vec<(String, Vec<u8>)>;
/// A whole dataset: its metadata and every (key, fields), for key-by-key comparison.
pub type Dump = (imgpack_reader::Meta, Vec<(String, Fields)>);

/// Every sample of a dataset as (key, fields) for key-by-key comparison.
pub fn dump(path: &Path) -> Dump {
    let ds = imgpack_reader::open(path).unwrap();
    let samples = ds
        .iter()
        .unwrap()
        .map(|s| {
            let s = s.unwrap();
            (s.key.clone(), s.fields.iter().map(|f| (f.ext.clone(), f.data.to_vec())).collect())
        })
        .collect();
    (ds.meta().clone(), samples)
}

/// Every file of a WebDataset output by name, or every LMDB record by key: what "identical"
/// means for each format.
pub fn contents(out: &Path) -> BTreeMap<String, Vec<u8>> {
    if out.join("data.mdb").exists() {
        let env = unsafe {
            heed::EnvOpenOptions::new()
                .flags(heed::EnvFlags::READ_ONLY | heed::EnvFlags::NO_LOCK)
                .open(out)
                .unwrap()
        };
        let txn = env.read_txn().unwrap();
        let db: heed::Database<heed::types::Bytes, heed::types::Bytes> =
            env.open_database(&txn, None).unwrap().unwrap();
        let all = db
            .iter(&txn)
            .unwrap()
            .map(|r| r.map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.to_vec())).unwrap())
            .collect();
        drop(txn);
        env.prepare_for_closing().wait();
        all
    } else {
        fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).unwrap()))
            .collect()
    }
}

/// Waits until `path` exists (a run's temporary or journal appears), for at most a minute:
/// what follows fails with its own message if it never does.
pub fn wait_for(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// A tree of `copies` x the 31 testdata images, so a run lasts long enough to be interrupted.
pub fn big_tree(dir: &Path, copies: usize) -> PathBuf {
    let root = dir.join("src");
    let base = dir.join("base");
    copy_tree(&testdata().join("imagefolder"), &base);
    for class in fs::read_dir(&base).unwrap() {
        let class = class.unwrap().path();
        let dest = root.join(class.file_name().unwrap());
        fs::create_dir_all(&dest).unwrap();
        for file in fs::read_dir(&class).unwrap() {
            let file = file.unwrap().path();
            for i in 0..copies {
                fs::copy(&file, dest.join(format!("{i:02}_{}", file.file_name().unwrap().to_string_lossy())))
                    .unwrap();
            }
        }
    }
    root
}
