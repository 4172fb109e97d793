//! The index parsers over arbitrary bytes: `imgpack.index`'s header and entries, the LMDB
//! checksum table, and a DALI `.idx` file. None may panic or allocate by a count it read; what
//! one accepts must encode back to the same bytes (or, for DALI text, parse back the same).
#![no_main]

use imgpack_reader::checksum::Table;
use imgpack_reader::webdataset::{
    dali_index_header, dali_index_line, parse_dali_index, IndexEntry, IndexHeader, INDEX_ENTRY_LEN,
    INDEX_HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(header) = IndexHeader::decode(data) {
        assert_eq!(header.encode(), data[..INDEX_HEADER_LEN]);
    }
    for chunk in data.get(INDEX_HEADER_LEN..).unwrap_or_default().chunks_exact(INDEX_ENTRY_LEN) {
        let entry = IndexEntry::decode(chunk.try_into().unwrap());
        assert_eq!(entry.encode(), chunk);
    }

    if let Ok(table) = Table::decode(data) {
        assert_eq!(table.encode(), data);
    }

    let text = String::from_utf8_lossy(data);
    if let Ok(samples) = parse_dali_index(&text) {
        let mut again = dali_index_header(samples.len() as u64);
        for sample in &samples {
            again.push_str(&dali_index_line(sample));
        }
        assert_eq!(parse_dali_index(&again).as_ref(), Ok(&samples), "{again:?}");
    }
});
