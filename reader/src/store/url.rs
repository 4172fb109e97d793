//! `s3://bucket/prefix/` locations: what a command line names in the store.
//!
//! A dataset in the store is a *prefix*, the way a dataset on disk is a directory: its objects
//! are `prefix/shard-000000.tar`, `prefix/imgpack.json`, ... A trailing slash is optional
//! (`s3://b/train` and `s3://b/train/` are one dataset), and an empty prefix is the bucket's
//! root. Keys are checked here, once, so that no request is ever sent for a key the store
//! would read differently from the directory layout FORMAT.md describes.

use std::fmt;

use crate::{Error, Result};

/// The scheme of the store locations `pack` understands.
pub const SCHEME: &str = "s3://";

/// A prefix in a bucket: where one dataset lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// The bucket name.
    pub bucket: String,
    /// The key prefix without leading or trailing slash; empty for the bucket's root.
    pub prefix: String,
}

/// Whether `text` names a store location rather than a local path.
pub fn is_store_url(text: &str) -> bool {
    text.get(..SCHEME.len()).is_some_and(|s| s.eq_ignore_ascii_case(SCHEME))
}

impl StoreUrl {
    /// The store location `path` is written as, or `None` for a local path; an `s3://` path
    /// that is not a valid location is an error ([`StoreUrl::parse`]).
    pub fn of_path(path: &std::path::Path) -> Result<Option<StoreUrl>> {
        match path.to_str().filter(|text| is_store_url(text)) {
            Some(text) => StoreUrl::parse(text).map(Some),
            None => Ok(None),
        }
    }

    /// Parses `s3://bucket/prefix/`, refusing what S3 would refuse or read differently: an
    /// invalid bucket name, and empty, `.` or `..` segments in the prefix.
    pub fn parse(text: &str) -> Result<StoreUrl> {
        let bad = |reason: String| Error::BadLocation { location: text.to_string(), reason };
        if !is_store_url(text) {
            return Err(bad(format!("not a store location; write it as {SCHEME}BUCKET/PREFIX/")));
        }
        let rest = &text[SCHEME.len()..];
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket(bucket).map_err(|why| bad(format!("bucket name {bucket:?} {why}")))?;
        let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
        if !prefix.is_empty() {
            for segment in prefix.split('/') {
                if segment.is_empty() || segment == "." || segment == ".." {
                    return Err(bad(format!(
                        "the prefix {prefix:?} has an empty, `.` or `..` part; write it as {SCHEME}{bucket}/a/b/"
                    )));
                }
                if segment.chars().any(char::is_control) {
                    return Err(bad(format!("the prefix {prefix:?} holds a control character")));
                }
            }
        }
        Ok(StoreUrl { bucket: bucket.to_string(), prefix: prefix.to_string() })
    }

    /// The key of the object `name` in this prefix.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// `s3://bucket/key`, for messages.
    pub fn object(&self, name: &str) -> String {
        format!("{SCHEME}{}/{}", self.bucket, self.key(name))
    }
}

impl fmt::Display for StoreUrl {
    /// `s3://bucket/prefix/`, always with the trailing slash: it names a prefix, not an object.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "{SCHEME}{}/", self.bucket)
        } else {
            write!(f, "{SCHEME}{}/{}/", self.bucket, self.prefix)
        }
    }
}

/// S3's bucket naming rules (3-63 characters of lower-case letters, digits, `.` and `-`,
/// starting and ending with a letter or digit): why `name` breaks them, if it does.
fn check_bucket(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty; name the bucket: s3://BUCKET/PREFIX/");
    }
    if !(3..=63).contains(&name.len()) {
        return Err("must be 3 to 63 characters long");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-') {
        return Err("may hold only lower-case letters, digits, '.' and '-'");
    }
    let edge = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !edge(name.as_bytes()[0]) || !edge(name.as_bytes()[name.len() - 1]) {
        return Err("must start and end with a letter or digit");
    }
    if name.contains("..") {
        return Err("may not hold two dots in a row");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_with_or_without_its_slash_is_one_dataset() {
        let a = StoreUrl::parse("s3://my-bucket/datasets/train/").unwrap();
        let b = StoreUrl::parse("s3://my-bucket/datasets/train").unwrap();
        assert_eq!(a, b);
        assert_eq!((a.bucket.as_str(), a.prefix.as_str()), ("my-bucket", "datasets/train"));
        assert_eq!(a.key("imgpack.json"), "datasets/train/imgpack.json");
        assert_eq!(a.object("imgpack.json"), "s3://my-bucket/datasets/train/imgpack.json");
        assert_eq!(a.to_string(), "s3://my-bucket/datasets/train/");
    }

    #[test]
    fn the_bucket_root_is_an_empty_prefix() {
        for text in ["s3://data.lake", "s3://data.lake/"] {
            let url = StoreUrl::parse(text).unwrap();
            assert_eq!(url.prefix, "");
            assert_eq!(url.key("imgpack.json"), "imgpack.json");
            assert_eq!(url.to_string(), "s3://data.lake/");
        }
    }

    #[test]
    fn the_scheme_is_case_insensitive_and_local_paths_are_not_urls() {
        assert!(is_store_url("S3://bucket/x"));
        assert!(!is_store_url("s3:/bucket/x"));
        assert!(!is_store_url("shards/"));
        assert!(!is_store_url("./s3://x"));
        assert!(StoreUrl::parse("shards/").is_err());
    }

    #[test]
    fn invalid_bucket_names_are_refused_saying_why() {
        for (text, why) in [
            ("s3:///prefix", "is empty"),
            ("s3://ab/x", "3 to 63"),
            ("s3://My_Bucket/x", "lower-case"),
            ("s3://-bucket/x", "start and end"),
            ("s3://bucket./x", "start and end"),
            ("s3://a..b/x", "two dots"),
        ] {
            let err = StoreUrl::parse(text).unwrap_err().to_string();
            assert!(err.starts_with(text) && err.contains(why), "{text}: {err}");
        }
        assert!(StoreUrl::parse(&format!("s3://{}/x", "a".repeat(63))).is_ok());
        assert!(StoreUrl::parse(&format!("s3://{}/x", "a".repeat(64))).is_err());
    }

    #[test]
    fn empty_and_dot_segments_are_refused() {
        for text in ["s3://bucket/a//b/", "s3://bucket/./a", "s3://bucket/a/../b", "s3://bucket//a"] {
            let err = StoreUrl::parse(text).unwrap_err().to_string();
            assert!(err.contains("empty, `.` or `..`"), "{text}: {err}");
        }
    }
}
