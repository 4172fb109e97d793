//! The parsers of a sample's small fields and of the metadata, over arbitrary bytes: `cls`
//! (`Sample::label`), `json` (`Sample::info`, `SampleInfo::path_bytes`) and the dataset `Meta`.
//! Input parts: the `cls` bytes, the `json` bytes, the metadata bytes. Accepted metadata must
//! have a key width a key can be built from cheaply and must round-trip through JSON.
#![no_main]

use std::borrow::Cow;
use std::path::Path;

use imgpack_reader::key::{format_key, MAX_KEY_WIDTH, MIN_KEY_WIDTH};
use imgpack_reader::{Field, Meta, Sample, SampleInfo};
use imgpack_reader_fuzz::split;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parts = split(data);
    let part = |i: usize| parts.get(i).copied().unwrap_or_default();
    let sample = Sample {
        index: 0,
        key: "00000000".into(),
        fields: [("cls", part(0)), ("json", part(1))]
            .into_iter()
            .map(|(ext, data)| Field { ext: ext.into(), data: Cow::Borrowed(data) })
            .collect(),
        dataset: Path::new("/fuzz").into(),
    };
    if let Ok(label) = sample.label() {
        let text = std::str::from_utf8(part(0)).unwrap();
        assert_eq!(text.trim().parse::<u32>(), Ok(label));
    }
    if let Ok(info) = sample.info() {
        if let Ok(bytes) = info.path_bytes() {
            assert_eq!(SampleInfo::new(&bytes, &info.class).path_bytes(), Ok(bytes));
        }
    }
    if let Ok(meta) = serde_json::from_slice::<Meta>(part(2)) {
        assert!((MIN_KEY_WIDTH..=MAX_KEY_WIDTH).contains(&meta.key_width));
        assert!(format_key(meta.samples, meta.key_width).len() <= MAX_KEY_WIDTH);
        let mut again: Meta = serde_json::from_slice(&serde_json::to_vec(&meta).unwrap()).unwrap();
        // `options` is free JSON, and serde_json's default float parsing may land one ulp off,
        // so a float there need not survive a round trip exactly; everything else must.
        again.options = meta.options.clone();
        assert_eq!(again, meta);
    }
});
