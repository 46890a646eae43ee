//! A small persistent thread pool with an allocation-free `parallel_for`.
//!
//! Workers sleep on a condvar between jobs (after a short spin, so back-to-back decode
//! matmuls do not pay a wake-up each). A job is a borrowed closure called once per chunk
//! index; chunks are claimed dynamically from an atomic counter by the workers and the
//! calling thread together.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

/// Spin iterations before a waiting thread blocks on a condvar.
const SPIN: usize = 1 << 14;

thread_local! {
    static IN_WORKER: Cell<bool> = const { Cell::new(false) };
}

type JobFn<'a> = dyn Fn(usize, usize) + Sync + 'a;

#[derive(Clone, Copy)]
struct JobPtr(*const JobFn<'static>);
// SAFETY: the pointee is `Sync` and `parallel_for` keeps it alive until every worker
// has finished with it, so sending the pointer to workers is sound.
unsafe impl Send for JobPtr {}

struct Slot {
    job: Option<JobPtr>,
    shutdown: bool,
}

struct Shared {
    slot: Mutex<Slot>,
    wake: Condvar,
    generation: AtomicUsize,
    next_chunk: AtomicUsize,
    n_chunks: AtomicUsize,
    active: AtomicUsize,
    /// Workers blocked on `wake` (changed only under `slot`'s lock): a job wakes them with a
    /// system call only when there are any, not after every spin that caught it.
    sleeping: AtomicUsize,
    done: Mutex<()>,
    done_cv: Condvar,
    /// The caller blocked on `done_cv` (changed only under `done`'s lock): the last worker out
    /// wakes it only then.
    caller_sleeping: AtomicBool,
    panicked: AtomicBool,
}

/// A fixed set of worker threads that run `parallel_for` jobs.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    call_lock: Mutex<()>,
}

impl ThreadPool {
    /// Creates a pool using `n_threads` threads in total (the caller counts as one).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot {
                job: None,
                shutdown: false,
            }),
            wake: Condvar::new(),
            generation: AtomicUsize::new(0),
            next_chunk: AtomicUsize::new(0),
            n_chunks: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            done: Mutex::new(()),
            done_cv: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("berth-worker-{i}"))
                    .spawn(move || worker_loop(&s, i))
                    .expect("spawn worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            call_lock: Mutex::new(()),
        }
    }

    /// Total threads used by `parallel_for` (workers plus the caller).
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `f(i)` for every `i` in `0..n_chunks`, spread over the pool; returns when all
    /// calls are done. Nested calls from inside a job run serially on the calling worker.
    pub fn parallel_for<F: Fn(usize) + Sync>(&self, n_chunks: usize, f: F) {
        self.parallel_for_indexed(n_chunks, |i, _| f(i));
    }

    /// Like [`ThreadPool::parallel_for`], but also passes the index (`< n_threads()`) of the
    /// thread running the chunk, so callers can give each thread its own scratch space.
    /// Calls running at the same time within one job always get distinct thread indices.
    pub fn parallel_for_indexed<F: Fn(usize, usize) + Sync>(&self, n_chunks: usize, f: F) {
        if n_chunks == 0 {
            return;
        }
        if self.workers.is_empty() || n_chunks == 1 || IN_WORKER.with(|w| w.get()) {
            (0..n_chunks).for_each(|i| f(i, 0));
            return;
        }
        let _serial = self.call_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let fref: &JobFn<'_> = &f;
        // SAFETY: only the lifetime is erased. The pointer is cleared from the slot and
        // every worker has signalled completion (active == 0) before this function
        // returns or unwinds, so the closure outlives every use.
        let job = JobPtr(unsafe { std::mem::transmute::<*const JobFn<'_>, *const JobFn<'static>>(fref) });
        s.next_chunk.store(0, Ordering::Relaxed);
        s.n_chunks.store(n_chunks, Ordering::Relaxed);
        s.panicked.store(false, Ordering::Relaxed);
        let sleeping = {
            let mut slot = s.slot.lock().unwrap_or_else(|e| e.into_inner());
            slot.job = Some(job);
            s.generation.fetch_add(1, Ordering::Release);
            // A worker counts itself asleep under this lock before it checks the generation,
            // so one that missed this job's generation is counted here.
            s.sleeping.load(Ordering::Relaxed)
        };
        if sleeping > 0 {
            s.wake.notify_all();
        }
        // Mark this thread as inside a job so nested parallel_for calls run inline
        // instead of re-taking `call_lock`.
        IN_WORKER.with(|w| w.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| run_chunks(s, &f, 0)));
        IN_WORKER.with(|w| w.set(false));
        // Every chunk is claimed: close the job so workers that have not picked it up yet
        // (descheduled on a busy machine) skip it, then wait only for those that joined.
        s.slot.lock().unwrap_or_else(|e| e.into_inner()).job = None;
        let mut spins = 0;
        while s.active.load(Ordering::Acquire) != 0 && spins < SPIN {
            spin_pause(spins);
            spins += 1;
        }
        if s.active.load(Ordering::Acquire) != 0 {
            let mut g = s.done.lock().unwrap_or_else(|e| e.into_inner());
            s.caller_sleeping.store(true, Ordering::Relaxed);
            while s.active.load(Ordering::Acquire) != 0 {
                g = s.done_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.caller_sleeping.store(false, Ordering::Relaxed);
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a parallel_for job panicked on a worker thread");
        }
    }
}

impl ThreadPool {
    /// Calls `f(i, piece)` for each consecutive `piece_len`-long piece `i` of `data` (the last
    /// may be shorter), spread over the pool like [`ThreadPool::parallel_for`].
    pub fn parallel_chunks_mut<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        data: &mut [T],
        piece_len: usize,
        f: F,
    ) {
        assert!(piece_len > 0, "pieces must be non-empty");
        let len = data.len();
        let n = len.div_ceil(piece_len);
        struct Base<T>(*mut T);
        // SAFETY: pieces are disjoint ranges of `data`, which stays mutably borrowed for the
        // whole call; each index (hence each piece) is handed to exactly one call of `f`.
        unsafe impl<T: Send> Sync for Base<T> {}
        let base = Base(data.as_mut_ptr());
        self.parallel_for(n, |i| {
            let base = &base;
            let start = i * piece_len;
            let end = (start + piece_len).min(len);
            // SAFETY: start < end <= len, so the range lies inside `data`; it is disjoint from
            // every other piece and no other reference to it exists during this call.
            let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
            f(i, piece);
        });
    }
}

/// One step of a spin-wait; yields the CPU now and then in case cores are oversubscribed.
#[inline]
fn spin_pause(i: usize) {
    if i % 256 == 255 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

fn run_chunks(s: &Shared, f: &JobFn<'_>, thread: usize) {
    let n = s.n_chunks.load(Ordering::Relaxed);
    loop {
        let i = s.next_chunk.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        f(i, thread);
    }
}

fn worker_loop(s: &Shared, index: usize) {
    IN_WORKER.with(|w| w.set(true));
    let mut seen = 0usize;
    loop {
        let mut spins = 0;
        while s.generation.load(Ordering::Acquire) == seen && spins < SPIN {
            spin_pause(spins);
            spins += 1;
        }
        let job = {
            let mut slot = s.slot.lock().unwrap_or_else(|e| e.into_inner());
            while s.generation.load(Ordering::Acquire) == seen && !slot.shutdown {
                s.sleeping.fetch_add(1, Ordering::Relaxed);
                slot = s.wake.wait(slot).unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_sub(1, Ordering::Relaxed);
            }
            if slot.shutdown {
                return;
            }
            seen = s.generation.load(Ordering::Acquire);
            // Join under the slot lock, so the caller (which closes the job under the same
            // lock) waits for exactly the workers that joined.
            match slot.job {
                Some(job) => {
                    s.active.fetch_add(1, Ordering::AcqRel);
                    job
                }
                None => continue,
            }
        };
        // SAFETY: this worker joined (incremented `active`) while the job was open, and the
        // caller of parallel_for keeps the closure alive until `active` is back to zero,
        // which happens only after this worker's decrement below.
        let f = unsafe { &*job.0 };
        if catch_unwind(AssertUnwindSafe(|| run_chunks(s, f, index))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        if s.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the lock: the caller marks itself asleep and checks `active` under it too,
            // so either it sees zero or it is marked by now.
            let _g = s.done.lock().unwrap_or_else(|e| e.into_inner());
            if s.caller_sleeping.load(Ordering::Relaxed) {
                s.done_cv.notify_all();
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared
            .slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown = true;
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Threads to use by default: `BERTH_THREADS` if set and valid, else available parallelism.
pub fn default_threads() -> usize {
    std::env::var("BERTH_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The process-wide pool, created on first use with [`default_threads`] threads.
pub fn global() -> &'static ThreadPool {
    static POOL: OnceLock<ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| ThreadPool::new(default_threads()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_chunk_once() {
        let pool = ThreadPool::new(4);
        for n in [0usize, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.parallel_for(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
        }
    }

    #[test]
    fn many_small_jobs_and_nesting() {
        let pool = ThreadPool::new(3);
        let total = AtomicUsize::new(0);
        for _ in 0..300 {
            pool.parallel_for(5, |_| {
                pool.parallel_for(2, |_| {
                    total.fetch_add(1, Ordering::Relaxed);
                });
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 300 * 10);
    }

    #[test]
    fn worker_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(64, |i| {
                if i == 63 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.parallel_for(10, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn thread_indices_are_distinct_and_in_range() {
        let pool = ThreadPool::new(4);
        let busy: Vec<AtomicBool> = (0..4).map(|_| AtomicBool::new(false)).collect();
        let done = AtomicUsize::new(0);
        pool.parallel_for_indexed(200, |_, t| {
            assert!(t < pool.n_threads());
            assert!(
                !busy[t].swap(true, Ordering::SeqCst),
                "index {t} used twice at once"
            );
            std::hint::black_box((0..1000).sum::<usize>());
            busy[t].store(false, Ordering::SeqCst);
            done.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(done.load(Ordering::Relaxed), 200);
    }

    #[test]
    fn chunks_mut_cover_the_slice() {
        let pool = ThreadPool::new(3);
        let mut v = vec![0usize; 103];
        pool.parallel_chunks_mut(&mut v, 10, |i, piece| {
            assert!(piece.len() == 10 || (i == 10 && piece.len() == 3));
            piece.iter_mut().enumerate().for_each(|(j, x)| *x = i * 10 + j);
        });
        assert!(v.iter().enumerate().all(|(i, &x)| i == x));
    }

    #[test]
    fn single_thread_pool() {
        let pool = ThreadPool::new(1);
        assert_eq!(pool.n_threads(), 1);
        let count = AtomicUsize::new(0);
        pool.parallel_for(7, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 7);
    }
}
