//! Shard names: what `pack` calls a shard, and which names listed in a dataset's metadata a
//! reader agrees to open.

/// The file name of shard `n`: `shard_file_name("shard", 3) == "shard-000003.tar"`.
pub fn shard_file_name(prefix: &str, n: usize) -> String {
    format!("{prefix}-{n:06}.tar")
}

/// Whether `name`, as listed in the metadata's shard list, names a file inside the dataset
/// directory: a plain file name — not empty, no `/` or `\\` (so not absolute and not in a
/// subdirectory), no NUL, and not starting with `.` (so neither `.` nor `..`, nor a hidden file
/// `pack` never writes) — or, in a dataset merged from parts ([`crate::part`]), such a name
/// inside exactly one part directory (`part-0002-of-0004/shard-p0002-000000.tar`). Readers open only
/// shards whose names pass, so a damaged or hostile `imgpack.json` cannot make them read
/// outside the dataset. A shard that is a symbolic link is followed, as the dataset directory
/// itself would be: links are the file system owner's choice, not bytes read from the dataset.
pub fn is_shard_name(name: &str) -> bool {
    let plain = |name: &str| !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0']);
    match name.split_once('/') {
        None => plain(name),
        Some((dir, file)) => crate::part::parse_dir_name(dir).is_some() && plain(file),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_numbers_take_six_digits_and_more_when_needed() {
        assert_eq!(shard_file_name("shard", 3), "shard-000003.tar");
        assert_eq!(shard_file_name("shard-p0002", 1_234_567), "shard-p0002-1234567.tar");
    }

    #[test]
    fn shard_names_stay_inside_the_dataset_and_one_part_directory() {
        for good in ["shard-000000.tar", "x", "part-0002-of-0004/shard-p0002-000000.tar"] {
            assert!(is_shard_name(good), "{good}");
        }
        for bad in [
            "",
            ".hidden.tar",
            "..",
            "../x.tar",
            "/etc/passwd",
            "a/b.tar",
            "part-0002-of-0004/../x.tar",
            "part-0002-of-0004/a/b.tar",
            "part-0002-of-0004/",
            "part-4-of-4/x.tar",
            "part-0002-of-0004\\x.tar",
            "x\0.tar",
        ] {
            assert!(!is_shard_name(bad), "{bad:?}");
        }
    }
}
