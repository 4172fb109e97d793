//! Sample keys: how a sample index becomes the name its fields are stored under.
//!
//! A sample's key is its index in zero-padded decimal, `key_width` digits wide (at least
//! [`MIN_KEY_WIDTH`]); the width is recorded in the metadata. Each field is stored under
//! `{key}.{ext}`, e.g. `00000042.jpg`, `00000042.cls`, `00000042.json`. Keys hold no dot, so
//! every WebDataset reader splits `{key}.{ext}` at the first dot into the same key and
//! extension, and zero padding makes byte order equal numeric order, which is what lets LMDB
//! bulk-load with `APPEND` and lets a cursor find a sample with one `set_range(b"00000042.")`.

/// The smallest key width: eight digits cover a hundred million samples.
pub const MIN_KEY_WIDTH: usize = 8;

/// The largest key width: twenty digits hold any `u64`, so no count `pack` can write needs more.
/// Readers refuse metadata with a wider `key_width` (see [`crate::Meta::key_width`]): the width
/// sizes the string [`format_key`] builds on every read, and a corrupt value such as 10^9 would
/// otherwise make each read allocate a gigabyte.
pub const MAX_KEY_WIDTH: usize = 20;

/// The LMDB key (and WebDataset member stem) holding the dataset metadata. It sorts after every
/// digit, so it is written last and an append-only load stays in order.
pub const META_KEY: &str = "__meta__";

/// The key width for a dataset of `count` samples: enough digits for `count - 1`, and at least
/// [`MIN_KEY_WIDTH`].
pub fn key_width(count: u64) -> usize {
    let digits = count.saturating_sub(1).checked_ilog10().map_or(1, |d| d as usize + 1);
    digits.max(MIN_KEY_WIDTH)
}

/// The key of sample `index`: `format_key(42, 8) == "00000042"`.
pub fn format_key(index: u64, width: usize) -> String {
    format!("{index:0width$}")
}

/// The storage name of one field of a sample: `field_name("00000042", "jpg") == "00000042.jpg"`.
pub fn field_name(key: &str, ext: &str) -> String {
    format!("{key}.{ext}")
}

/// Splits a storage name into key and extension at the first dot, as WebDataset does.
pub fn split_field_name(name: &str) -> Option<(&str, &str)> {
    name.split_once('.')
}

/// Whether `ext` is a field extension `pack` could have written: one or more dot-separated
/// parts (`jpg`, `npy.zst`), each non-empty and made of ASCII letters, digits, `_` and `-`.
///
/// Readers check every extension they read back, because a sample's fields are often written
/// out again under `{key}.{ext}` or `{stem}.{ext}` (as tar members, LMDB keys or files): a damaged
/// or hostile member named `00000042./../../x` would otherwise hand on the extension
/// `/../../x`, a path that climbs out of wherever it is written. It looks at a few bytes and
/// allocates nothing, so it costs nothing next to the read itself.
pub fn is_valid_extension(ext: &str) -> bool {
    !ext.is_empty()
        && ext.split('.').all(|part| {
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn width_grows_past_eight_digits() {
        assert_eq!(key_width(0), 8);
        assert_eq!(key_width(1), 8);
        assert_eq!(key_width(100_000_000), 8);
        assert_eq!(key_width(100_000_001), 9);
        assert_eq!(key_width(u64::MAX), 20);
    }

    #[test]
    fn keys_sort_numerically_and_before_meta() {
        let a = field_name(&format_key(9, 8), "jpg");
        let b = field_name(&format_key(10, 8), "cls");
        assert_eq!(a, "00000009.jpg");
        assert!(a < b);
        assert!(b.as_str() < META_KEY);
        assert_eq!(split_field_name("00000042.npy.zst"), Some(("00000042", "npy.zst")));
    }

    #[test]
    fn extensions_that_could_act_as_paths_are_invalid() {
        for ext in ["jpg", "npy.zst", "cls", "json", "tar_gz", "x-y", "JPG"] {
            assert!(is_valid_extension(ext), "{ext}");
        }
        for ext in [
            "",
            ".",
            "..",
            "/etc/passwd",
            "../x",
            "./x",
            "a/b",
            "a\\b",
            "jpg.",
            ".jpg",
            "a..b",
            "a\0",
            "é",
            "a b",
        ] {
            assert!(!is_valid_extension(ext), "{ext:?}");
        }
        assert_eq!(format_key(7, MAX_KEY_WIDTH).len(), MAX_KEY_WIDTH);
        assert_eq!(key_width(u64::MAX), MAX_KEY_WIDTH, "no count needs a wider key");
    }
}
