//! A `pack merge` stopped by Ctrl-C or SIGTERM before it publishes the merged dataset fails
//! with [`Error::MergeInterrupted`] (exit 130 in the CLI), leaves the output exactly as it found
//! it — every part byte for byte, no temporary — and the same merge run again finishes it.
//!
//! In a test binary of its own: the stop request is process-wide, and would stop any other
//! merge or run of the same process. The parts are packed, and the merge run again, by `pack`
//! processes of their own.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::Command;

use imgpack::cluster::merge::{merge, MergeOptions};
use imgpack::progress::Progress;
use imgpack::Error;

/// Asks for a stop as soon as the merge starts its work, as a Ctrl-C then would.
struct StopAtStart;

impl Progress for StopAtStart {
    fn length(&self, _total: u64) {
        imgpack::interrupt::request();
    }
}

/// `pack` with `args`.
fn pack(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pack"));
    cmd.args(args);
    cmd
}

/// Runs `cmd` to its end; returns its exit code, which must be success or "some files skipped".
fn run(cmd: &mut Command) -> i32 {
    let out = cmd.output().unwrap();
    let code = out.status.code().unwrap();
    assert!(code == 0 || code == 3, "pack exited {code}: {}", String::from_utf8_lossy(&out.stderr));
    code
}

/// Every file under `dir` (hidden ones too), by path relative to it, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.insert(path.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&path).unwrap());
            }
        }
    }
    found
}

/// The test images with a corrupt file first in the plan, so the later part's keys move down
/// and a WebDataset merge has shards to rewrite.
fn tree_with_a_skip(dir: &Path) -> PathBuf {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let root = dir.join("tree");
    for class in std::fs::read_dir(testdata.join("imagefolder")).unwrap() {
        let class = class.unwrap().path();
        let to = root.join(class.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for image in std::fs::read_dir(&class).unwrap() {
            let image = image.unwrap().path();
            std::fs::copy(&image, to.join(image.file_name().unwrap())).unwrap();
        }
    }
    let first = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).min().unwrap();
    std::fs::copy(testdata.join("bad/garbage.jpg"), first.join("000_garbage.jpg")).unwrap();
    root
}

#[test]
fn a_merge_stopped_before_publishing_changes_nothing_and_running_it_again_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let tree = tree_with_a_skip(dir.path());
    let plan = dir.path().join("tree.plan");
    assert_eq!(run(&mut pack(&[&"plan", &tree, &"-o", &plan, &"-q"])), 0);
    for to in ["lmdb", "webdataset"] {
        let out = dir.path().join(to);
        let single = dir.path().join(format!("{to}-single"));
        // Small shards: a WebDataset part has several, each rewritten by the merge.
        let shards: &[&str] = if to == "webdataset" { &["--shard-samples", "4"] } else { &[] };
        assert_eq!(run(pack(&[&plan, &"--to", &to, &"-o", &single, &"-q"]).args(shards)), 3);
        for k in 0..2 {
            let part = format!("{k}/2");
            let code = run(pack(&[&plan, &"--part", &part, &"--to", &to, &"-o", &out, &"-q"]).args(shards));
            assert_eq!(
                code,
                if k == 0 { 3 } else { 0 },
                "part {part}: only the first holds the corrupt file"
            );
        }
        let before = files(&out);

        let options = MergeOptions { keep_parts: false, threads: NonZeroUsize::MIN, endpoint: None };
        let err = merge(&out, &options, &StopAtStart).expect_err("the merge went on after the stop request");
        assert!(matches!(&err, Error::MergeInterrupted { path } if path == &out), "{to}: {err}");
        assert!(err.to_string().contains(&format!("run `pack merge {}` again", out.display())), "{err}");
        assert!(imgpack_reader::detect(&out).is_none(), "{to}: an interrupted merge published a dataset");
        let after = files(&out);
        let changed: Vec<_> =
            before.keys().chain(after.keys()).filter(|p| before.get(*p) != after.get(*p)).collect();
        assert!(changed.is_empty(), "{to}: the interrupted merge changed, added or removed {changed:?}");

        assert_eq!(
            run(&mut pack(&[&"merge", &out, &"-q"])),
            3,
            "{to}: the merge run again reports the skipped file"
        );
        let (merged, single) = (imgpack_reader::open(&out).unwrap(), imgpack_reader::open(&single).unwrap());
        assert_eq!(merged.len(), single.len());
        for i in 0..single.len() {
            let (a, b) = (merged.get(i).unwrap(), single.get(i).unwrap());
            assert_eq!(
                (&a.key, a.label().unwrap(), a.payload().unwrap()),
                (&b.key, b.label().unwrap(), b.payload().unwrap()),
                "{to}: {i}"
            );
        }
    }
}
