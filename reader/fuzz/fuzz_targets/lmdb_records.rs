//! An LMDB dataset whose records are arbitrary: the `__meta__` JSON, the `__checksums__` table
//! and the sample records come from the input (see the crate docs), LMDB's own page format does
//! not (that is liblmdb's). Opened, checksums turned on, every sample read: errors are fine,
//! panics are not, and every sample returned must pass `check_sample`.
#![no_main]

use imgpack_reader::lmdb::LmdbDataset;
use imgpack_reader::Error;
use imgpack_reader_fuzz::{check_sample, flags, fresh_dir, write_lmdb, MAX_SAMPLES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = fresh_dir("lmdb");
    let flags = write_lmdb(&dir, data);
    read(&dir, flags);
    std::fs::remove_dir_all(&dir).unwrap();
});

fn read(dir: &std::path::Path, flags: u8) {
    let Ok(ds) = LmdbDataset::open(dir) else { return };
    let _ = ds.checksum_table();
    let Ok(ds) = ds.verify_checksums(flags & flags::VERIFY != 0) else { return };
    let width = ds.meta().key_width;
    let snapshot = ds.snapshot().expect("a read transaction");
    for i in 0..ds.len().min(MAX_SAMPLES) {
        if let Ok(sample) = snapshot.get(i) {
            check_sample(&sample, i, width);
        }
    }
    assert!(matches!(snapshot.get(ds.len()), Err(Error::OutOfRange { .. })));
    drop(snapshot);
    for (i, sample) in ds.iter().expect("an iterator").take(MAX_SAMPLES as usize).enumerate() {
        if let Ok(sample) = sample {
            check_sample(&sample, i as u64, width);
        }
    }
}
