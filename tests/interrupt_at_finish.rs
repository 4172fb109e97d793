//! A stop request (Ctrl-C, SIGTERM) that arrives while a run is finishing its output — after
//! the last checkpoint, during the final sync — publishes the whole output and says so, rather
//! than exiting 0 as if nothing had been asked.
//!
//! In a test binary of its own: the request is process-wide, and would stop any other run of
//! the same process.

use imgpack::pack::config::{OutputFormat, PackConfig};
use imgpack::pack::pipeline::{self, FINISHED_THOUGH_INTERRUPTED, FINISHING_SYNC};
use imgpack::progress::Progress;

/// Asks for a stop when the pipeline says it is syncing the finished output, as a Ctrl-C then
/// would.
struct StopWhileSyncing;

impl Progress for StopWhileSyncing {
    fn message(&self, text: &str) {
        if text == FINISHING_SYNC {
            imgpack::interrupt::request();
        }
    }
}

#[test]
fn a_stop_during_the_final_sync_publishes_the_whole_output_with_a_warning() {
    let tree = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.lmdb");
    let config = PackConfig::new(&tree, &out, OutputFormat::Lmdb);
    let report = pipeline::pack(&config, &StopWhileSyncing).expect("the run completes");
    assert!(imgpack::interrupt::requested(), "the stop was never asked for: the hook did not run");
    assert_eq!(report.packed, 31);
    assert!(report.warnings.iter().any(|w| w == FINISHED_THOUGH_INTERRUPTED), "{:?}", report.warnings);
    // Published and whole: it opens, with every sample.
    let dataset = imgpack_reader::open(&out).expect("the output was published");
    assert_eq!(dataset.len(), 31);
}
