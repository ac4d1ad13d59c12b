//! The thread pool the kernels run on.
//!
//! Every kernel splits its work with rayon. Called from a thread outside rayon's pool (a
//! program's `main`), each split is a cold injection: the job is queued, a sleeping worker is
//! woken, and the caller sleeps until a second wake-up brings the result back: two futex round
//! trips per op. A batch-1 BERT forward pass runs about fifteen such ops a layer, each a few tens
//! of microseconds of work, so the hand-offs were a sixth of its time (student, 64 tokens, Xeon
//! VM, 2 threads: 6.4 ms on a pool beside `main`, 5.4-5.6 ms with `main` inside it).
//! [`init_pool`] makes the calling thread worker 0 of rayon's global pool, as OpenMP makes the
//! main thread its thread 0 (PyTorch's configuration): a split is then a local `join`, the
//! caller computes one half itself, and only the other worker is woken. And the workers are
//! kept awake between a pass's products ([`keep_warm`]), as OpenMP keeps its own: the same
//! forward pass then took 3.6-3.7 ms (PyTorch: 4.3).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use rayon::{ThreadPoolBuildError, Yield};

/// Threads of the pool [`init_pool`] built with the caller as worker 0 (0: none; the workers
/// are kept warm only then).
static WARM: AtomicUsize = AtomicUsize::new(0);
/// Whether spinners run (or are queued) on the background workers.
static SPINNING: AtomicBool = AtomicBool::new(false);
/// Spinners still running.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// When a product last asked for warm workers ([`keep_warm`]), in [`now_ns`] nanoseconds.
static LAST_ASK: AtomicU64 = AtomicU64::new(0);

/// How long a spinner goes on without work and without a product asking: longer than the gaps
/// between a forward pass's products, short enough not to matter to an idle process.
const IDLE_NS: u64 = 2_000_000;

/// Build rayon's global pool with the calling thread as its worker 0 (call it first thing from
/// `main`, before any kernel runs) and `threads - 1` background workers. `threads`: `None` reads
/// `RAYON_NUM_THREADS`, else one thread per logical CPU.
///
/// With one thread the pool keeps its one background worker instead: a pool whose only worker
/// is a thread that also blocks on other things (a channel, a device's worker) would leave jobs
/// queued from elsewhere with nobody to run them.
///
/// Errors when the global pool was already built (a kernel ran before, or a second call).
pub fn init_pool(threads: Option<usize>) -> Result<(), ThreadPoolBuildError> {
    let n = threads.filter(|&n| n > 0).unwrap_or_else(default_threads);
    let builder = rayon::ThreadPoolBuilder::new().num_threads(n);
    if n >= 2 {
        builder.use_current_thread().build_global()?;
        WARM.store(n, Ordering::Relaxed);
        Ok(())
    } else {
        builder.build_global()
    }
}

/// Keep the background workers awake for the next few milliseconds (the products call it).
///
/// A rayon worker that finds no work yields for a few tens of microseconds, then sleeps on a
/// futex; the next split wakes it (on a VM an inter-processor interrupt), and the caller, done
/// with its half, waits for the late one. Between the ops of a batch-1 forward pass the workers
/// fell asleep every time: a seventh of its samples were wake-ups. As OpenMP's workers spin for
/// a while (`KMP_BLOCKTIME`, 200 ms), after a product asks each background worker runs a
/// spinner: a job that takes pending work ([`rayon::yield_now`]: a split's stolen half, a job
/// queued from another thread) until it has found none and no product has asked for
/// [`IDLE_NS`], then returns, and the worker sleeps as before. Only on a pool [`init_pool`] built
/// with two threads or more.
pub(crate) fn keep_warm() {
    // Only for that pool (a product run inside another pool, as some tests do, would queue
    // the spinners there).
    let threads = WARM.load(Ordering::Relaxed);
    if threads == 0 || rayon::current_num_threads() != threads {
        return;
    }
    LAST_ASK.store(now_ns(), Ordering::Relaxed);
    if SPINNING.load(Ordering::Relaxed)
        || SPINNING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    LIVE.store(threads - 1, Ordering::Release);
    // One job per worker; worker 0 (the caller) returns at once whenever it picks its copy up.
    rayon::spawn_broadcast(|ctx| {
        if ctx.index() != 0 {
            spin();
        }
    });
}

/// A background worker's spinner (see [`keep_warm`]).
fn spin() {
    let mut last_job = now_ns();
    loop {
        if rayon::yield_now() == Some(Yield::Executed) {
            last_job = now_ns();
            continue;
        }
        let recent = last_job.max(LAST_ASK.load(Ordering::Relaxed));
        if now_ns().saturating_sub(recent) > IDLE_NS {
            break;
        }
        // A system call rather than a pause: on a busy machine (several processes, more
        // threads than cores) the scheduler runs another thread meanwhile.
        std::thread::yield_now();
    }
    if LIVE.fetch_sub(1, Ordering::AcqRel) == 1 {
        SPINNING.store(false, Ordering::Release);
    }
}

/// Nanoseconds since the first call.
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// `RAYON_NUM_THREADS` when set to a positive number, else the logical CPUs.
fn default_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::time::Duration;

    /// A pool built the way [`init_pool`] builds the global one (the global pool can be built
    /// once per process, and a test's thread is not `main`), its background worker spinning as
    /// [`keep_warm`] starts it: the building thread is worker 0, its splits run on both workers,
    /// a job queued from another thread while worker 0 blocks on a channel runs, and the
    /// spinner stops once idle for [`IDLE_NS`].
    #[test]
    fn the_caller_is_worker_zero_and_the_spinner_stops_when_idle() {
        let caller = std::thread::spawn(|| {
            let pool = std::sync::Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(2)
                    .use_current_thread()
                    .build()
                    .unwrap(),
            );
            assert_eq!(pool.current_thread_index(), Some(0));
            SPINNING.store(true, Ordering::Release);
            LIVE.store(1, Ordering::Release);
            pool.spawn_broadcast(|ctx| {
                if ctx.index() != 0 {
                    spin();
                }
            });
            let workers: std::collections::BTreeSet<usize> = pool.install(|| {
                (0..64)
                    .into_par_iter()
                    .map(|_| {
                        std::thread::sleep(Duration::from_millis(1));
                        rayon::current_thread_index().unwrap()
                    })
                    .collect()
            });
            assert_eq!(workers.into_iter().collect::<Vec<_>>(), vec![0, 1]);
            let (tx, rx) = std::sync::mpsc::channel();
            let p = pool.clone();
            let other = std::thread::spawn(move || {
                let v = p.install(|| (0..1000u64).into_par_iter().sum::<u64>());
                tx.send(v).unwrap();
            });
            assert_eq!(rx.recv().unwrap(), 499_500);
            other.join().unwrap();
            let t = std::time::Instant::now();
            while SPINNING.load(Ordering::Acquire) {
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "the spinner never stopped"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(LIVE.load(Ordering::Acquire), 0);
        });
        caller.join().unwrap();
    }
}
