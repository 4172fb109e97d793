//! A whole WebDataset from arbitrary bytes (see the crate docs for the input's parts): written
//! to a scratch directory, opened, and every sample read, with and without checksums. Opening
//! may fail with any error, but what it accepts must only name shards inside the directory,
//! and every sample it returns must pass `check_sample`.
#![no_main]

use imgpack_reader::webdataset::WebDataset;
use imgpack_reader::Error;
use imgpack_reader_fuzz::{check_sample, flags, fresh_dir, stays_inside, write_webdataset, MAX_SAMPLES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let run = fresh_dir("wds");
    let dir = run.join("ds");
    std::fs::create_dir(&dir).unwrap();
    let flags = write_webdataset(&dir, data);
    read(&dir, flags);
    std::fs::remove_dir_all(&run).unwrap();
});

fn read(dir: &std::path::Path, flags: u8) {
    let Ok(ds) = WebDataset::open(dir) else { return };
    for shard in &ds.meta().shards {
        assert!(stays_inside(&shard.name), "opened shard {:?}", shard.name);
    }
    let Ok(ds) = ds.verify_checksums(flags & flags::VERIFY != 0) else { return };
    let width = ds.meta().key_width;
    for i in 0..ds.len().min(MAX_SAMPLES) {
        if let Ok(sample) = ds.get(i) {
            check_sample(&sample, i, width);
        }
    }
    assert!(matches!(ds.get(ds.len()), Err(Error::OutOfRange { .. })));
    assert!(matches!(ds.get(u64::MAX), Err(Error::OutOfRange { .. })));
    let via_open = imgpack_reader::open(dir).expect("opens the same way through detection");
    assert_eq!(via_open.len(), ds.len());
}
