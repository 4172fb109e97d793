//! Stopping on Ctrl-C (SIGINT) or SIGTERM: cleanly at a checkpoint on the first signal, at once
//! on a second one.
//!
//! **The first signal** sets a flag and prints one line on stderr ([`STOPPING`]). The pipeline
//! looks at the flag between chunks: it stops loading, makes what it has written durable,
//! writes a checkpoint and returns [`crate::Error::Interrupted`], which `pack` reports with exit
//! code 130 (128 + SIGINT, as shells do). That can take a while — the chunk being loaded is
//! finished first, and a checkpoint syncs the output — hence the "please wait".
//!
//! **The same signal again within [`SAME_REQUEST`]** is the same request and is ignored.
//! `timeout -s INT` sends its signal to the child and then to the child's process group, so
//! `pack` may get it twice within microseconds; a terminal's Ctrl-C reaches every process of
//! the foreground group, and a shell script forwarding it can add one more. The handler used to
//! be reset after the first signal (`SA_RESETHAND`), and about one run in six under `timeout`
//! died silently from the second delivery, leaving its lock file behind.
//!
//! **A later signal** means "stop now": the handler prints [`STOPPING_NOW`] and calls
//! `_exit(130)`, without unwinding, destructors or buffered output. That is as safe as a
//! `kill -9`, which `tests/resume.rs` does at random moments:
//! - the output is written under a temporary name and renamed into place only once complete
//!   and synced ([`crate::pack::staged`]), so an exit at any moment leaves either no output
//!   or the whole of it, never something that looks complete and is not;
//! - the checkpoint journal is replaced by writing a temporary, syncing it and renaming it over
//!   the old one ([`crate::fs::replace_file`]), so it is the last complete checkpoint, never a
//!   torn one; the shards and LMDB pages it lists were synced before it was written, and
//!   `--resume` cuts away whatever was written after it;
//! - the output lock is a `flock`, which the kernel releases when the process ends; the lock
//!   file left beside the output is taken over by the next run ([`crate::pack::staged::OutputLock`]).
//!
//! `pack merge` stops the same way but has no checkpoints: it stops between shards and
//! batches, before it publishes, and is run again ([`Stopping::BeforePublishing`]); its
//! messages say so ([`MERGE_STOPPING`], [`MERGE_STOPPING_NOW`]).
//!
//! The handler only reads the monotonic clock, touches atomics, `write`s to fd 2 and calls
//! `_exit`: all async-signal-safe. It saves and restores `errno`, which `write` may change
//! under the code it interrupted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The exit code of a run stopped by SIGINT or SIGTERM, either way (128 + SIGINT).
pub const EXIT_CODE: u8 = 130;

/// A signal this soon after the first is a second delivery of the same request, not a second
/// request: `timeout`'s two sends arrive microseconds apart, a person pressing Ctrl-C again
/// because the first seems to do nothing takes longer than this.
pub const SAME_REQUEST: Duration = Duration::from_secs(1);

/// What the first signal prints on stderr (after clearing the progress bar's line on a
/// terminal).
pub const STOPPING: &str = "pack: stopping at the next checkpoint, please wait (Ctrl-C again to stop now)\n";

/// What a second signal prints before the process exits with [`EXIT_CODE`].
pub const STOPPING_NOW: &str = "pack: stopping now; an unfinished output is never published, and --resume continues from the last checkpoint\n";

/// What the first signal prints during `pack merge`.
pub const MERGE_STOPPING: &str =
    "pack merge: stopping before the merged dataset is published, please wait (Ctrl-C again to stop now)\n";

/// What a second signal prints during `pack merge`.
pub const MERGE_STOPPING_NOW: &str =
    "pack merge: stopping now; run the same `pack merge` again to finish the merge\n";

/// Where a command stops on the first signal, which decides what the handler says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopping {
    /// Packing: at the next checkpoint, continued with `--resume`.
    AtCheckpoint,
    /// `pack merge`: between shards and batches, before publishing; run again.
    BeforePublishing,
}

impl Stopping {
    /// What the first signal and a later one print.
    pub fn messages(self) -> (&'static str, &'static str) {
        match self {
            Stopping::AtCheckpoint => (STOPPING, STOPPING_NOW),
            Stopping::BeforePublishing => (MERGE_STOPPING, MERGE_STOPPING_NOW),
        }
    }
}

/// Erases the current terminal line (the progress bar, and the `^C` the terminal echoed).
const CLEAR_LINE: &str = "\r\x1b[2K";

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// `CLOCK_MONOTONIC` in nanoseconds when the first signal arrived; 0 before it.
static FIRST_SIGNAL_NS: AtomicU64 = AtomicU64::new(0);
/// Whether stderr is a terminal (asked once, at install: `isatty` is not async-signal-safe).
static STDERR_IS_TERMINAL: AtomicBool = AtomicBool::new(false);
/// Whether the installed handler speaks for `pack merge` ([`Stopping::BeforePublishing`]).
static MERGING: AtomicBool = AtomicBool::new(false);

/// What a signal does, given when the first one arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// The first signal: ask for a stop at the next checkpoint.
    Stop,
    /// A second delivery of the first request: nothing.
    Ignore,
    /// A second request: exit now.
    ExitNow,
}

/// The decision of the handler: `first_ns` is when the first signal arrived (`None` if this
/// is it), `now_ns` is now, both on the monotonic clock.
fn action(first_ns: Option<u64>, now_ns: u64) -> Action {
    match first_ns {
        None => Action::Stop,
        Some(first) if now_ns.saturating_sub(first) < SAME_REQUEST.as_nanos() as u64 => Action::Ignore,
        Some(_) => Action::ExitNow,
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds, never 0 (0 means "no signal yet").
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64).max(1)
}

/// Writes `text` to stderr with one `write(2)`; a failure is ignored (there is nowhere to say it).
fn say(text: &str) {
    // SAFETY: write(2) from a buffer that outlives the call; it is async-signal-safe.
    unsafe { libc::write(libc::STDERR_FILENO, text.as_ptr().cast(), text.len()) };
}

extern "C" fn on_signal(_: libc::c_int) {
    // SAFETY: errno is thread-local; this thread's location is valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    let now = monotonic_ns();
    // Two signals may be handled at once on two threads: one of them is the first.
    let first = FIRST_SIGNAL_NS.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst).err();
    let clear = || {
        if STDERR_IS_TERMINAL.load(Ordering::Relaxed) {
            say(CLEAR_LINE);
        }
    };
    let stopping =
        if MERGING.load(Ordering::Relaxed) { Stopping::BeforePublishing } else { Stopping::AtCheckpoint };
    let (stopping, stopping_now) = stopping.messages();
    match action(first, now) {
        Action::Stop => {
            REQUESTED.store(true, Ordering::SeqCst);
            clear();
            say(stopping);
        }
        Action::Ignore => {}
        Action::ExitNow => {
            clear();
            say(stopping_now);
            // SAFETY: _exit ends the process without running any code of this program; what
            // that leaves on disk is safe, as the module documentation explains.
            unsafe { libc::_exit(i32::from(EXIT_CODE)) };
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handler for SIGINT and SIGTERM (for the rest of the process: see the module
/// documentation for what the first and a second signal do), saying what `stopping` does.
pub fn install(stopping: Stopping) {
    MERGING.store(stopping == Stopping::BeforePublishing, Ordering::Relaxed);
    // SAFETY: isatty only asks about a file descriptor.
    STDERR_IS_TERMINAL.store(unsafe { libc::isatty(libc::STDERR_FILENO) } == 1, Ordering::Relaxed);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe (above). Both
        // signals are blocked while it runs on a thread, so one thread handles one at a time;
        // SA_RESTART keeps the system calls it interrupts from failing with EINTR.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaddset(&mut action.sa_mask, libc::SIGINT);
            libc::sigaddset(&mut action.sa_mask, libc::SIGTERM);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Asks for a stop at the next checkpoint, as the first signal does, without printing (for
/// tests and embedders). A signal after it is still a first one.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn the_first_signal_stops_a_repeat_within_a_second_is_ignored_a_later_one_exits() {
        assert_eq!(action(None, 5 * SECOND), Action::Stop);
        assert_eq!(action(Some(5 * SECOND), 5 * SECOND), Action::Ignore, "timeout's second send");
        assert_eq!(action(Some(5 * SECOND), 5 * SECOND + SECOND / 2), Action::Ignore);
        assert_eq!(action(Some(5 * SECOND), 6 * SECOND), Action::ExitNow);
        assert_eq!(action(Some(5 * SECOND), 60 * SECOND), Action::ExitNow);
        // Handled on another thread with an earlier reading of the clock: the same request.
        assert_eq!(action(Some(5 * SECOND), 4 * SECOND), Action::Ignore);
    }

    #[test]
    fn the_clock_is_monotonic_and_never_reads_as_no_signal() {
        let (a, b) = (monotonic_ns(), monotonic_ns());
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn the_messages_are_one_line_each() {
        for (text, prefix) in [
            (STOPPING, "pack: "),
            (STOPPING_NOW, "pack: "),
            (MERGE_STOPPING, "pack merge: "),
            (MERGE_STOPPING_NOW, "pack merge: "),
        ] {
            assert!(
                text.starts_with(prefix) && text.ends_with('\n') && text.matches('\n').count() == 1,
                "{text}"
            );
        }
        assert!(STOPPING.contains("please wait") && STOPPING_NOW.contains("--resume"));
    }

    #[test]
    fn a_merge_is_told_it_stops_before_publishing_not_at_a_checkpoint() {
        assert_eq!(Stopping::AtCheckpoint.messages(), (STOPPING, STOPPING_NOW));
        let (first, now) = Stopping::BeforePublishing.messages();
        assert!(
            first.starts_with("pack merge: ") && first.contains("before") && first.contains("please wait")
        );
        assert!(!first.contains("checkpoint") && !now.contains("--resume"), "a merge has neither");
        assert!(now.contains("`pack merge` again"));
    }
}
