//! `writev` for this process: large vectored writes split into 64 KiB `write`s.
//!
//! LMDB flushes a transaction's dirty pages with `writev` calls of up to 64 pages or overflow
//! runs, several megabytes each. On the kernels and VMs we measured, one multi-megabyte write
//! into the page cache costs far more system time per byte than the same bytes in 64 KiB
//! writes (the kernel allocates large page-cache folios for large writes, and getting those
//! from a guest whose free memory was handed back to its host is slow): in
//! `benches/pack_vs_tar.py`, `pack --to lmdb` spent 3.7 s of its 5 s in 269 `writev` calls,
//! and took 1.9 s instead of 5.1 s once they were split — tar, which writes 10 KiB at a time,
//! never meets the problem. LMDB offers no knob for its write size, so the binary provides its
//! own `writev`: the static linker resolves LMDB's call to this definition instead of libc's.
//!
//! Semantics are those of `writev` on a regular file: the buffers are written in order at the
//! file position, the call returns the total written, and on an error it returns -1 with
//! `errno` set (so LMDB reports `ENOSPC` and the like as such). Interrupted writes are retried.
//! Nothing else in `pack` calls `writev` on anything but files and standard streams, for which
//! the splitting is harmless.

/// The largest single `write` issued.
const PIECE: usize = 64 << 10;

/// Writes `iovcnt` buffers from `iov` to `fd`, in pieces of at most [`PIECE`] bytes.
///
/// # Safety
///
/// The caller's contract is libc's: `iov` points to `iovcnt` valid `iovec`s whose buffers are
/// readable for their lengths.
#[no_mangle]
pub unsafe extern "C" fn writev(
    fd: libc::c_int,
    iov: *const libc::iovec,
    iovcnt: libc::c_int,
) -> libc::ssize_t {
    if iovcnt < 0 || (iovcnt > 0 && iov.is_null()) {
        // SAFETY: errno is thread-local; setting it is always sound.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return -1;
    }
    // SAFETY: per the function's contract, `iov` holds `iovcnt` iovecs.
    let buffers = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
    let mut total: libc::ssize_t = 0;
    for buffer in buffers {
        let mut done = 0usize;
        while done < buffer.iov_len {
            let len = (buffer.iov_len - done).min(PIECE);
            // SAFETY: `iov_base + done .. + len` lies inside the caller's buffer.
            let written = unsafe { libc::write(fd, buffer.iov_base.cast::<u8>().add(done).cast(), len) };
            if written < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return -1;
            }
            done += written as usize;
            total += written;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, Read, Seek, Write};

    #[test]
    fn vectored_writes_land_whole_and_in_order() {
        let mut file = tempfile::tempfile().unwrap();
        let big = vec![7u8; 200_000];
        let slices = [IoSlice::new(b"head"), IoSlice::new(&big), IoSlice::new(b""), IoSlice::new(b"tail")];
        let mut written = 0;
        while written < 200_008 {
            written += file.write_vectored(&slices).unwrap();
            assert_eq!(written, 200_008, "one call writes everything");
        }
        let mut back = Vec::new();
        file.rewind().unwrap();
        file.read_to_end(&mut back).unwrap();
        assert_eq!(&back[..4], b"head");
        assert!(back[4..200_004].iter().all(|&b| b == 7));
        assert_eq!(&back[200_004..], b"tail");
    }

    #[test]
    fn errors_come_back_as_minus_one_with_errno() {
        let iov = libc::iovec { iov_base: b"x".as_ptr() as *mut _, iov_len: 1 };
        // SAFETY: one valid iovec; fd -1 is invalid on purpose.
        let r = unsafe { super::writev(-1, &iov, 1) };
        assert_eq!(r, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EBADF));
    }
}
