//! How long library calls (packing, merging, verifying, benchmarking) tell their caller how far
//! they got, without knowing who draws it.
//!
//! The `pack` binary (and the Python package's `pack`, the same code) renders [`Progress`] as
//! an indicatif bar on the terminal; an embedding program can render it its own way, and a test
//! can record it. The calls are hints for display: nothing about the work depends on them, and
//! every method has a default that ignores it, so a front end implements only what it shows.

/// Receives a running call's progress. Called from the calling thread and from worker threads,
/// hence `Sync`; calls are cheap and frequent (once per sample or batch), so an implementation
/// should not block.
pub trait Progress: Sync {
    /// What the call is doing now, in a few words ("listing samples", "syncing to disk").
    fn message(&self, _text: &str) {}

    /// Something the user should hear of as it happens, even where no bar is drawn (a batch
    /// job's log): a wait of seconds for another run's lock, say. A line, not a status: the
    /// default shows it as the [`message`](Progress::message).
    fn notice(&self, text: &str) {
        self.message(text)
    }

    /// A new stretch of work of `total` units (samples, bytes, reads: the call's documentation
    /// says which; `0` when unknown) starts: a bar may restart its clock and rate here.
    fn length(&self, _total: u64) {}

    /// How many units are done, when the call knows the absolute number.
    fn position(&self, _done: u64) {}

    /// `delta` more units are done.
    fn advance(&self, _delta: u64) {}

    /// The work is done; a bar can be cleared. (A call that fails returns its error instead.)
    fn finish(&self) {}
}

/// Progress that goes nowhere: for callers that do not show any.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {}

#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Mutex;

    use super::Progress;

    /// Records every call, for tests that check what a library call reports.
    #[derive(Debug, Default)]
    pub struct Recorded {
        /// Messages in order.
        pub messages: Mutex<Vec<String>>,
        /// `(length, position)` as last set, with `advance` added to the position.
        pub state: Mutex<(u64, u64)>,
        /// Whether `finish` was called.
        pub finished: Mutex<bool>,
    }

    impl Progress for Recorded {
        fn message(&self, text: &str) {
            self.messages.lock().unwrap().push(text.to_string());
        }
        fn length(&self, total: u64) {
            self.state.lock().unwrap().0 = total;
        }
        fn position(&self, done: u64) {
            self.state.lock().unwrap().1 = done;
        }
        fn advance(&self, delta: u64) {
            self.state.lock().unwrap().1 += delta;
        }
        fn finish(&self) {
            *self.finished.lock().unwrap() = true;
        }
    }
}
