//! Warm random-read latency of `imgpack-reader`'s `get(i)`, per call, as percentiles.
//!
//! Writes a WebDataset and an LMDB dataset of `IMGPACK_BENCH_SAMPLES` (default 5,000) samples of
//! ~80 kB each through the library's own sinks, warms the page cache, then times `get(i)` for
//! seeded random `i`, one call at a time with `Instant`. Run: `cargo bench --bench reader_get`.
//!
//! Reported: p50, p90, p99 and max in microseconds for
//! - WebDataset `get(i)`: the sample's bytes in hand as slices of the shard map (zero-copy),
//!   and the same followed by reading every byte;
//! - LMDB `Snapshot::get(i)` (zero-copy from the LMDB map), likewise;
//! - LMDB `get(i)` (a read transaction and a copy per call), then reading every byte;
//! - a `pread` of the sample's byte range from the shard, then reading every byte, for scale.

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use imgpack::sink::lmdb::LmdbSink;
use imgpack::sink::webdataset::{ShardLimits, WebDatasetSink};
use imgpack::sink::{PackedSample, Sink};
use imgpack_reader::lmdb::LmdbDataset;
use imgpack_reader::webdataset::WebDataset;
use imgpack_reader::{Meta, SourceInfo};

const READS: usize = 20_000;

fn main() {
    let samples: u64 =
        std::env::var("IMGPACK_BENCH_SAMPLES").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let wds_path = dir.path().join("wds");
    let lmdb_path = dir.path().join("db.lmdb");
    let mut wds: Box<dyn Sink> = Box::new(
        WebDatasetSink::create(
            &wds_path,
            false,
            "shard",
            ShardLimits { max_bytes: 1_000_000_000, max_samples: None },
            false,
        )
        .unwrap(),
    );
    let mut lmdb: Box<dyn Sink> = Box::new(LmdbSink::create(&lmdb_path, false, samples * 90_000).unwrap());
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for start in (0..samples).step_by(256) {
        let batch: Vec<PackedSample> = (start..(start + 256).min(samples))
            .map(|i| {
                let len = 80_000 + (next() % 30_000) as usize;
                let mut image = vec![0u8; len];
                image.iter_mut().for_each(|b| *b = next() as u8);
                image[..3].copy_from_slice(&[0xFF, 0xD8, 0xFF]);
                PackedSample {
                    key: format!("{i:08}"),
                    fields: vec![
                        ("cls".into(), (i % 1000).to_string().into_bytes()),
                        ("jpg".into(), image),
                        ("json".into(), br#"{"path":"c/x.jpg","class":"c"}"#.to_vec()),
                    ],
                    crcs: Vec::new(),
                }
            })
            .collect();
        wds.write_batch(&batch).unwrap();
        lmdb.write_batch(&batch).unwrap();
    }
    let meta = |format: &str| Meta {
        format: format.into(),
        version: imgpack_reader::FORMAT_VERSION,
        samples,
        key_width: 8,
        classes: (0..1000).map(|c| format!("c{c}")).collect(),
        fields: vec!["cls".into(), "jpg".into(), "json".into()],
        source: SourceInfo { kind: "bench".into(), root: "-".into() },
        options: serde_json::json!({}),
        tool: imgpack::TOOL.into(),
        checksum: None,
        shards: Vec::new(),
        part: None,
    };
    wds.finish(&meta(imgpack_reader::webdataset::FORMAT_NAME)).unwrap();
    lmdb.finish(&meta(imgpack_reader::lmdb::FORMAT_NAME)).unwrap();

    let order: Vec<u64> = (0..READS).map(|_| next() % samples).collect();
    let wds = WebDataset::open(&wds_path).unwrap();
    let lmdb = LmdbDataset::open(&lmdb_path).unwrap();
    // Touch every byte: sum 8-byte words (vectorised), so the bytes really come from memory.
    let touch = |bytes: &[u8]| {
        let words = bytes.chunks_exact(8);
        let tail = words.remainder().iter().fold(0u64, |a, &b| a.wrapping_add(u64::from(b)));
        words.fold(tail, |a, w| a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap())))
    };

    println!("warm random get(i), {samples} samples of 80-110 kB, {READS} reads each");
    println!("{:<38} {:>8} {:>8} {:>8} {:>8}", "reader", "p50 us", "p90 us", "p99 us", "max us");
    let len = |bytes: &[u8]| bytes.len() as u64;
    report("webdataset get(i)", &order, |i| len(wds.get(i).unwrap().image().unwrap().1));
    report("webdataset get(i) + read all bytes", &order, |i| touch(wds.get(i).unwrap().image().unwrap().1));
    let snapshot = lmdb.snapshot().unwrap();
    report("lmdb snapshot.get(i)", &order, |i| len(snapshot.get(i).unwrap().image().unwrap().1));
    report("lmdb snapshot.get(i) + read all", &order, |i| touch(snapshot.get(i).unwrap().image().unwrap().1));
    drop(snapshot);
    report("lmdb get(i) (txn + copy) + read all", &order, |i| touch(lmdb.get(i).unwrap().image().unwrap().1));
    let shard = File::open(wds_path.join("shard-000000.tar")).unwrap();
    let mut buf = vec![0u8; 120_000];
    report("pread of the sample + read all", &order, |i| {
        let entry = wds.entry(i).unwrap();
        let buf = &mut buf[..entry.len as usize];
        shard.read_exact_at(buf, entry.offset).unwrap();
        touch(buf)
    });
}

fn report(name: &str, order: &[u64], mut read: impl FnMut(u64) -> u64) {
    for &i in order.iter().take(2_000) {
        black_box(read(i)); // warm-up: page cache and code
    }
    let mut micros: Vec<f64> = order
        .iter()
        .map(|&i| {
            let start = Instant::now();
            black_box(read(i));
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
    println!(
        "{name:<38} {:>8.2} {:>8.2} {:>8.2} {:>8.1}",
        at(0.5),
        at(0.9),
        at(0.99),
        micros[micros.len() - 1]
    );
}
