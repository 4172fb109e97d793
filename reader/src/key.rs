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
}
