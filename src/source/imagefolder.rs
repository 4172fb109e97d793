//! The ImageFolder source: `root/<class>/<image>`, ordered exactly as torchvision orders it.
//!
//! With no shuffle, sample `i` must be the file and class index of
//! `torchvision.datasets.ImageFolder(root, allow_empty=True).samples[i]`, so training code can
//! switch from the folder to the packed dataset without a label changing. torchvision:
//!
//! * takes as classes the sorted names of the root's entries that are directories (symlinks
//!   followed, hidden ones included);
//! * walks each class with `sorted(os.walk(class_dir, followlinks=True))`, which orders the
//!   *directories by their full path string* (so `sub.x` comes before `sub/deep`, since `.`
//!   sorts before `/`), then lists each directory's non-directory entries by sorted name;
//! * keeps a file when its lower-cased name ends with an accepted extension (hidden files too).
//!
//! Python sorts `str` by code point; names that are not UTF-8 reach Python with each bad byte
//! mapped to a lone surrogate (`surrogateescape`). [`python_sort_key`] reproduces that.
//!
//! Unlike `os.walk`, a symlink loop is detected (by device and inode of the directories above)
//! and reported instead of being followed until the path is too long, and an unreadable
//! directory is reported instead of silently ignored.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::{Listing, Samples, Source, SourceSample};
use crate::progress::Progress;
use crate::{Error, Result};

/// An ImageFolder tree.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    root: PathBuf,
    extensions: Vec<String>,
}

/// Refuses a source root that is not a directory, saying whether it is missing (a typo, an
/// unmounted volume) or something else (a file, a dataset passed where a tree was meant).
pub fn check_root(root: &Path) -> Result<()> {
    let reason = match fs::metadata(root) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "is not a directory; pass the root of an ImageFolder tree (root/<class>/<image>)",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "does not exist; check the path, or pass the root of an ImageFolder tree (root/<class>/<image>)"
        }
        Err(source) => return Err(Error::Io { path: root.to_path_buf(), source }),
    };
    Err(Error::BadSource { path: root.to_path_buf(), reason: reason.into() })
}

impl ImageFolder {
    /// The tree at `root`, keeping files whose extension (lower case, no dot) is in `extensions`.
    pub fn new(root: impl Into<PathBuf>, extensions: &[impl AsRef<str>]) -> ImageFolder {
        let extensions = extensions.iter().map(|e| format!(".{}", e.as_ref().to_lowercase())).collect();
        ImageFolder { root: root.into(), extensions }
    }

    fn accepts(&self, name: &OsStr) -> bool {
        let bytes = name.as_bytes();
        if bytes.is_ascii() {
            // Fast path: for ASCII names, ASCII lower-casing is Python's `str.lower()`.
            return self.extensions.iter().any(|e| {
                bytes.len() >= e.len() && bytes[bytes.len() - e.len()..].eq_ignore_ascii_case(e.as_bytes())
            });
        }
        let lower = name.to_string_lossy().to_lowercase();
        self.extensions.iter().any(|e| lower.ends_with(e.as_str()))
    }

    /// Walks one class directory: its files in torchvision order, plus warnings.
    ///
    /// Only symlinks are `stat`ed: `read_dir` already says what every other entry is, and a
    /// file's size is learnt when it is read. On network file systems that is most of the
    /// listing time saved.
    fn walk_class(&self, class_dir: &Path, class: u32, progress: &dyn Progress) -> (Samples, Vec<String>) {
        let mut dirs: Vec<Dir> = Vec::new();
        let mut warnings = Vec::new();
        // Each directory carries the real (canonical) paths of itself and every directory above
        // it: a symlink whose target is one of them, or above one of them, is a loop.
        let real = fs::canonicalize(class_dir).unwrap_or_else(|_| class_dir.to_path_buf());
        let mut stack = vec![(class_dir.to_path_buf(), Vec::<u8>::new(), vec![real])];
        while let Some((dir, rel, chain)) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) => {
                    warnings.push(format!(
                        "{}: cannot list directory ({e}); its files are not packed — fix its permissions to include them",
                        dir.display()
                    ));
                    continue;
                }
            };
            let mut files = Vec::new();
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Ok(kind) = entry.file_type() else { continue };
                // os.walk follows symlinks (`is_dir()`): a link to a directory is walked, and a
                // dangling link is a non-directory.
                // One stat tells a link to a file from a link to a directory; only the latter
                // needs its real path (for the loop check), which costs a `readlink` per path
                // component: ten system calls a file in a subset made of links to files.
                let target = if kind.is_symlink() {
                    match fs::metadata(entry.path()) {
                        Ok(meta) if meta.is_dir() => {
                            fs::canonicalize(entry.path()).ok().filter(|t| t.is_dir())
                        }
                        _ => None,
                    }
                } else {
                    None
                };
                if kind.is_dir() || target.is_some() {
                    let here = chain.last().expect("never empty");
                    let sub_real = target.clone().unwrap_or_else(|| here.join(&name));
                    if target.is_some() && chain.iter().any(|above| above.starts_with(&sub_real)) {
                        warnings.push(format!(
                            "{}: symlink loop (points back to a directory above it); not followed — remove the link or point it elsewhere",
                            entry.path().display()
                        ));
                        continue;
                    }
                    let mut sub_rel = rel.clone();
                    sub_rel.push(b'/');
                    sub_rel.extend_from_slice(name.as_bytes());
                    let mut sub_chain = chain.clone();
                    sub_chain.push(sub_real);
                    stack.push((entry.path(), sub_rel, sub_chain));
                } else if self.accepts(&name) {
                    files.push(name);
                }
            }
            files.sort_by(|a, b| python_cmp(a, b));
            progress.advance(files.len() as u64);
            dirs.push(Dir { rel, files });
        }
        dirs.sort_by(|a, b| python_cmp(OsStr::from_bytes(&a.rel), OsStr::from_bytes(&b.rel)));
        let class_name = class_dir.file_name().unwrap_or_default().as_bytes();
        let count = dirs.iter().map(|d| d.files.len()).sum();
        let path_bytes = dirs
            .iter()
            .map(|d| d.files.iter().map(|f| class_name.len() + d.rel.len() + 1 + f.len()).sum::<usize>())
            .sum();
        let mut samples = Samples::with_capacity(count, path_bytes);
        let mut rel_path = Vec::new();
        for d in dirs {
            for name in d.files {
                rel_path.clear();
                rel_path.extend_from_slice(class_name);
                rel_path.extend_from_slice(&d.rel);
                rel_path.push(b'/');
                rel_path.extend_from_slice(name.as_bytes());
                samples.push(&rel_path, class, 0);
            }
        }
        (samples, warnings)
    }
}

/// A directory met during the walk: its path relative to the class directory (`""` or
/// `"/sub/deep"`), and the names of its accepted files.
struct Dir {
    rel: Vec<u8>,
    files: Vec<std::ffi::OsString>,
}

impl Source for ImageFolder {
    /// Lists the tree; `progress` counts the files found as directories are read (its length
    /// stays unknown, 0, until the walk is done).
    fn list(&self, progress: &dyn Progress) -> Result<Listing> {
        let root = &self.root;
        let entries = fs::read_dir(root).map_err(Error::io(root))?;
        let mut classes: Vec<(Vec<u32>, std::ffi::OsString)> = Vec::new();
        // Images directly in the root are no samples (torchvision ignores them too); they
        // are counted, because they usually mean a class folder was passed as the root.
        let mut loose = 0u64;
        for entry in entries {
            let entry = entry.map_err(Error::io(root))?;
            match fs::metadata(entry.path()) {
                Ok(meta) if meta.is_dir() => {
                    classes.push((python_sort_key(&entry.file_name()), entry.file_name()))
                }
                Ok(meta) if meta.is_file() && self.accepts(&entry.file_name()) => loose += 1,
                _ => {}
            }
        }
        let parent = root.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".."));
        let files = if loose == 1 { "image file" } else { "image files" };
        if classes.is_empty() {
            let reason = if loose > 0 {
                format!(
                    "holds {loose} {files} but no class folders, so it has no samples (an ImageFolder tree is root/<class>/<image>); if it is one class folder, pass the directory above it ({})",
                    parent.display()
                )
            } else {
                "has no class folders; an ImageFolder tree is root/<class>/<image> — pass the folder that holds the class folders".into()
            };
            return Err(Error::BadSource { path: root.clone(), reason });
        }
        let mut warnings = Vec::new();
        if loose > 0 {
            warnings.push(format!(
                "{}: {loose} {files} directly in it are not samples (only images inside class folders are, as in torchvision); if it is a class folder, pass the directory above it ({})",
                root.display(),
                parent.display()
            ));
        }
        classes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut listing = Listing {
            classes: classes.iter().map(|(_, n)| n.to_string_lossy().into_owned()).collect(),
            warnings,
            ..Listing::default()
        };
        // Classes are walked in parallel a few at a time, and each window's samples are
        // appended in class order and dropped before the next is walked: walking them all first
        // held every sample twice (each class's own, then the listing's copy) at the peak. The
        // listing's buffers grow in place (large allocations are remapped, not copied).
        let window = rayon::current_num_threads().max(1) * 4;
        for (w, names) in classes.chunks(window).enumerate() {
            let walked: Vec<_> = names
                .par_iter()
                .enumerate()
                .map(|(i, (_, name))| self.walk_class(&root.join(name), (w * window + i) as u32, progress))
                .collect();
            for (i, (samples, warnings)) in walked.into_iter().enumerate() {
                if samples.is_empty() {
                    listing.empty_classes.push(listing.classes[w * window + i].clone());
                }
                listing.samples.extend(&samples);
                listing.warnings.extend(warnings);
            }
        }
        Ok(listing)
    }

    fn load(&self, sample: &SourceSample) -> Result<Vec<u8>, super::LoadError> {
        super::load_file(&self.file(sample))
    }

    fn name(&self, sample: &SourceSample) -> PathBuf {
        self.root.join(super::os_path(sample.rel_path))
    }
}

/// Compares two names as Python's `sorted()` does. UTF-8 byte order is code point order, so
/// the key is only built when a name is not UTF-8.
pub fn python_cmp(a: &OsStr, b: &OsStr) -> std::cmp::Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if std::str::from_utf8(a).is_ok() && std::str::from_utf8(b).is_ok() {
        a.cmp(b)
    } else {
        python_sort_key(OsStr::from_bytes(a)).cmp(&python_sort_key(OsStr::from_bytes(b)))
    }
}

/// The order Python's `sorted()` gives a file name: by code point, decoding UTF-8 with
/// `surrogateescape` (each undecodable byte `b` becomes U+DC00 + b), as `os.fsdecode` does.
pub fn python_sort_key(name: &OsStr) -> Vec<u32> {
    let mut key = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                key.extend(s.chars().map(u32::from));
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                key.extend(std::str::from_utf8(good).expect("valid prefix").chars().map(u32::from));
                let n = e.error_len().unwrap_or(bad.len());
                key.extend(bad[..n].iter().map(|&b| 0xDC00 + u32::from(b)));
                rest = &bad[n..];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Silent;
    use std::os::unix::fs::symlink;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"x").unwrap();
    }

    fn rels(listing: &Listing) -> Vec<String> {
        listing.samples.iter().map(|s| String::from_utf8_lossy(s.rel_path).into_owned()).collect()
    }

    fn exts() -> [&'static str; 9] {
        crate::pack::config::DEFAULT_EXTENSIONS
    }

    #[test]
    fn orders_directories_by_full_path_like_sorted_os_walk() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for p in
            ["b/z.jpg", "b/sub/deep/a.jpg", "b/sub.x/a.jpg", "b/sub/a.JPG", "a/B.png", "a/a.png", "a/.h.jpg"]
        {
            touch(&r.join(p));
        }
        touch(&r.join("a/notes.txt"));
        touch(&r.join("root.jpg"));
        fs::create_dir_all(r.join("c_empty")).unwrap();
        let listing = ImageFolder::new(r, &exts()).list(&Silent).unwrap();
        assert_eq!(listing.classes, ["a", "b", "c_empty"]);
        assert_eq!(
            rels(&listing),
            ["a/.h.jpg", "a/B.png", "a/a.png", "b/z.jpg", "b/sub/a.JPG", "b/sub.x/a.jpg", "b/sub/deep/a.jpg"]
                .map(String::from)
        );
        assert_eq!(listing.samples.get(3).class, 1);
        assert_eq!(listing.empty_classes, ["c_empty"]);
    }

    #[test]
    fn symlink_loops_are_reported_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        touch(&r.join("a/x/1.jpg"));
        symlink(r.join("a"), r.join("a/x/loop")).unwrap();
        let listing = ImageFolder::new(r, &exts()).list(&Silent).unwrap();
        assert_eq!(rels(&listing), ["a/x/1.jpg"]);
        assert_eq!(listing.warnings.len(), 1);
        assert!(listing.warnings[0].contains("symlink loop"), "{:?}", listing.warnings);
    }

    #[test]
    fn a_cycle_through_two_links_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        touch(&r.join("a/p/1.jpg"));
        touch(&r.join("a/q/2.jpg"));
        symlink(r.join("a/q"), r.join("a/p/to_q")).unwrap();
        symlink(r.join("a/p"), r.join("a/q/to_p")).unwrap();
        let listing = ImageFolder::new(r, &exts()).list(&Silent).unwrap();
        // As os.walk would list them until it meets the loop: p, p/to_q, q, q/to_p.
        assert_eq!(rels(&listing), ["a/p/1.jpg", "a/p/to_q/2.jpg", "a/q/2.jpg", "a/q/to_p/1.jpg"]);
        assert_eq!(listing.warnings.len(), 2, "{:?}", listing.warnings);
    }

    #[test]
    fn python_key_orders_surrogates_after_bmp_ascii() {
        let bad = OsStr::from_bytes(b"a\xffb");
        assert_eq!(python_sort_key(bad), vec![97, 0xDCFF, 98]);
        assert!(python_sort_key(OsStr::new("Z")) < python_sort_key(OsStr::new("a")));
        assert!(python_sort_key(OsStr::new("é")) < python_sort_key(OsStr::new("日")));
    }

    #[test]
    fn no_class_folders_is_an_error_naming_the_root() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("x.jpg"));
        let err = ImageFolder::new(dir.path(), &exts()).list(&Silent).unwrap_err().to_string();
        assert!(err.contains("holds 1 image file but no class folders"), "{err}");
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        std::fs::remove_file(dir.path().join("x.jpg")).unwrap();
        let err = ImageFolder::new(dir.path(), &exts()).list(&Silent).unwrap_err().to_string();
        assert!(err.contains("has no class folders"), "{err}");
    }
}
