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

use imgpack::cluster::merge::{merge, MergeOptions};
use imgpack::progress::Progress;
use imgpack::Error;

// The integration binary's helpers (not all used here).
#[allow(dead_code)]
#[path = "util.rs"]
mod util;

use util::{dump, pack, Fixture};

/// Asks for a stop as soon as the merge starts its work, as a Ctrl-C then would.
struct StopAtStart;

impl Progress for StopAtStart {
    fn length(&self, _total: u64) {
        imgpack::interrupt::request();
    }
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

#[test]
fn a_merge_stopped_before_publishing_changes_nothing_and_running_it_again_finishes_it() {
    let fx = Fixture::new();
    // Early in the plan (the first class): the later part's keys move down, and a WebDataset
    // merge has shards to rewrite.
    fx.add_bad("cat", "garbage.jpg");
    let plan = fx.out("tree.plan");
    pack(&[&"plan", &fx.tree(), &"-o", &plan, &"-q"]).assert().code(0);
    for to in ["lmdb", "webdataset"] {
        let (out, single) = (fx.out(to), fx.out(&format!("{to}-single")));
        // Small shards: a WebDataset part has several, each rewritten by the merge.
        let shards: &[&str] = if to == "webdataset" { &["--shard-samples", "4"] } else { &[] };
        pack(&[&plan, &"--to", &to, &"-o", &single, &"-q"]).args(shards).assert().code(3);
        for k in 0..2 {
            let part = format!("{k}/2");
            // Only the first part holds the corrupt file.
            let code = if k == 0 { 3 } else { 0 };
            pack(&[&plan, &"--part", &part, &"--to", &to, &"-o", &out, &"-q"])
                .args(shards)
                .assert()
                .code(code);
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

        // Run again, the merge reports the skipped file and reads as the single run, key by key.
        pack(&[&"merge", &out, &"-q"]).assert().code(3);
        assert!(dump(&out).1 == dump(&single).1, "{to}: the merge run again differs from a single run");
    }
}
