//! What `bench-read` reads, and how: one [`Input`] per path and access method, each able to
//! open itself and hand every thread its own [`ItemReader`].
//!
//! Every read ends with the sample's bytes in hand and every byte touched ([`touch`]): a read
//! through a memory map only costs when the bytes are used, and a benchmark that skipped that
//! would report map reads as free and cold reads that never reached the device.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use imgpack_reader::lmdb::{LmdbDataset, Prefetch, Snapshot};
use imgpack_reader::webdataset::WebDataset;
use imgpack_reader::Kind;

use crate::pack::config::DEFAULT_EXTENSIONS;
use crate::source::imagefolder::ImageFolder;
use crate::source::Source;
use crate::{Error, Result};

/// The alignment and granularity of `O_DIRECT` reads: 4096 works for 512-byte and 4K-sector
/// devices alike.
pub const DIRECT_ALIGN: usize = 4096;

/// How one path is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// An ImageFolder tree: open, read the whole file, close — what `ImageFolder` does.
    OpenRead,
    /// LMDB through the memory map, readahead off, nothing else: one device read per 4 KiB
    /// page when cold (py-lmdb with `readahead=False`).
    MapFaults,
    /// LMDB through `imgpack-reader`, which asks for each value's pages in one request.
    Reader,
    /// WebDataset shards: one positioned read of the sample's byte range, found in the index.
    Pread,
    /// One file in fixed-size blocks (`--file`), to calibrate against fio.
    Blocks,
    /// A WebDataset in an object store: one ranged GET of the sample's byte range, found in
    /// the index (what `imgpack.open("s3://...")[i]` does).
    RangedGet,
}

impl Access {
    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Access::OpenRead => "open+read",
            Access::MapFaults => "map faults",
            Access::Reader => "reader",
            Access::Pread => "pread",
            Access::Blocks => "block pread",
            Access::RangedGet => "ranged GET",
        }
    }

    /// The format name used in tables and JSON.
    pub fn format(self) -> &'static str {
        match self {
            Access::OpenRead => "files",
            Access::MapFaults | Access::Reader => "lmdb",
            Access::Pread | Access::RangedGet => "webdataset",
            Access::Blocks => "file",
        }
    }

    /// Whether `--direct` applies (LMDB is always read through its map; a store has no page
    /// cache here).
    pub fn can_be_direct(self) -> bool {
        !matches!(self, Access::MapFaults | Access::Reader | Access::RangedGet)
    }

    /// Whether the reads go through this machine's page cache (`--cache` applies).
    pub fn is_cached(self) -> bool {
        self != Access::RangedGet
    }
}

/// One path to measure, read one way.
#[derive(Debug, Clone)]
pub struct Input {
    /// The path as given.
    pub path: PathBuf,
    /// How it is read.
    pub access: Access,
    what: What,
}

#[derive(Debug, Clone)]
enum What {
    Files(Arc<Vec<PathBuf>>),
    Lmdb { samples: u64 },
    WebDataset { samples: u64, shards: Vec<PathBuf> },
    Blocks { blocks: u64, block_size: u64 },
    Store(Arc<imgpack_reader::webdataset::RemoteWebDataset>),
}

impl Input {
    /// The inputs for `path`, its format detected: an LMDB written by `pack` gives two (through
    /// the map alone, and through the reader), a WebDataset one, and any other directory is
    /// read as an ImageFolder tree (one file per sample).
    pub fn detect(path: &Path) -> Result<Vec<Input>> {
        let meta = std::fs::metadata(path).map_err(Error::io(path))?;
        if !meta.is_dir() {
            return Err(Error::Usage(format!(
                "{}: is a file, not a dataset; pass an ImageFolder tree or a directory written by `pack`, or use --file {} to measure block reads of one file",
                path.display(),
                path.display()
            )));
        }
        let input = |access, what| Input { path: path.to_path_buf(), access, what };
        match imgpack_reader::detect(path) {
            Some(Kind::Lmdb) => {
                let samples = LmdbDataset::open(path)?.len();
                Ok(vec![
                    input(Access::MapFaults, What::Lmdb { samples }),
                    input(Access::Reader, What::Lmdb { samples }),
                ])
            }
            Some(Kind::WebDataset) => {
                let ds = WebDataset::open(path)?;
                let shards = ds.meta().shards.iter().map(|s| path.join(&s.name)).collect();
                Ok(vec![input(Access::Pread, What::WebDataset { samples: ds.len(), shards })])
            }
            None => {
                let tree = ImageFolder::new(path, &DEFAULT_EXTENSIONS);
                let listing = tree.list(&crate::progress::Silent)?;
                if listing.samples.is_empty() {
                    return Err(Error::BadSource {
                        path: path.to_path_buf(),
                        reason: "no image files in class folders; pass an ImageFolder tree (ROOT/CLASS/IMAGE) or a directory written by `pack`".into(),
                    });
                }
                let files = listing.samples.iter().map(|s| tree.file(&s)).collect();
                Ok(vec![input(Access::OpenRead, What::Files(Arc::new(files)))])
            }
        }
    }

    /// One file read in blocks of `block_size` bytes at block-aligned offsets (`--file`).
    /// The WebDataset under the store prefix `url`, at `endpoint`, read by ranged GETs.
    pub fn store(url: &str, endpoint: Option<&str>) -> Result<Input> {
        let dataset = imgpack_reader::webdataset::RemoteWebDataset::open(url, endpoint)?;
        Ok(Input {
            path: PathBuf::from(url),
            access: Access::RangedGet,
            what: What::Store(Arc::new(dataset)),
        })
    }

    /// Where the reads go: the device under the path, or the store's endpoint.
    pub fn device(&self) -> super::device::Device {
        match &self.what {
            What::Store(dataset) => super::device::Device::object_store(dataset.store().endpoint()),
            _ => super::device::device_for(&self.path),
        }
    }

    pub fn blocks(path: &Path, block_size: u64) -> Result<Input> {
        let len = std::fs::metadata(path).map_err(Error::io(path))?.len();
        if block_size == 0 || len < block_size {
            return Err(Error::Usage(format!(
                "{}: {len} bytes, smaller than one {block_size}-byte block; pass a larger file or a smaller --block-size",
                path.display()
            )));
        }
        Ok(Input {
            path: path.to_path_buf(),
            access: Access::Blocks,
            what: What::Blocks { blocks: len / block_size, block_size },
        })
    }

    /// The number of items (samples, or blocks) one pass reads.
    pub fn len(&self) -> u64 {
        match &self.what {
            What::Files(files) => files.len() as u64,
            What::Lmdb { samples } | What::WebDataset { samples, .. } => *samples,
            What::Blocks { blocks, .. } => *blocks,
            What::Store(dataset) => dataset.len(),
        }
    }

    /// Whether there is nothing to read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The files that hold the items in `items`: what a cold measurement evicts and checks.
    pub fn files(&self, items: &[u64]) -> Vec<PathBuf> {
        match &self.what {
            What::Files(files) => {
                let mut out: Vec<PathBuf> = items.iter().map(|&i| files[i as usize].clone()).collect();
                out.sort();
                out.dedup();
                out
            }
            What::Lmdb { .. } => vec![self.path.join("data.mdb")],
            What::WebDataset { shards, .. } => shards.clone(),
            What::Blocks { .. } => vec![self.path.clone()],
            What::Store(_) => Vec::new(), // no local file, no page cache
        }
    }

    /// Opens the input for a measurement. For LMDB this opens the environment, so open after
    /// evicting: pages mapped by a process cannot be evicted.
    pub fn open(&self, direct: bool) -> Result<Opened> {
        let direct = direct && self.access.can_be_direct();
        let open_file = |path: &Path| open_for_read(path, direct);
        Ok(match (&self.what, self.access) {
            (What::Files(files), _) => Opened::Files { files: files.clone(), direct },
            (What::Lmdb { .. }, access) => {
                let prefetch = if access == Access::MapFaults { Prefetch::None } else { Prefetch::Value };
                Opened::Lmdb(LmdbDataset::open_with(&self.path, prefetch)?)
            }
            (What::WebDataset { shards, .. }, _) => {
                let index = WebDataset::open(&self.path)?;
                let files = shards.iter().map(|s| open_file(s)).collect::<Result<Vec<_>>>()?;
                Opened::WebDataset { index, files, direct }
            }
            (What::Blocks { block_size, .. }, _) => Opened::Blocks {
                path: self.path.clone(),
                file: open_file(&self.path)?,
                block_size: *block_size,
                direct,
            },
            (What::Store(dataset), _) => Opened::Store(dataset.clone()),
        })
    }
}

fn direct_error(path: &Path, e: io::Error, direct: bool) -> Error {
    if direct && e.raw_os_error() == Some(libc::EINVAL) {
        return Error::Usage(format!(
            "{}: this file system does not support O_DIRECT; drop --direct (use --cache cold to read from the device through the page cache)",
            path.display()
        ));
    }
    Error::Io { path: path.to_path_buf(), source: e }
}

/// An input opened for one measurement; shared by all its threads.
pub enum Opened {
    /// Raw files, opened per read.
    Files {
        /// Every sample's file.
        files: Arc<Vec<PathBuf>>,
        /// Whether to open them with `O_DIRECT`.
        direct: bool,
    },
    /// An LMDB environment.
    Lmdb(LmdbDataset),
    /// WebDataset shards, opened once.
    WebDataset {
        /// The sample index.
        index: WebDataset,
        /// The shard files, in shard order.
        files: Vec<File>,
        /// Whether they were opened with `O_DIRECT`.
        direct: bool,
    },
    /// One file read in blocks.
    Blocks {
        /// Its path, for messages.
        path: PathBuf,
        /// The file.
        file: File,
        /// The block size.
        block_size: u64,
        /// Whether it was opened with `O_DIRECT`.
        direct: bool,
    },
    /// A WebDataset in an object store, its index fetched once.
    Store(Arc<imgpack_reader::webdataset::RemoteWebDataset>),
}

impl Opened {
    /// A reader for one thread.
    pub fn reader(&self) -> Result<ItemReader<'_>> {
        Ok(ItemReader {
            opened: self,
            snapshot: match self {
                Opened::Lmdb(ds) => Some(ds.snapshot()?),
                _ => None,
            },
            buf: AlignedBuf::default(),
            sum: 0,
        })
    }
}

/// Reads items for one thread. Keeps a running checksum of every byte read so that no read can
/// be optimised away or skip touching its bytes.
pub struct ItemReader<'a> {
    opened: &'a Opened,
    snapshot: Option<Snapshot<'a>>,
    buf: AlignedBuf,
    sum: u64,
}

impl ItemReader<'_> {
    /// Reads item `item` whole and touches every byte; returns the number of bytes.
    pub fn read(&mut self, item: u64) -> Result<u64> {
        let (mut bytes, mut sum) = (0, 0);
        self.visit(item, |data| {
            bytes += data.len() as u64;
            sum ^= touch(data);
        })?;
        self.sum = self.sum.wrapping_add(sum);
        Ok(bytes)
    }

    /// Reads item `item` whole and appends a copy of each of its byte runs (one per LMDB field,
    /// one otherwise) to `out`, pushing each run's range in `out` to `runs`. Each copy starts at
    /// the offset in `out`, modulo 64, that the bytes it copies have in their 64-byte cache line,
    /// so that once `out` sits on a cache-line boundary summing a copy touches as many cache
    /// lines as summing the original ([`super::floor`]). Returns the number of bytes.
    pub fn copy_into(&mut self, item: u64, out: &mut Vec<u8>, runs: &mut Vec<Range<usize>>) -> Result<u64> {
        let mut bytes = 0;
        self.visit(item, |data| {
            let skew = data.as_ptr() as usize % 64;
            let pad = (skew + 64 - out.len() % 64) % 64;
            out.resize(out.len() + pad, 0);
            let start = out.len();
            out.extend_from_slice(data);
            runs.push(start..out.len());
            bytes += data.len() as u64;
        })?;
        Ok(bytes)
    }

    /// Reads item `item` and hands each of its byte runs to `f`.
    #[inline]
    fn visit(&mut self, item: u64, mut f: impl FnMut(&[u8])) -> Result<()> {
        match self.opened {
            Opened::Files { files, direct } => {
                let path = &files[item as usize];
                let mut file = open_for_read(path, *direct)?;
                let data = if *direct {
                    let len = file.metadata().map_err(Error::io(path))?.len() as usize;
                    read_range(&file, 0, len, true, &mut self.buf).map_err(Error::io(path))?
                } else {
                    self.buf.plain.clear();
                    file.read_to_end(&mut self.buf.plain).map_err(Error::io(path))?;
                    &self.buf.plain[..]
                };
                f(data);
            }
            Opened::Lmdb(_) => {
                let snapshot = self.snapshot.as_ref().expect("LMDB readers hold a snapshot");
                let sample = snapshot.get(item)?;
                for field in &sample.fields {
                    f(&field.data);
                }
            }
            Opened::WebDataset { index, files, direct } => {
                let entry = index.entry(item)?;
                let file = &files[entry.shard as usize];
                let data = read_range(file, entry.offset, entry.len as usize, *direct, &mut self.buf)
                    .map_err(Error::io(index.path().join(&index.meta().shards[entry.shard as usize].name)))?;
                f(data);
            }
            Opened::Blocks { path, file, block_size, direct } => {
                let data = read_range(file, item * block_size, *block_size as usize, *direct, &mut self.buf)
                    .map_err(Error::io(path))?;
                f(data);
            }
            Opened::Store(dataset) => f(&dataset.read_range(item)?),
        }
        Ok(())
    }

    /// The checksum of everything read so far.
    pub fn checksum(&self) -> u64 {
        self.sum
    }
}

fn open_for_read(path: &Path, direct: bool) -> Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path).map_err(|e| direct_error(path, e, direct))
}

/// Buffers reused across reads: a plain one, and one aligned for `O_DIRECT`.
#[derive(Default)]
struct AlignedBuf {
    plain: Vec<u8>,
    raw: Vec<u8>,
}

impl AlignedBuf {
    /// An aligned slice of at least `len` bytes.
    fn aligned(&mut self, len: usize) -> &mut [u8] {
        if self.raw.len() < len + DIRECT_ALIGN {
            self.raw = vec![0; (len + DIRECT_ALIGN).next_power_of_two()];
        }
        let skew = self.raw.as_ptr() as usize % DIRECT_ALIGN;
        let start = if skew == 0 { 0 } else { DIRECT_ALIGN - skew };
        &mut self.raw[start..start + len]
    }
}

/// The bytes `offset..offset + len` of `file`, read with [`read_direct`] if it was opened with
/// `O_DIRECT`, else with [`read_at`].
fn read_range<'b>(
    file: &File,
    offset: u64,
    len: usize,
    direct: bool,
    buf: &'b mut AlignedBuf,
) -> io::Result<&'b [u8]> {
    if direct {
        read_direct(file, offset, len, buf)
    } else {
        read_at(file, offset, len, buf)
    }
}

/// One positioned read of `len` bytes at `offset`, into the plain buffer.
fn read_at<'b>(file: &File, offset: u64, len: usize, buf: &'b mut AlignedBuf) -> io::Result<&'b [u8]> {
    if buf.plain.len() < len {
        buf.plain.resize(len, 0);
    }
    file.read_exact_at(&mut buf.plain[..len], offset)?;
    Ok(&buf.plain[..len])
}

/// `O_DIRECT` read of the bytes `offset..offset + len`: the enclosing aligned range is read into
/// an aligned buffer (one request, unless the kernel splits it) and the wanted part returned.
fn read_direct<'b>(file: &File, offset: u64, len: usize, buf: &'b mut AlignedBuf) -> io::Result<&'b [u8]> {
    let align = DIRECT_ALIGN as u64;
    let start = offset / align * align;
    let end = (offset + len as u64).div_ceil(align) * align;
    let span = (end - start) as usize;
    let out = buf.aligned(span);
    let mut done = 0;
    while done < span {
        match file.read_at(&mut out[done..], start + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let skip = (offset - start) as usize;
    if done < skip + len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file ended before the sample did"));
    }
    Ok(&out[skip..skip + len])
}

/// Touches every byte of `data` and folds them into a checksum: 64-bit word sums, which
/// compilers vectorise, because reading memory, not hashing it, is what is being timed.
///
/// The two halves are read side by side: two streams keep more cache misses in flight than
/// one, so touching ~100 kB costs ~5.3 µs here instead of ~6.1 µs, and the harness adds that
/// much less to what it measures.
#[inline]
pub fn touch(data: &[u8]) -> u64 {
    let half = data.len() / 2 / 64 * 64;
    let (a, rest) = data.split_at(half);
    let (b, tail) = rest.split_at(half);
    let mut la = [0u64; 8];
    let mut lb = [0u64; 8];
    for (ca, cb) in a.chunks_exact(64).zip(b.chunks_exact(64)) {
        for i in 0..8 {
            let word = |c: &[u8]| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            la[i] = la[i].wrapping_add(word(ca));
            lb[i] = lb[i].wrapping_add(word(cb));
        }
    }
    let sum = la.iter().chain(&lb).fold(0u64, |s, &l| s.rotate_left(17) ^ l);
    tail.iter().fold(sum, |s, &b| s.wrapping_mul(31).wrapping_add(u64::from(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_sees_every_byte() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
        let base = touch(&data);
        for at in [0, 7, 31, 32, 500, 991, 999] {
            let mut changed = data.clone();
            changed[at] ^= 1;
            assert_ne!(touch(&changed), base, "a change at byte {at} went unseen");
        }
    }

    #[test]
    fn direct_reads_return_the_asked_range() {
        let dir = tempfile::tempdir_in(std::env::current_exe().unwrap().parent().unwrap()).unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3 * DIRECT_ALIGN as u32 + 100).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = open_for_read(&path, true).unwrap();
        let mut buf = AlignedBuf::default();
        for (offset, len) in [(0, 10), (100, 5000), (4096, 4096), (12000, 388)] {
            let got = read_direct(&file, offset, len, &mut buf).unwrap();
            assert_eq!(got, &data[offset as usize..offset as usize + len]);
        }
        assert!(read_direct(&file, 12000, 389, &mut buf).is_err());
        let plain = File::open(&path).unwrap();
        assert_eq!(read_at(&plain, 5, 7, &mut buf).unwrap(), &data[5..12]);
    }
}
