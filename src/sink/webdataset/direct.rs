//! Shard files written around the page cache (`O_DIRECT`), from aligned blocks handed to a
//! thread of their own.
//!
//! A shard is written once, front to back, and not read again by the run, so caching its pages
//! buys nothing, and filling the page cache is most of what writing it costs: every page is
//! allocated, copied into, marked dirty and later written back. On this project's 2-core VM
//! (`benches/pack_vs_tar.py`, 5,000 JPEGs, 488 MB) that was about 40% of WebDataset packing's
//! CPU time; written this way instead, packing 15,000 JPEGs (1.47 GB) took 1.20 s (1.09–1.26)
//! against 1.80 s (1.31–2.55) through the page cache, 5 alternating rounds of
//! `benches/ab_builds.py` (`dd oflag=direct` is the benchmark's disk floor for the same
//! reason). So the sink copies each member into a block of [`BLOCK_BYTES`] aligned to
//! [`ALIGN`], and a writer thread writes full blocks while the next ones fill: the disk works
//! while the CPU copies, and memory stays at [`BLOCKS`] blocks per open shard.
//!
//! The last block is padded to the alignment, written, and the file cut back to its true
//! length. Where the file system refuses `O_DIRECT` (tmpfs on older kernels, some FUSE and
//! network file systems), at `open` or at the first write, the file is written through the
//! page cache instead, with the same bytes; the shard's `fsync` is unchanged either way.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::{Error, Result};

/// Offsets, lengths and memory of `O_DIRECT` writes are multiples of this: the page size,
/// which covers every logical block size in use (512 B and 4 KiB).
const ALIGN: usize = 4096;

/// Bytes per write: large enough that a write's fixed cost vanishes (the benchmark's `dd`
/// floor writes 8 MiB blocks; 4 MiB measured the same), small enough that the writer never
/// waits long for a block.
const BLOCK_BYTES: usize = 4 << 20;

/// Blocks per shard: one filling, one being written, one spare so that the filling side does
/// not wait for the write of the last one to return.
const BLOCKS: usize = 3;

/// A block of [`BLOCK_BYTES`], aligned to [`ALIGN`] inside its allocation.
struct Block {
    memory: Vec<u8>,
    start: usize,
    len: usize,
}

impl Block {
    fn new() -> Block {
        let memory = vec![0u8; BLOCK_BYTES + ALIGN];
        let start = memory.as_ptr().align_offset(ALIGN);
        Block { memory, start, len: 0 }
    }

    /// The filled bytes, from the aligned start.
    fn filled(&self) -> &[u8] {
        &self.memory[self.start..self.start + self.len]
    }

    /// Appends what fits of `bytes`; returns how many were taken.
    fn fill(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(BLOCK_BYTES - self.len);
        let at = self.start + self.len;
        self.memory[at..at + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        n
    }

    /// Pads the filled bytes with zeros to the next multiple of [`ALIGN`].
    fn pad(&mut self) {
        let padded = self.len.div_ceil(ALIGN) * ALIGN;
        let at = self.start + self.len;
        self.memory[at..self.start + padded].fill(0);
        self.len = padded;
    }
}

/// A shard file being written with `O_DIRECT`.
pub(super) struct DirectFile {
    path: PathBuf,
    /// The block being filled.
    block: Block,
    /// Bytes appended in all.
    len: u64,
    /// Full blocks to the writer thread, and empty ones back.
    full: Option<SyncSender<Block>>,
    empty: Receiver<Block>,
    writer: Option<JoinHandle<io::Result<File>>>,
}

impl DirectFile {
    /// Creates `path` (truncating it) for writing around the page cache; `None` where the file
    /// system refuses `O_DIRECT` (the caller writes it buffered then).
    pub(super) fn create(path: &Path) -> Result<Option<DirectFile>> {
        use std::os::unix::fs::OpenOptionsExt;
        let opened = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        let file = match opened {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(Error::io(path)(e)),
        };
        DirectFile::start(path, file).map(Some)
    }

    /// Writes `file`, named `path` in errors, from a thread of its own.
    fn start(path: &Path, file: File) -> Result<DirectFile> {
        let (full, to_write) = mpsc::sync_channel::<Block>(BLOCKS);
        let (give_back, empty) = mpsc::sync_channel::<Block>(BLOCKS);
        for _ in 1..BLOCKS {
            give_back.send(Block::new()).expect("the receiver is here");
        }
        let writer = std::thread::Builder::new()
            .name("imgpack-shard-write".into())
            .spawn(move || write_blocks(file, to_write, give_back))
            .map_err(Error::io(path))?;
        Ok(DirectFile {
            path: path.to_path_buf(),
            block: Block::new(),
            len: 0,
            full: Some(full),
            empty,
            writer: Some(writer),
        })
    }

    /// Appends `bytes`.
    pub(super) fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let n = self.block.fill(bytes);
            bytes = &bytes[n..];
            self.len += n as u64;
            if self.block.len == BLOCK_BYTES {
                self.send_block()?;
            }
        }
        Ok(())
    }

    /// Hands the filled block to the writer thread and takes an empty one.
    fn send_block(&mut self) -> Result<()> {
        let Ok(mut next) = self.empty.recv() else { return Err(self.failure()) };
        next.len = 0;
        let full = std::mem::replace(&mut self.block, next);
        self.hand_over(full)
    }

    /// Queues `block` for the writer thread.
    fn hand_over(&mut self, block: Block) -> Result<()> {
        let sender = self.full.as_ref().expect("open until finished");
        if sender.send(block).is_err() {
            return Err(self.failure());
        }
        Ok(())
    }

    /// Ends the writer thread once it has written what was queued: the file, or its error.
    fn stop_writer(&mut self) -> io::Result<File> {
        self.full = None;
        match self.writer.take().map(|w| w.join()) {
            Some(Ok(written)) => written,
            Some(Err(_)) => Err(io::Error::other("the shard writer thread panicked")),
            None => Err(io::Error::other("the shard writer thread stopped")),
        }
    }

    /// The writer thread's error, once it has stopped: called when it stopped taking blocks.
    fn failure(&mut self) -> Error {
        let e =
            self.stop_writer().err().unwrap_or_else(|| io::Error::other("the shard writer thread stopped"));
        Error::io(&self.path)(e)
    }

    /// Writes what is left and cuts the file to its length: the file, written, not yet synced.
    pub(super) fn finish(mut self) -> Result<File> {
        if self.block.len > 0 {
            self.block.pad();
            let last = std::mem::replace(&mut self.block, Block { memory: Vec::new(), start: 0, len: 0 });
            self.hand_over(last)?;
        }
        let file = self.stop_writer().map_err(Error::io(&self.path))?;
        file.set_len(self.len).map_err(Error::io(&self.path))?;
        Ok(file)
    }
}

impl Drop for DirectFile {
    /// A shard abandoned by an error or a stop: the writer thread ends with what it has.
    fn drop(&mut self) {
        let _ = self.stop_writer();
    }
}

/// The writer thread: writes each full block in turn and gives it back.
fn write_blocks(mut file: File, full: Receiver<Block>, empty: SyncSender<Block>) -> io::Result<File> {
    let mut direct = true;
    for block in full {
        match file.write_all(block.filled()) {
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                // Accepted at `open`, refused at `write`: go through the page cache instead.
                // Nothing was written by the refused call.
                buffered(&file)?;
                direct = false;
                file.write_all(block.filled())?;
            }
            written => written?,
        }
        // The filling side may be gone (an error, a stop); the block is simply dropped then.
        let _ = empty.send(block);
    }
    Ok(file)
}

/// Clears `O_DIRECT` on an open file.
fn buffered(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own, reading and setting its status flags only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that tell their offsets apart.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn writes_the_bytes_appended_across_blocks_and_an_unaligned_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.tar");
        let mut file = DirectFile::create(&path).unwrap().expect("this file system takes O_DIRECT");
        let mut expected = Vec::new();
        // Pieces of awkward sizes, together over two blocks and ending off any alignment.
        for (i, len) in
            [512usize, 98_765, BLOCK_BYTES - 3, 1, 7 * ALIGN + 17, BLOCK_BYTES / 2].iter().enumerate()
        {
            let piece = pattern(*len, i as u8);
            file.write(&piece).unwrap();
            expected.extend_from_slice(&piece);
        }
        let written = file.finish().unwrap();
        drop(written);
        let read = std::fs::read(&path).unwrap();
        assert_eq!(read.len(), expected.len(), "cut back to its length");
        assert!(read == expected, "the bytes differ");
    }

    #[test]
    fn a_file_of_less_than_one_block_and_an_empty_one() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, ALIGN, ALIGN + 1] {
            let path = dir.path().join(format!("f{len}"));
            let mut file = DirectFile::create(&path).unwrap().expect("O_DIRECT");
            let bytes = pattern(len, 9);
            file.write(&bytes).unwrap();
            file.finish().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{len} bytes");
        }
    }

    #[test]
    fn a_write_refused_with_einval_is_written_through_the_page_cache_instead() {
        // Some file systems accept O_DIRECT at open and refuse it at write (EINVAL). A block
        // that starts off the alignment is refused the same way by this one: the writer must
        // switch the file to buffered writes and lose nothing, before or after.
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.tar");
        let file =
            OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
        let block = |seed: u8, misaligned: bool| {
            let mut block = Block::new();
            block.start += usize::from(misaligned);
            block.fill(&pattern(2 * ALIGN, seed));
            block
        };
        let (full, to_write) = mpsc::sync_channel(BLOCKS);
        let (give_back, _empty) = mpsc::sync_channel(BLOCKS);
        for (seed, misaligned) in [(1, false), (2, true), (3, false)] {
            full.send(block(seed, misaligned)).unwrap();
        }
        drop(full);
        let file = write_blocks(file, to_write, give_back).expect("the refused write is done buffered");
        // SAFETY: reading the status flags of a descriptor the test owns.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_DIRECT, 0, "still O_DIRECT after a refused write");
        drop(file);
        let expected: Vec<u8> = [1, 2, 3].into_iter().flat_map(|seed| pattern(2 * ALIGN, seed)).collect();
        assert!(std::fs::read(&path).unwrap() == expected, "the bytes differ");
    }

    #[test]
    fn a_failing_write_is_reported_with_the_path() {
        // A file opened read-only refuses every write (EBADF) in the writer thread.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.tar");
        std::fs::write(&path, b"").unwrap();
        let mut file = DirectFile::start(&path, File::open(&path).unwrap()).unwrap();
        let mut result = Ok(());
        for _ in 0..BLOCKS + 2 {
            result = file.write(&vec![1u8; BLOCK_BYTES]);
            if result.is_err() {
                break;
            }
        }
        let error = match result {
            Err(e) => e,
            Ok(()) => file.finish().expect_err("a read-only file takes no bytes"),
        };
        let text = error.to_string();
        assert!(text.contains("shard.tar"), "{text}");
    }
}
