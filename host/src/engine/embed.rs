//! Embedding jobs on the engine: the inputs of every queued request are packed into shared
//! plugin `embed` calls (up to the model's sequences per call and [`EMBED_BATCH_TOKENS`] rows), so
//! many small requests cost a few forward passes, and one large request is split across several.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::metrics::Metrics;
use crate::models::LoadedModel;
use std::sync::atomic::Ordering::Relaxed;

/// Rows (tokens) per plugin `embed` call, at most: enough rows for the matrix kernels to run at
/// full speed, few enough that the activations of one call stay around a hundred megabytes for a
/// 768-wide model. A single longer input still runs alone.
pub const EMBED_BATCH_TOKENS: usize = 4096;

/// What an embedding request gets back.
#[derive(Debug)]
pub struct Embedded {
    /// One vector per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens embedded (all inputs).
    pub tokens: usize,
    /// Time from the job's arrival on the engine to its last vector.
    pub duration: Duration,
}

/// One request's inputs, as token ids, waiting for or part way through embedding.
pub struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    /// Inputs handed to a plugin call so far (they are taken in order).
    taken: usize,
    vectors: Vec<Option<Vec<f32>>>,
    queued: Instant,
    reply: Option<oneshot::Sender<Result<Embedded, String>>>,
}

impl EmbedJob {
    /// A job for `inputs` (none empty) and the channel its answer goes to.
    pub fn new(inputs: Vec<Vec<u32>>) -> (EmbedJob, oneshot::Receiver<Result<Embedded, String>>) {
        let (tx, rx) = oneshot::channel();
        let n = inputs.len();
        let job = EmbedJob {
            inputs,
            taken: 0,
            vectors: vec![None; n],
            queued: Instant::now(),
            reply: Some(tx),
        };
        (job, rx)
    }

    fn cancelled(&self) -> bool {
        self.reply.as_ref().is_none_or(|r| r.is_closed())
    }

    fn finish(&mut self, result: Result<Embedded, String>) {
        if let Some(tx) = self.reply.take() {
            let _ = tx.send(result);
        }
    }
}

/// Which inputs one plugin call takes: `(job, input)` pairs from the front of the queue, in
/// order, while they fit `max_seqs` sequences and `budget` rows (the first always goes).
fn plan(jobs: &VecDeque<EmbedJob>, max_seqs: usize, budget: usize) -> Vec<(usize, usize)> {
    let mut picked = Vec::new();
    let mut rows = 0;
    for (j, job) in jobs.iter().enumerate() {
        for i in job.taken..job.inputs.len() {
            let len = job.inputs[i].len();
            if picked.len() == max_seqs || (!picked.is_empty() && rows + len > budget) {
                return picked;
            }
            rows += len;
            picked.push((j, i));
        }
    }
    picked
}

/// Runs one shared plugin call over the queue's next inputs and answers the jobs it completes;
/// a failed call fails every job it held an input of. Cancelled jobs are dropped first.
pub fn run_batch(model: &mut LoadedModel, jobs: &mut VecDeque<EmbedJob>, metrics: &Metrics) {
    jobs.retain(|j| !j.cancelled());
    let max_seqs = model.description().max_sequences.max(1) as usize;
    let picked = plan(jobs, max_seqs, EMBED_BATCH_TOKENS);
    if picked.is_empty() {
        return;
    }
    let seqs: Vec<Vec<i32>> = picked
        .iter()
        .map(|&(j, i)| jobs[j].inputs[i].iter().map(|&t| t as i32).collect())
        .collect();
    let views: Vec<&[i32]> = seqs.iter().map(Vec::as_slice).collect();
    let result = model.instance().and_then(|inst| inst.embed(&views));
    metrics.embed_calls.fetch_add(1, Relaxed);
    if result.is_ok() {
        metrics.embedded_inputs.fetch_add(seqs.len() as u64, Relaxed);
        let tokens: usize = seqs.iter().map(Vec::len).sum();
        metrics.embedded_tokens.fetch_add(tokens as u64, Relaxed);
    }
    match result {
        Ok(vectors) => {
            for (&(j, i), v) in picked.iter().zip(vectors) {
                jobs[j].vectors[i] = Some(v);
                jobs[j].taken = jobs[j].taken.max(i + 1);
            }
        }
        Err(e) => {
            let message = format!("embedding failed: {}", e.message);
            for &(j, _) in &picked {
                jobs[j].finish(Err(message.clone()));
            }
        }
    }
    for job in jobs.iter_mut() {
        if job.reply.is_some() && job.vectors.iter().all(Option::is_some) {
            let vectors: Vec<Vec<f32>> = job
                .vectors
                .iter_mut()
                .map(|v| v.take().unwrap_or_default())
                .collect();
            let tokens = job.inputs.iter().map(Vec::len).sum();
            let duration = job.queued.elapsed();
            job.finish(Ok(Embedded {
                vectors,
                tokens,
                duration,
            }));
        }
    }
    jobs.retain(|j| j.reply.is_some());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(lens: &[&[usize]]) -> VecDeque<EmbedJob> {
        lens.iter()
            .map(|ls| EmbedJob::new(ls.iter().map(|&n| vec![1; n]).collect()).0)
            .collect()
    }

    #[test]
    fn a_call_packs_inputs_of_several_jobs_within_the_sequence_and_row_limits() {
        let q = jobs(&[&[3, 4], &[5], &[2, 2]]);
        assert_eq!(plan(&q, 8, 100), vec![(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]);
        assert_eq!(plan(&q, 3, 100), vec![(0, 0), (0, 1), (1, 0)]);
        assert_eq!(plan(&q, 8, 12), vec![(0, 0), (0, 1), (1, 0)]);
        // An input longer than the budget still runs, alone.
        let long = jobs(&[&[50], &[1]]);
        assert_eq!(plan(&long, 8, 10), vec![(0, 0)]);
        let mut partly = jobs(&[&[3, 4]]);
        partly[0].taken = 1;
        assert_eq!(plan(&partly, 8, 100), vec![(0, 1)]);
    }
}
