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
//! caller computes one half itself, and only the other worker is woken.

use rayon::ThreadPoolBuildError;

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
        builder.use_current_thread().build_global()
    } else {
        builder.build_global()
    }
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
    use rayon::prelude::*;

    /// A pool built the way [`super::init_pool`] builds the global one (the global pool itself
    /// can be built once per process, and the test binary's threads are not `main`): the
    /// building thread is worker 0, splits from it run on both workers, and a job queued from
    /// another thread while worker 0 is busy elsewhere still runs.
    #[test]
    fn the_calling_thread_is_worker_zero() {
        let caller = std::thread::spawn(|| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .use_current_thread()
                .build()
                .unwrap();
            assert_eq!(pool.current_thread_index(), Some(0));
            let workers: std::collections::BTreeSet<usize> = pool.install(|| {
                (0..64)
                    .into_par_iter()
                    .map(|_| {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        rayon::current_thread_index().unwrap()
                    })
                    .collect()
            });
            assert_eq!(workers.into_iter().collect::<Vec<_>>(), vec![0, 1]);
            // Worker 0 blocks on a channel; a job queued from another thread runs on worker 1.
            let pool = std::sync::Arc::new(pool);
            let (tx, rx) = std::sync::mpsc::channel();
            let p = pool.clone();
            let other = std::thread::spawn(move || {
                let v = p.install(|| (0..1000u64).into_par_iter().sum::<u64>());
                tx.send(v).unwrap();
            });
            assert_eq!(rx.recv().unwrap(), 499_500);
            other.join().unwrap();
        });
        caller.join().unwrap();
    }

    #[test]
    fn default_threads_is_positive() {
        assert!(super::default_threads() >= 1);
    }
}
