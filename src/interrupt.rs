//! Stopping cleanly on Ctrl-C (SIGINT) or SIGTERM.
//!
//! The handler only sets a flag. The pipeline looks at it between chunks: it stops loading,
//! makes what it has written durable, writes a checkpoint and returns
//! [`crate::Error::Interrupted`], which `pack` reports with exit code 130 (128 + SIGINT, as
//! shells do). The handler is installed with `SA_RESETHAND`, so a second Ctrl-C kills the
//! process at once — which is still safe: the output is never published half-written.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: all that is async-signal-safe here.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Asks for a stop, as the signal handler does (for tests and embedders).
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}
