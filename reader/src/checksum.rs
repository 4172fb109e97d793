//! Sample checksums.
//!
//! Every sample's stored bytes carry a CRC-32 — the IEEE polynomial that zlib, gzip and PNG use —
//! so a Python user checks one with the standard library's `zlib.crc32`, no package needed, and
//! it runs at memory speed (crc32fast uses the CPU's carry-less multiply). It is there to catch
//! damage (a flipped bit, a torn write, a truncated copy), not tampering: for that, WebDataset
//! shards also carry an MD5 each in the metadata.
//!
//! What is summed, per format:
//!
//! - **WebDataset**: the sample's whole byte range in its shard — every member's tar header,
//!   data and padding — as located by its `imgpack.index` entry, which holds the CRC.
//! - **LMDB**: the values of the sample's records concatenated in key order, which is the order
//!   of their extensions (`cls`, `jpg`, `json`; or `cls`, `json`, `png`), kept in the
//!   [`TABLE_KEY`] record: a [`TABLE_HEADER_LEN`]-byte header
//!   (the magic `IMGPKSUM`, version `u32` LE 1, the CRC-32 of the `__meta__` value as `u32` LE,
//!   the sample count as `u64` LE) and then one `u32` LE per sample in key order.
//!
//! The metadata itself is covered too: by the header of the LMDB table, and for WebDataset by
//! the header of `imgpack.index`. Datasets whose metadata has no `checksum` field (written before
//! format version 2) carry none.

/// The checksum algorithm named in [`crate::Meta::checksum`].
pub const ALGORITHM: &str = "crc32";

/// The LMDB record holding the checksum table. It sorts after every sample key and before
/// `__meta__`, so a writer appends it in key order.
pub const TABLE_KEY: &str = "__checksums__";
/// Magic bytes opening the LMDB checksum table.
pub const TABLE_MAGIC: [u8; 8] = *b"IMGPKSUM";
/// Length of the checksum table header.
pub const TABLE_HEADER_LEN: usize = 24;

/// The CRC-32 of `bytes` (equal to Python's `zlib.crc32(bytes)`).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The CRC-32 of the concatenation of `parts`, without concatenating them.
pub fn crc32_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

/// The LMDB checksum table: the metadata's CRC and one CRC per sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// CRC-32 of the `__meta__` record's bytes.
    pub meta_crc32: u32,
    /// CRC-32 of each sample, in key order.
    pub samples: Vec<u32>,
}

impl Table {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(TABLE_HEADER_LEN + 4 * self.samples.len());
        out.extend_from_slice(&TABLE_MAGIC);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&self.meta_crc32.to_le_bytes());
        out.extend_from_slice(&(self.samples.len() as u64).to_le_bytes());
        for crc in &self.samples {
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out
    }

    /// Decodes the record, or says what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Table, String> {
        let header = bytes.get(..TABLE_HEADER_LEN).ok_or("checksum table is shorter than its header")?;
        if header[..8] != TABLE_MAGIC || header[8..12] != 1u32.to_le_bytes() {
            return Err("checksum table header is not IMGPKSUM version 1".into());
        }
        let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let count = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
        let body = &bytes[TABLE_HEADER_LEN..];
        if body.len() as u64 != count.saturating_mul(4) {
            return Err(format!(
                "checksum table says {count} samples but holds {} bytes of sums",
                body.len()
            ));
        }
        Ok(Table { meta_crc32: u32_at(&header[12..16]), samples: body.chunks_exact(4).map(u32_at).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        // zlib.crc32(b"123456789") == 0xCBF43926, the standard check value.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_parts([&b"1234"[..], b"56789"]), 0xCBF4_3926);
    }

    #[test]
    fn tables_round_trip_and_reject_damage() {
        let table = Table { meta_crc32: 7, samples: vec![1, 2, 0xFFFF_FFFF] };
        let bytes = table.encode();
        assert_eq!(bytes.len(), TABLE_HEADER_LEN + 12);
        assert_eq!(Table::decode(&bytes).unwrap(), table);
        assert!(Table::decode(&bytes[..bytes.len() - 1]).unwrap_err().contains("says 3 samples"));
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(Table::decode(&bad).is_err());
        assert!(Table::decode(&bytes[..10]).is_err());
        // A count whose byte length overflows is compared, not multiplied out or reserved.
        for count in [u64::MAX, u64::MAX / 4 + 1, 1 << 62] {
            let mut huge = bytes.clone();
            huge[16..24].copy_from_slice(&count.to_le_bytes());
            assert!(Table::decode(&huge).unwrap_err().contains(&format!("says {count} samples")));
        }
    }
}
