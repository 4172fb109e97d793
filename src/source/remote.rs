//! An ImageFolder tree under an object store prefix: `s3://bucket/train/<class>/<image>`.
//!
//! A store has no directories, only keys, so the tree is read off one listing of the prefix
//! (one request per 1,000 objects, every size included): a class is a first-level "folder" (a
//! key's first `/`-separated part), a sample is an accepted key below it. The order is the one
//! [`super::imagefolder`] gives a local tree, torchvision's: classes sorted, then within a class
//! the "directories" sorted by their path string (`sub.x` before `sub/deep`), each one's files
//! by name. Keys are UTF-8, so Python's order is byte order. A key ending in `/` is a folder
//! marker (what consoles create for an empty folder, where the store lists it): it makes a
//! class exist, and is no sample.
//!
//! Each sample is one GET, made by the pipeline's readers (`--io-threads`, 32 by default): the
//! workers wait for every GET, so the readahead soon has all of them in flight, which is what
//! an object store needs to be read fast.

use std::collections::BTreeMap;
use std::path::PathBuf;

use imgpack_reader::store::Store;

use super::{Listing, LoadError, Samples, Source, SourceSample, Stamp};
use crate::progress::Progress;
use crate::{Error, Result};

/// A class's "directories" (`""` for the class itself, or `"/sub/deep"`), sorted by that path
/// string, each with its accepted files (name, size).
type Dirs<'a> = BTreeMap<&'a str, Vec<(&'a str, u64)>>;

/// An ImageFolder tree under a store prefix.
#[derive(Debug)]
pub struct RemoteImageFolder {
    store: Store,
    /// Every object under the prefix (name relative to it, size), as listed once.
    listed: Vec<(String, u64)>,
    /// Accepted extensions, lower case, with their dot.
    extensions: Vec<String>,
}

impl RemoteImageFolder {
    /// The tree that `listed` (every object under `store`'s prefix) holds, keeping files whose
    /// extension (lower case, no dot) is in `extensions`.
    pub fn new(
        store: Store,
        listed: Vec<(String, u64)>,
        extensions: &[impl AsRef<str>],
    ) -> RemoteImageFolder {
        let extensions = extensions.iter().map(|e| format!(".{}", e.as_ref().to_lowercase())).collect();
        RemoteImageFolder { store, listed, extensions }
    }

    fn accepts(&self, name: &str) -> bool {
        let lower = name.to_lowercase();
        self.extensions.iter().any(|e| lower.ends_with(e.as_str()))
    }
}

impl Source for RemoteImageFolder {
    fn list(&self, progress: &dyn Progress) -> Result<Listing> {
        let url = self.store.url();
        let mut tree: BTreeMap<&str, Dirs<'_>> = BTreeMap::new();
        let mut loose = 0u64;
        for (name, size) in &self.listed {
            let Some((class, rest)) = name.split_once('/') else {
                loose += u64::from(self.accepts(name));
                continue;
            };
            let dirs = tree.entry(class).or_default();
            if rest.is_empty() || rest.ends_with('/') {
                continue; // a folder marker
            }
            let (dir, file) = match rest.rsplit_once('/') {
                Some((dir, file)) => (&name[class.len()..class.len() + 1 + dir.len()], file),
                None => ("", rest),
            };
            if self.accepts(file) {
                dirs.entry(dir).or_default().push((file, *size));
            }
        }
        let files = if loose == 1 { "image file" } else { "image files" };
        if tree.is_empty() {
            let reason = if loose > 0 {
                format!("holds {loose} {files} but no class folders, so it has no samples (an ImageFolder tree is root/<class>/<image>); if it is one class folder, pass the prefix above it")
            } else if self.listed.is_empty() {
                "nothing is stored under this prefix; check the bucket and the prefix".into()
            } else {
                "has no class folders; an ImageFolder tree is root/<class>/<image> — pass the prefix that holds the class folders".into()
            };
            return Err(Error::BadSource { path: PathBuf::from(url.to_string()), reason });
        }
        let mut listing =
            Listing { classes: tree.keys().map(|c| c.to_string()).collect(), ..Listing::default() };
        if loose > 0 {
            listing.warnings.push(format!(
                "{url}: {loose} {files} directly in it are not samples (only images inside class folders are, as in torchvision); if it is a class folder, pass the prefix above it"
            ));
        }
        let count = tree.values().flat_map(|dirs| dirs.values()).map(Vec::len).sum();
        let mut samples = Samples::with_capacity(count, 0);
        let mut rel_path = String::new();
        for (class_index, (class, dirs)) in tree.iter_mut().enumerate() {
            let before = samples.len();
            for (dir, files) in dirs.iter_mut() {
                files.sort_unstable();
                for (file, size) in files.iter() {
                    rel_path.clear();
                    rel_path.push_str(class);
                    rel_path.push_str(dir);
                    rel_path.push('/');
                    rel_path.push_str(file);
                    samples.push(rel_path.as_bytes(), class_index as u32, *size);
                }
            }
            if samples.len() == before {
                listing.empty_classes.push(class.to_string());
            }
        }
        progress.advance(samples.len() as u64);
        listing.samples = samples;
        Ok(listing)
    }

    fn load(&self, sample: &SourceSample) -> Result<Vec<u8>, LoadError> {
        let name = std::str::from_utf8(sample.rel_path).map_err(std::io::Error::other)?;
        self.store.get(name).map_err(LoadError::from_store)
    }

    fn name(&self, sample: &SourceSample) -> PathBuf {
        PathBuf::from(self.store.url().object(&String::from_utf8_lossy(sample.rel_path)))
    }

    /// The size the listing gave; a store's modification time is left out (an upload of the
    /// same bytes is the same sample).
    fn stamp(&self, sample: &SourceSample) -> Option<Stamp> {
        Some(Stamp { size: sample.size, mtime_ns: 0 })
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::source::imagefolder::ImageFolder;
    use crate::store::StoreUrl;

    /// A store client that is never asked anything: listing reads only what it is given.
    fn store() -> Store {
        Store::open(&StoreUrl::parse("s3://bucket/train/").unwrap(), Some("http://127.0.0.1:9")).unwrap()
    }

    fn paths(listing: &Listing) -> Vec<(String, u32)> {
        listing.samples.iter().map(|s| (String::from_utf8_lossy(s.rel_path).into_owned(), s.class)).collect()
    }

    #[test]
    fn a_tree_in_a_store_is_listed_in_the_local_trees_order() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            "b/x.jpg",
            "b/sub.x/y.jpg",
            "b/sub/deep/z.JPG",
            "b/sub/a.png",
            "b/.hidden.jpg",
            "b/notes.txt",
            "a/2.jpg",
            "a/10.jpg",
            "a/Z.jpg",
            "c d/é.jpg",
            "c d/e.jpg",
        ];
        let mut listed = Vec::new();
        for (i, name) in files.iter().enumerate() {
            let path = dir.path().join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, vec![0u8; i]).unwrap();
            listed.push((name.to_string(), i as u64));
        }
        fs::create_dir(dir.path().join("empty")).unwrap();
        // A folder marker makes the empty class exist, as the directory does.
        listed.push(("empty/".to_string(), 0));
        listed.sort();
        let extensions = ["jpg", "png"];
        let local = ImageFolder::new(dir.path(), &extensions).list(&crate::progress::Silent).unwrap();
        let remote =
            RemoteImageFolder::new(store(), listed, &extensions).list(&crate::progress::Silent).unwrap();
        assert_eq!(remote.classes, local.classes);
        assert_eq!(paths(&remote), paths(&local));
        assert_eq!(remote.empty_classes, ["empty"]);
        assert_eq!(remote.empty_classes, local.empty_classes);
        // The sizes come from the listing.
        let sizes: Vec<u64> = remote.samples.iter().map(|s| s.size).collect();
        let want: Vec<u64> =
            paths(&local).iter().map(|(p, _)| files.iter().position(|f| f == p).unwrap() as u64).collect();
        assert_eq!(sizes, want);
    }

    #[test]
    fn a_prefix_without_class_folders_is_refused_saying_why() {
        let list = |listed: Vec<(&str, u64)>| {
            let listed = listed.into_iter().map(|(n, s)| (n.to_string(), s)).collect();
            RemoteImageFolder::new(store(), listed, &["jpg"]).list(&crate::progress::Silent)
        };
        let err = list(vec![("a.jpg", 1), ("b.jpg", 1)]).unwrap_err().to_string();
        assert!(err.contains("holds 2 image files but no class folders"), "{err}");
        let err = list(vec![]).unwrap_err().to_string();
        assert!(err.starts_with("s3://bucket/train/") && err.contains("nothing is stored"), "{err}");
        let listing = list(vec![("a.jpg", 1), ("cat/x.jpg", 1)]).unwrap();
        assert!(listing.warnings[0].contains("1 image file directly in it"), "{:?}", listing.warnings);
    }
}
