//! One run at a time writes a store prefix: a lease on `PREFIX/imgpack-resume/lock`.
//!
//! A local output is locked with a `flock` ([`crate::pack::staged::OutputLock`]), which the
//! kernel drops when its process dies. An object store has no such thing, and two runs on one
//! prefix — a Slurm task requeued while its first attempt still runs, a job submitted twice —
//! would abort each other's uploads and delete each other's shards: the later one clears what
//! it finds, the earlier one may still publish `imgpack.json` over a prefix half rewritten.
//!
//! So a run writing a prefix holds a **lease**: it creates the lock object with a conditional
//! write (`If-None-Match: *`, which fails if the object exists) and rewrites it every
//! [`Timing::renew`] with `If-Match` on the ETag it last wrote, each time with a new renewal
//! number so the ETag changes. The lease is what clocks cannot give across machines: a run
//! that finds the object does not compare timestamps, it watches the ETag. If it changes, the
//! holder is alive and the run fails at once ([`Error::StoreBusy`], naming the holder's pid and
//! host). If it stays the same for [`Timing::stale`] the holder is gone (killed, its machine
//! lost) and the lock is taken over, with `If-Match` on the stale ETag so that of two runs
//! waiting only one wins.
//!
//! **Every write is fenced.** The [`Store`] of a run that holds the lease refuses to write once
//! the lease is lost ([`Store::guard`]), and `imgpack.json`, which makes the prefix a dataset, is
//! stored only after a renewal just before it has succeeded ([`Store::confirm_lease`]). A run
//! whose renewal finds another run's ETag (it was paused or cut off for longer than the stale
//! time, and taken over) stops with [`Error::StoreLockLost`] and leaves the prefix to the other
//! run, deleting nothing.
//!
//! A conditional write whose answer is lost (a timeout, or `object_store` retrying a request
//! the store had applied) fails as if another run had written: the object then names this run
//! (same pid, host and start), and the run takes its new ETag as its own.
//!
//! A run that ends, however it ends short of being killed, deletes the lock object. Stores that
//! ignore conditional headers do not protect a prefix, as before this lock; one that rejects
//! them as unsupported (HTTP 501) is written unlocked, with a warning.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::Store;
use crate::{Error, Result};

/// The lock object, under the prefix's scratch folder: never part of a dataset, and cleared
/// with the rest of `imgpack-resume/` by tools that clear it.
pub const LOCK_OBJECT: &str = "imgpack-resume/lock";

/// The variable that sets the stale time in seconds (tests shorten it; renewals come six times
/// as often).
pub const LEASE_ENV: &str = "IMGPACK_STORE_LEASE_SECS";

/// How often a lease is renewed, and how long without a renewal makes it stale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Between two renewals.
    pub renew: Duration,
    /// Without a renewal seen, after which the holder is taken to be gone.
    pub stale: Duration,
}

impl Timing {
    /// 5 s between renewals, stale after 30 s: a run waits at most 5 s to learn that a prefix
    /// is busy and 30 s to take over from a killed run, for one small PUT every 5 s.
    pub const DEFAULT: Timing = Timing { renew: Duration::from_secs(5), stale: Duration::from_secs(30) };

    /// [`Timing::DEFAULT`], or the stale time in [`LEASE_ENV`] with renewals at a sixth of it.
    pub fn from_env() -> Timing {
        Timing::parse(std::env::var(LEASE_ENV).ok().as_deref())
    }

    /// The timing for a stale time of `seconds` (renewals at a sixth of it); the default for
    /// none, or for anything but a positive number.
    fn parse(seconds: Option<&str>) -> Timing {
        seconds.and_then(|v| v.trim().parse::<f64>().ok()).filter(|s| s.is_finite() && *s > 0.0).map_or(
            Timing::DEFAULT,
            |s| Timing { renew: Duration::from_secs_f64(s / 6.0), stale: Duration::from_secs_f64(s) },
        )
    }
}

/// What the lock object holds: who holds the lease, for messages. Never used to decide.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// The holding process.
    pub pid: u32,
    /// Its machine's host name.
    pub host: String,
    /// When it took the lease, in seconds since the Unix epoch (its own clock).
    pub since: u64,
    /// Renewals so far: changes the object's ETag at each one.
    pub renewal: u64,
}

impl Holder {
    fn this_process() -> Holder {
        let since =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Holder { pid: std::process::id(), host: host_name(), since, renewal: 0 }
    }

    /// Whether `other` was written by the same run (a renewal of its own carries the same pid,
    /// host and start; a run that takes the lock over writes its own).
    fn same_run(&self, other: &Holder) -> bool {
        (self.pid, &self.host, self.since) == (other.pid, &other.host, other.since)
    }

    /// "pid 123 on host node07": the holder as messages name it.
    pub fn describe(holder: Option<&Holder>) -> String {
        holder.map_or_else(
            || "a run that did not say who it is".into(),
            |h| format!("pid {} on host {}", h.pid, h.host),
        )
    }
}

/// This machine's host name, as `hostname` prints it.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".into()
    }
}

/// The shared state of a held lease: the renewal thread updates it, the [`Store`]s of the run
/// check it before each write.
#[derive(Debug)]
pub struct Lease {
    store: Store,
    timing: Timing,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    holder: Holder,
    /// The ETag of the object as this run last wrote it.
    e_tag: String,
    /// When that write was acknowledged.
    renewed: Instant,
    /// Why the lease is lost, once it is: no write may follow.
    lost: Option<String>,
}

impl Lease {
    /// Renews now: rewrites the object if it still has the ETag this run wrote. Fails, and
    /// marks the lease lost, if another run has replaced (or deleted) it. A store that does not
    /// answer is no loss: `object_store` has retried already, the next tick tries again, and
    /// the first renewal that reaches the store learns, by the ETag, whether another run took
    /// over meanwhile.
    fn renew(&self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reason) = &state.lost {
            return Err(self.lost_error(reason));
        }
        let mut next = state.holder.clone();
        next.renewal += 1;
        let update = UpdateVersion { e_tag: Some(state.e_tag.clone()), version: None };
        match put(&self.store, &next, PutMode::Update(update), self.timing.stale / 2) {
            Ok(e_tag) => {
                state.holder = next;
                state.e_tag = e_tag;
                state.renewed = Instant::now();
                Ok(())
            }
            Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
                let now = read_holder(&self.store).ok().flatten();
                // Our own write, landed though its answer was lost (a timeout, or a retry of a
                // request the store had applied): still ours, at its new ETag.
                if let Some((h, e_tag)) = now.as_ref().filter(|(h, _)| h.same_run(&state.holder)) {
                    state.holder = h.clone();
                    state.e_tag = e_tag.clone();
                    state.renewed = Instant::now();
                    return Ok(());
                }
                let reason = match now {
                    Some((h, _)) => format!("{} took it over", Holder::describe(Some(&h))),
                    None => "it was deleted".into(),
                };
                state.lost = Some(reason.clone());
                Err(self.lost_error(&reason))
            }
            Err(_) => Ok(()),
        }
    }

    /// Fails if the lease is lost. A lease not renewed for half the stale time (the process
    /// was paused, or the store did not answer) is renewed first, so a run that another one
    /// may have taken over in the meantime learns it before it writes.
    pub fn check(&self) -> Result<()> {
        {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(reason) = &state.lost {
                return Err(self.lost_error(reason));
            }
            if state.renewed.elapsed() < self.timing.stale / 2 {
                return Ok(());
            }
        }
        self.renew()
    }

    fn lost_error(&self, reason: &str) -> Error {
        Error::StoreLockLost { url: self.store.url().object(LOCK_OBJECT), reason: reason.to_string() }
    }
}

/// A held lease on a prefix: renewed by its own thread until dropped, then deleted.
#[derive(Debug)]
pub struct StoreLock {
    lease: Option<Arc<Lease>>,
    stop: Option<mpsc::Sender<()>>,
    renewer: Option<JoinHandle<()>>,
    /// Said to the user: a takeover, or a store that cannot lock.
    pub warning: Option<String>,
}

/// Writes `holder` as the lock object with `mode`; its new ETag. A create is often a run's
/// first request, so it retries only briefly and wrong settings are reported at once; an
/// update (a renewal, a takeover) gives up after `limit`, so a store that does not answer holds
/// neither the writes waiting on the lease nor the end of the run for `object_store`'s minutes
/// of retries (the next renewal tries again).
fn put(store: &Store, holder: &Holder, mode: PutMode, limit: Duration) -> object_store::Result<String> {
    let bytes = serde_json::to_vec(holder).expect("a holder serializes");
    let first = matches!(mode, PutMode::Create);
    let options = PutOptions { mode, ..Default::default() };
    let key = store.key(LOCK_OBJECT);
    let payload = PutPayload::from(bytes);
    let result = if first {
        store.runtime().block_on(store.read().check_client().put_opts(&key, payload, options))
    } else {
        // The timer is made inside the runtime: it needs the runtime's clock.
        let update =
            async { tokio::time::timeout(limit, store.client().put_opts(&key, payload, options)).await };
        store.runtime().block_on(update).unwrap_or_else(|_| {
            Err(object_store::Error::Generic {
                store: "S3",
                source: format!("no answer within {limit:?} to a write of {LOCK_OBJECT}").into(),
            })
        })
    }?;
    Ok(result.e_tag.unwrap_or_default())
}

/// The lock object's holder and ETag, or `None` if there is none. An object that does not
/// parse still has an ETag to watch.
fn read_holder(store: &Store) -> object_store::Result<Option<(Holder, String)>> {
    let key = store.key(LOCK_OBJECT);
    let got = async {
        let got = store.client().get(&key).await?;
        let e_tag = got.meta.e_tag.clone().unwrap_or_default();
        Ok::<_, object_store::Error>((got.bytes().await?, e_tag))
    };
    match store.runtime().block_on(got) {
        Ok((bytes, e_tag)) => {
            let holder = serde_json::from_slice(&bytes).unwrap_or(Holder {
                pid: 0,
                host: "unknown".into(),
                since: 0,
                renewal: 0,
            });
            Ok(Some((holder, e_tag)))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The lock object's ETag, or `None` if there is none: one HEAD.
fn e_tag(store: &Store) -> object_store::Result<Option<String>> {
    match store.runtime().block_on(store.client().head(&store.key(LOCK_OBJECT))) {
        Ok(meta) => Ok(Some(meta.e_tag.unwrap_or_default())),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a store answered a conditional write as a feature it does not have (HTTP 501, or
/// S3's `NotImplemented` code). Nothing looser: a connection error must not pass for it.
fn unsupported(error: &object_store::Error) -> bool {
    let text = error.to_string();
    matches!(error, object_store::Error::NotImplemented { .. })
        || text.contains("501 Not Implemented")
        || text.contains("<Code>NotImplemented</Code>")
}

impl StoreLock {
    /// Takes the lease on `store`'s prefix, waiting out a holder that stopped renewing it;
    /// fails with [`Error::StoreBusy`] if its holder renews it meanwhile, and with
    /// [`Error::Interrupted`] on a stop request (Ctrl-C) during the wait. `waiting` is called
    /// once, with what is being waited for, before a wait.
    pub fn acquire(store: &Store, timing: Timing, waiting: &dyn Fn(&str)) -> Result<StoreLock> {
        let url = store.url().object(LOCK_OBJECT);
        // Often the first request of a run: its errors name the prefix, as a listing's would.
        let failed = |e: object_store::Error| store.error("", "write")(e);
        let mut holder = Holder::this_process();
        let mut warning = None;
        let e_tag = loop {
            match put(store, &holder, PutMode::Create, timing.stale) {
                Ok(e_tag) => break e_tag,
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) if unsupported(&e) => {
                    let warning = format!(
                        "{}: the store does not support conditional writes, so this prefix is not locked: \
                         run one pack at a time on it",
                        store.url()
                    );
                    return Ok(StoreLock { lease: None, stop: None, renewer: None, warning: Some(warning) });
                }
                Err(e) => return Err(failed(e)),
            }
            let Some((other, seen)) = read_holder(store).map_err(failed)? else { continue };
            if other.same_run(&holder) {
                break seen; // our create landed, though its answer was lost and retried
            }
            let since = Instant::now();
            waiting(&format!(
                "{url} is held by {}; waiting up to {:.0} s to see whether it is still renewed",
                Holder::describe(Some(&other)),
                timing.stale.as_secs_f64()
            ));
            let poll = (timing.renew / 2).max(Duration::from_millis(50));
            let outcome = loop {
                std::thread::sleep(poll);
                // Ctrl-C while waiting: nothing was written yet, so stop now.
                if crate::interrupt::requested() {
                    return Err(Error::Interrupted { temp: store.url().to_string().into(), kept: None });
                }
                match e_tag(store).map_err(failed)? {
                    None => break None, // released meanwhile: create it again
                    Some(now) if now != seen => {
                        return Err(Error::StoreBusy {
                            url: store.url().to_string(),
                            lock: url,
                            holder: Holder::describe(Some(&other)),
                            renew: timing.renew,
                            stale: timing.stale,
                        });
                    }
                    Some(_) if since.elapsed() >= timing.stale => break Some(seen.clone()),
                    Some(_) => {}
                }
            };
            let Some(stale) = outcome else { continue };
            let update = UpdateVersion { e_tag: Some(stale), version: None };
            match put(store, &holder, PutMode::Update(update), timing.stale) {
                Ok(e_tag) => {
                    warning = Some(format!(
                        "took over the lock {url} from {}, which had not renewed it for {:.0} s (a run that was \
                         killed or lost its machine); what it left is resumed or cleared as usual",
                        Holder::describe(Some(&other)),
                        timing.stale.as_secs_f64()
                    ));
                    break e_tag;
                }
                // Another waiting run took it first, or the holder came back: it is busy.
                Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
                    let now = read_holder(store).ok().flatten().map(|(h, _)| h);
                    return Err(Error::StoreBusy {
                        url: store.url().to_string(),
                        lock: url,
                        holder: Holder::describe(now.as_ref()),
                        renew: timing.renew,
                        stale: timing.stale,
                    });
                }
                Err(e) => return Err(failed(e)),
            }
        };
        holder.renewal = 0;
        let state = State { holder, e_tag, renewed: Instant::now(), lost: None };
        let lease = Arc::new(Lease { store: store.clone(), timing, state: Mutex::new(state) });
        let (stop, stopped) = mpsc::channel::<()>();
        let renewing = Arc::clone(&lease);
        let renewer = std::thread::Builder::new()
            .name("imgpack-lease".into())
            .spawn(move || loop {
                match stopped.recv_timeout(renewing.timing.renew) {
                    Err(RecvTimeoutError::Timeout) => {
                        if renewing.renew().is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            })
            .map_err(|e| Error::Threads { threads: 1, reason: e.to_string() })?;
        Ok(StoreLock { lease: Some(lease), stop: Some(stop), renewer: Some(renewer), warning })
    }

    /// The lease, for the run's [`Store`]s to check (none if the store cannot lock).
    pub fn lease(&self) -> Option<Arc<Lease>> {
        self.lease.clone()
    }
}

impl Drop for StoreLock {
    /// Stops renewing and deletes the lock object, unless the lease was lost (it is another
    /// run's object now).
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
        if let Some(lease) = self.lease.take() {
            if lease.check().is_ok() {
                let store = &lease.store;
                let _ = store.runtime().block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(10),
                        store.client().delete(&store.key(LOCK_OBJECT)),
                    )
                    .await
                });
            }
        }
    }
}

impl Store {
    /// This store, writing under `lock`'s lease: every write checks it first.
    pub fn under(mut self, lock: &StoreLock) -> Store {
        self.lease = lock.lease();
        self
    }

    /// Fails if this store writes under a lease that is lost: another run owns the prefix now
    /// ([`Lease::check`]).
    pub fn guard(&self) -> Result<()> {
        self.lease.as_ref().map_or(Ok(()), |lease| lease.check())
    }

    /// Renews the lease now and fails if it is lost: called just before the write that makes
    /// the prefix a dataset, so a run taken over while it was cut off never publishes.
    pub fn confirm_lease(&self) -> Result<()> {
        self.lease.as_ref().map_or(Ok(()), |lease| lease.renew())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_time_comes_from_the_environment_with_renewals_six_times_as_often() {
        assert_eq!(Timing::DEFAULT.renew * 6, Timing::DEFAULT.stale);
        let three = Timing { renew: Duration::from_millis(500), stale: Duration::from_secs(3) };
        assert_eq!(Timing::parse(Some(" 3 ")), three);
        for bad in [None, Some("nonsense"), Some("0"), Some("-2"), Some("inf")] {
            assert_eq!(Timing::parse(bad), Timing::DEFAULT, "{bad:?}");
        }
    }

    #[test]
    fn only_a_501_or_not_implemented_reads_as_a_store_without_conditional_writes() {
        let generic =
            |text: &str| object_store::Error::Generic { store: "S3", source: text.to_string().into() };
        assert!(unsupported(&generic("Server returned non-2xx status code: 501 Not Implemented: ")));
        assert!(unsupported(&generic(
            "<Error><Code>NotImplemented</Code><Message>If-None-Match</Message></Error>"
        )));
        // A port with 501 in it, a refused connection, a precondition: not "unsupported".
        assert!(!unsupported(&generic(
            "error sending request for url (http://127.0.0.1:35012/b/x): Connection refused"
        )));
        assert!(!unsupported(&generic("Server returned non-2xx status code: 412 Precondition Failed")));
    }

    #[test]
    fn a_renewal_is_the_same_run_and_a_takeover_is_not() {
        let ours = Holder::this_process();
        let renewed = Holder { renewal: 7, ..ours.clone() };
        assert!(ours.same_run(&renewed));
        for other in [
            Holder { pid: ours.pid + 1, ..ours.clone() },
            Holder { host: "elsewhere".into(), ..ours.clone() },
            Holder { since: ours.since + 1, ..ours.clone() },
        ] {
            assert!(!ours.same_run(&other), "{other:?}");
        }
    }

    #[test]
    fn a_holder_is_named_by_pid_and_host() {
        let holder = Holder::this_process();
        assert_eq!(holder.pid, std::process::id());
        assert!(!holder.host.is_empty() && holder.host != "unknown", "{holder:?}");
        assert_eq!(Holder::describe(Some(&holder)), format!("pid {} on host {}", holder.pid, holder.host));
    }
}
