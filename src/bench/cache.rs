//! The page cache: evicting a file from it and checking which of its pages it holds.
//!
//! A cold-cache figure is only worth something if the bytes really came from the device, so
//! eviction is never assumed: every file is checked with `mincore` after
//! `posix_fadvise(POSIX_FADV_DONTNEED)`, which needs no root (unlike `drop_caches`) and touches
//! only the files being measured. The kernel keeps pages that are dirty or mapped by some
//! process, and some file systems ignore the advice; the check catches all of these.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// How much of a set of files is in the page cache, in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Residency {
    /// Pages in the page cache.
    pub resident: u64,
    /// Pages in all.
    pub total: u64,
    /// Pages of files whose residency the kernel does not report to us (see [`resident`]);
    /// counted in neither `resident` nor `total`.
    pub unknown: u64,
}

impl Residency {
    /// The resident share, 0 to 1; `None` if nothing could be checked.
    pub fn share(&self) -> Option<f64> {
        (self.total > 0).then(|| self.resident as f64 / self.total as f64)
    }

    /// Adds another file's figures.
    pub fn add(&mut self, other: Residency) {
        self.resident += other.resident;
        self.total += other.total;
        self.unknown += other.unknown;
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

/// Drops `path`'s pages from the page cache: writes back any dirty ones first (a dataset
/// just copied or packed may not be on the device yet, and dirty pages cannot be dropped),
/// then asks the kernel to drop them all. Pages mapped by a process stay.
pub fn evict(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    // fdatasync works on a read-only descriptor and costs nothing when nothing is dirty.
    file.sync_data()?;
    // SAFETY: a valid open descriptor; offset 0 and length 0 mean the whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Which of `path`'s pages are in the page cache, by mapping it and asking `mincore`.
///
/// Since Linux 5.2 `mincore` reports the page cache only for files the caller owns or may
/// write; for others it claims every page resident. Such files are counted as `unknown`
/// rather than reported as cached.
pub fn resident(path: &Path) -> io::Result<Residency> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    let page = page_size();
    let pages = meta.len().div_ceil(page);
    if pages == 0 {
        return Ok(Residency::default());
    }
    if !reports_page_cache(path, &meta) {
        return Ok(Residency { unknown: pages, ..Residency::default() });
    }
    let len = usize::try_from(meta.len()).map_err(|_| io::Error::other("file too large to map"))?;
    // SAFETY: a fresh shared read-only mapping of an open file, unmapped below; it is never
    // read, so no page is faulted in and a concurrent truncation cannot fault us.
    let addr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; pages as usize];
    // SAFETY: addr..addr+len is the mapping made above and vec holds one byte per page of it.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmapping exactly the mapping made above.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    let resident = vec.iter().filter(|&&b| b & 1 == 1).count() as u64;
    Ok(Residency { resident, total: pages, unknown: 0 })
}

/// Whether `mincore` tells us the truth about this file: we own it, or may write it, or are
/// root.
fn reports_page_cache(path: &Path, meta: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 || meta.uid() == euid {
        return true;
    }
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: a NUL-terminated path.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A directory on the disk the tests were built on (`/tmp` may be tmpfs, which has no
    /// device to evict to).
    fn disk_dir() -> tempfile::TempDir {
        let exe = std::env::current_exe().unwrap();
        tempfile::tempdir_in(exe.parent().unwrap()).unwrap()
    }

    #[test]
    fn eviction_is_seen_by_mincore() {
        let dir = disk_dir();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..64 * 4096u32).map(|i| (i * 7) as u8).collect();
        {
            let mut f = File::create(&path).unwrap();
            // Left dirty on purpose: evict must write it back first.
            f.write_all(&data).unwrap();
        }
        let mut back = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
        let before = resident(&path).unwrap();
        assert_eq!(before.total, data.len() as u64 / page_size());
        assert_eq!(before.unknown, 0);
        evict(&path).unwrap();
        let after = resident(&path).unwrap();
        assert_eq!(after.total, before.total);
        assert_eq!(before.resident, before.total, "a file just read is cached");
        assert!(after.resident < before.total / 4, "eviction left {after:?}");
        // Reading it again brings it back.
        File::open(&path).unwrap().read_to_end(&mut Vec::new()).unwrap();
        assert_eq!(resident(&path).unwrap().resident, before.total);
    }

    #[test]
    fn an_empty_file_has_no_pages() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty");
        File::create(&path).unwrap();
        assert_eq!(resident(&path).unwrap(), Residency::default());
        assert_eq!(Residency::default().share(), None);
        evict(&path).unwrap();
    }
}
