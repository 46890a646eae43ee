//! Cost of one `parallel_for` over the pool, the decode step's unit of synchronisation:
//! `poolbench [THREADS] [WORK_NS]` times 200,000 jobs of THREADS chunks, each chunk busy for
//! WORK_NS nanoseconds (default 0: the bare hand-over).
use berth_kernels::pool::ThreadPool;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let work = Duration::from_nanos(args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0));
    let pool = ThreadPool::new(threads);
    let jobs = 200_000;
    for _ in 0..1000 {
        pool.parallel_for(threads, |_| {});
    }
    let t0 = Instant::now();
    for _ in 0..jobs {
        pool.parallel_for(threads, |_| {
            let t = Instant::now();
            while t.elapsed() < work {
                std::hint::spin_loop();
            }
        });
    }
    let per = t0.elapsed().as_secs_f64() / jobs as f64;
    println!(
        "threads={threads} work={} ns: {:.2} us per parallel_for",
        work.as_nanos(),
        per * 1e6
    );
}
