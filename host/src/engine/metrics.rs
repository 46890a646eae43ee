//! Server-wide counters and gauges, written by the engines and the HTTP layer and rendered in
//! Prometheus' text format for `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// A scheduler's share of [`Metrics::kv_used`] and [`Metrics::kv_capacity`]; what it reported
/// is taken back when it is dropped (the model unloads, or its thread unwinds).
pub struct KvGauge {
    metrics: std::sync::Arc<Metrics>,
    used: i64,
    capacity: i64,
}

impl KvGauge {
    /// A gauge reporting nothing yet.
    pub fn new(metrics: std::sync::Arc<Metrics>) -> KvGauge {
        KvGauge {
            metrics,
            used: 0,
            capacity: 0,
        }
    }

    /// Reports `used` rows held of `capacity`.
    pub fn set(&mut self, used: usize, capacity: usize) {
        let (used, capacity) = (used as i64, capacity as i64);
        self.metrics.kv_used.fetch_add(used - self.used, Relaxed);
        self.metrics
            .kv_capacity
            .fetch_add(capacity - self.capacity, Relaxed);
        (self.used, self.capacity) = (used, capacity);
    }
}

impl Drop for KvGauge {
    fn drop(&mut self) {
        self.set(0, 0);
    }
}

/// Upper bounds (seconds) of the time-to-first-token histogram buckets.
const TTFT_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Everything `/metrics` reports.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Prompt tokens processed (after prefix reuse).
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens reused from a slot's cache.
    pub cached_tokens: AtomicU64,
    /// Prompts whose reused prefix was forked from a running sequence.
    pub prefix_forks: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Tokens drafted by prompt-lookup speculation.
    pub draft_tokens: AtomicU64,
    /// Drafted tokens the model's own picks confirmed.
    pub accepted_draft_tokens: AtomicU64,
    /// Requests waiting for a slot, over all models.
    pub queue_depth: AtomicI64,
    /// Sequences holding a slot, over all models.
    pub active_sequences: AtomicI64,
    /// Models loaded.
    pub loaded_models: AtomicI64,
    /// Requests waiting for a model that another request is loading.
    pub load_waiters: AtomicI64,
    /// KV-cache rows held by running sequences, over all models.
    pub kv_used: AtomicI64,
    /// KV-cache rows the loaded models' sequence slots can hold (slots × context), over all models.
    pub kv_capacity: AtomicI64,
    /// Decode steps run.
    pub decode_steps: AtomicU64,
    /// Decode steps whose batch carried rows of more than one sequence (proof of batching).
    pub batched_decode_steps: AtomicU64,
    /// The most sequences one decode step has carried since start.
    pub peak_batch_sequences: AtomicU64,
    /// Microseconds spent in plugin decode calls.
    pub decode_micros: AtomicU64,
    /// Plugin `embed` calls run (each shared by the inputs of any number of requests).
    pub embed_calls: AtomicU64,
    /// Inputs embedded.
    pub embedded_inputs: AtomicU64,
    /// Tokens embedded.
    pub embedded_tokens: AtomicU64,
    ttft: Mutex<Histogram>,
}

#[derive(Default)]
struct Histogram {
    buckets: [u64; TTFT_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Metrics {
    /// Counts one finished HTTP request by route and status.
    pub fn request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route.to_string(), status)).or_default() += 1;
    }

    /// Counts one decode step that carried `sequences` distinct sequences.
    pub fn decode_step(&self, sequences: usize) {
        self.decode_steps.fetch_add(1, Relaxed);
        if sequences > 1 {
            self.batched_decode_steps.fetch_add(1, Relaxed);
        }
        self.peak_batch_sequences.fetch_max(sequences as u64, Relaxed);
    }

    /// Records one time to first token.
    pub fn ttft(&self, d: Duration) {
        let s = d.as_secs_f64();
        let mut h = self.ttft.lock().unwrap_or_else(|e| e.into_inner());
        for (b, &le) in h.buckets.iter_mut().zip(&TTFT_BUCKETS) {
            if s <= le {
                *b += 1;
            }
        }
        h.count += 1;
        h.sum += s;
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::new();
        o.push_str("# HELP berth_requests_total HTTP requests by route and status.\n# TYPE berth_requests_total counter\n");
        for ((route, status), n) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                o,
                "berth_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |o: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut o,
            "berth_prompt_tokens_total",
            "Prompt tokens processed.",
            self.prompt_tokens.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_cached_prompt_tokens_total",
            "Prompt tokens reused from the KV cache.",
            self.cached_tokens.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_prefix_forks_total",
            "Prompts whose cached prefix was forked from a running sequence.",
            self.prefix_forks.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_generated_tokens_total",
            "Tokens generated.",
            self.generated_tokens.load(Relaxed),
        );
        let (drafted, accepted) = (
            self.draft_tokens.load(Relaxed),
            self.accepted_draft_tokens.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_speculative_draft_tokens_total",
            "Tokens drafted by prompt-lookup speculation.",
            drafted,
        );
        counter(
            &mut o,
            "berth_speculative_accepted_tokens_total",
            "Drafted tokens confirmed by the model.",
            accepted,
        );
        gauge(
            &mut o,
            "berth_speculative_acceptance_rate",
            "Share of drafted tokens confirmed (0 before any draft).",
            if drafted > 0 {
                accepted as f64 / drafted as f64
            } else {
                0.0
            },
        );
        counter(
            &mut o,
            "berth_embed_calls_total",
            "Plugin embed calls (each shared by the inputs of any number of requests).",
            self.embed_calls.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_embedded_inputs_total",
            "Inputs embedded.",
            self.embedded_inputs.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_embedded_tokens_total",
            "Tokens embedded.",
            self.embedded_tokens.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_decode_steps_total",
            "Batched plugin decode steps.",
            self.decode_steps.load(Relaxed),
        );
        counter(
            &mut o,
            "berth_batched_decode_steps_total",
            "Decode steps whose batch carried more than one sequence.",
            self.batched_decode_steps.load(Relaxed),
        );
        gauge(
            &mut o,
            "berth_peak_batch_sequences",
            "The most sequences one decode step has carried since start.",
            self.peak_batch_sequences.load(Relaxed) as f64,
        );
        let secs = self.decode_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(o, "# HELP berth_decode_seconds_total Time in plugin decode calls.\n# TYPE berth_decode_seconds_total counter\nberth_decode_seconds_total {secs}");
        let rate = if secs > 0.0 {
            self.generated_tokens.load(Relaxed) as f64 / secs
        } else {
            0.0
        };
        gauge(
            &mut o,
            "berth_tokens_per_second",
            "Generated tokens per second of decode time.",
            rate,
        );
        gauge(
            &mut o,
            "berth_queue_depth",
            "Requests waiting for a sequence slot.",
            self.queue_depth.load(Relaxed) as f64,
        );
        gauge(
            &mut o,
            "berth_active_sequences",
            "Sequences being decoded.",
            self.active_sequences.load(Relaxed) as f64,
        );
        let capacity = self.kv_capacity.load(Relaxed);
        gauge(
            &mut o,
            "berth_kv_cache_usage_ratio",
            "Fraction of the loaded models' KV-cache rows (sequence slots x context) held by running sequences.",
            if capacity > 0 { self.kv_used.load(Relaxed).max(0) as f64 / capacity as f64 } else { 0.0 },
        );
        gauge(
            &mut o,
            "berth_loaded_models",
            "Models loaded.",
            self.loaded_models.load(Relaxed) as f64,
        );
        gauge(
            &mut o,
            "berth_requests_waiting_for_load",
            "Requests waiting for a model another request is loading.",
            self.load_waiters.load(Relaxed) as f64,
        );
        let h = self.ttft.lock().unwrap_or_else(|e| e.into_inner());
        o.push_str("# HELP berth_time_to_first_token_seconds Time from request to first token.\n# TYPE berth_time_to_first_token_seconds histogram\n");
        for (b, le) in h.buckets.iter().zip(TTFT_BUCKETS) {
            let _ = writeln!(o, "berth_time_to_first_token_seconds_bucket{{le=\"{le}\"}} {b}");
        }
        let _ = writeln!(
            o,
            "berth_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(o, "berth_time_to_first_token_seconds_sum {}", h.sum);
        let _ = writeln!(o, "berth_time_to_first_token_seconds_count {}", h.count);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_steps_count_batching_and_its_peak() {
        let m = Metrics::default();
        for sequences in [1, 3, 2, 1] {
            m.decode_step(sequences);
        }
        let text = m.render();
        for line in [
            "berth_decode_steps_total 4\n",
            "berth_batched_decode_steps_total 2\n",
            "berth_peak_batch_sequences 3\n",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
