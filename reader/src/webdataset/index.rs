//! Encode and decode of `imgpack.index`, the binary sample index: header and entries side by
//! side, so the writer and the reader cannot disagree on a byte. The layout is documented once,
//! in the [module docs](super#binary-sample-index).

/// The binary sample index file.
pub const SAMPLE_INDEX_FILE: &str = "imgpack.index";

/// Magic bytes opening `imgpack.index`.
pub const INDEX_MAGIC: [u8; 8] = *b"IMGPKIDX";
/// Length of the `imgpack.index` header.
pub const INDEX_HEADER_LEN: usize = 24;
/// Length of one `imgpack.index` entry.
pub const INDEX_ENTRY_LEN: usize = 24;

/// The `imgpack.index` version this crate writes.
pub const INDEX_VERSION: u32 = 2;

/// The header of `imgpack.index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexHeader {
    /// 1 (no CRCs) or [`INDEX_VERSION`].
    pub version: u32,
    /// CRC-32 of `imgpack.json` (0 in version 1).
    pub meta_crc32: u32,
    /// The number of entries that follow.
    pub samples: u64,
}

impl IndexHeader {
    /// The header's 24 bytes.
    pub fn encode(&self) -> [u8; INDEX_HEADER_LEN] {
        let mut out = [0u8; INDEX_HEADER_LEN];
        out[..8].copy_from_slice(&INDEX_MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.meta_crc32.to_le_bytes());
        out[16..24].copy_from_slice(&self.samples.to_le_bytes());
        out
    }

    /// Decodes the header at the start of `bytes`, if it is a valid one.
    pub fn decode(bytes: &[u8]) -> Option<IndexHeader> {
        let header = bytes.get(..INDEX_HEADER_LEN)?;
        let version = u32::from_le_bytes(header[8..12].try_into().ok()?);
        if header[..8] != INDEX_MAGIC || !(1..=INDEX_VERSION).contains(&version) {
            return None;
        }
        Some(IndexHeader {
            version,
            meta_crc32: u32::from_le_bytes(header[12..16].try_into().ok()?),
            samples: u64::from_le_bytes(header[16..24].try_into().ok()?),
        })
    }
}

/// Where one sample lives: shard, offset of its first header, length of its members, and the
/// CRC-32 of those bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Byte offset of the sample's first tar header in its shard.
    pub offset: u64,
    /// Bytes from that header to the end of the sample's last member's data.
    pub len: u64,
    /// The shard number.
    pub shard: u32,
    /// CRC-32 of the `len` bytes at `offset` (0 in a version 1 index).
    pub crc32: u32,
}

impl IndexEntry {
    /// The entry's 24 bytes.
    pub fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut out = [0u8; INDEX_ENTRY_LEN];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..20].copy_from_slice(&self.shard.to_le_bytes());
        out[20..24].copy_from_slice(&self.crc32.to_le_bytes());
        out
    }

    /// Decodes 24 bytes.
    pub fn decode(bytes: &[u8; INDEX_ENTRY_LEN]) -> IndexEntry {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        IndexEntry { offset: u64_at(0), len: u64_at(8), shard: u32_at(16), crc32: u32_at(20) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entries_round_trip() {
        let e = IndexEntry { offset: 1 << 40, len: 123_456, shard: 7, crc32: 0xDEAD_BEEF };
        assert_eq!(IndexEntry::decode(&e.encode()), e);
        let h = IndexHeader { version: INDEX_VERSION, meta_crc32: 99, samples: 42 };
        assert_eq!(IndexHeader::decode(&h.encode()), Some(h));
        assert_eq!(IndexHeader::decode(b"IMGPKIDX"), None);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(IndexHeader::decode(&bad), None);
        let future = IndexHeader { version: INDEX_VERSION + 1, ..h };
        assert_eq!(IndexHeader::decode(&future.encode()), None);
    }

    #[test]
    fn bytes_sit_where_the_module_docs_say() {
        let header = IndexHeader { version: 2, meta_crc32: 0x1122_3344, samples: 0x0102 };
        let mut expected = b"IMGPKIDX".to_vec();
        expected.extend([2, 0, 0, 0, 0x44, 0x33, 0x22, 0x11, 0x02, 0x01, 0, 0, 0, 0, 0, 0]);
        assert_eq!(header.encode().to_vec(), expected);
        let entry = IndexEntry { offset: 0x0A0B, len: 0x0C, shard: 0x0D0E, crc32: 0xAABB_CCDD };
        let expected = [
            0x0B, 0x0A, 0, 0, 0, 0, 0, 0, 0x0C, 0, 0, 0, 0, 0, 0, 0, 0x0E, 0x0D, 0, 0, 0xDD, 0xCC, 0xBB, 0xAA,
        ];
        assert_eq!(entry.encode(), expected);
    }

    #[test]
    fn version_1_headers_still_decode_and_version_0_never_did() {
        let v1 = IndexHeader { version: 1, meta_crc32: 0, samples: 3 };
        assert_eq!(IndexHeader::decode(&v1.encode()), Some(v1));
        assert_eq!(IndexHeader::decode(&IndexHeader { version: 0, ..v1 }.encode()), None);
        // A header followed by entries decodes from the start of the file.
        let mut file = v1.encode().to_vec();
        file.extend(IndexEntry { offset: 0, len: 1024, shard: 0, crc32: 0 }.encode());
        assert_eq!(IndexHeader::decode(&file), Some(v1));
    }
}
