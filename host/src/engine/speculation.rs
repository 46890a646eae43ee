//! Prompt-lookup speculation: a greedy sequence that is copying (from its prompt or from what it
//! already wrote) gets its next tokens drafted from the last occurrence of its latest n-gram, and
//! one decode call checks them all: the sequence's rows `[next, d1, .., dk]` each ask for logits,
//! each row's greedy pick is taken in order, and the drafts are kept while they equal the picks.
//!
//! The output stays token for token what plain decoding gives as long as every verified row's
//! logits are bit-identical to the same row decoded alone: a plugin rounds the rows of a sequence
//! that all want logits as single-row steps (plugins/common does: every matmul row rounds as it
//! would alone, and attention computes every row bit for bit as alone). [`MAX_DRAFT`] = 3 makes a verify
//! step four rows (7 measured no better on the copy task: acceptance fell from 0.71 to 0.54);
//! one sequence per step speculates.
//!
//! Each sequence switches itself off for a while when its drafts are mostly rejected. It is on by
//! default and greedy-only: a sampled sequence never drafts, so its distribution is untouched.

/// Most tokens drafted per step (the verify step then has `MAX_DRAFT + 1` rows of one sequence).
pub const MAX_DRAFT: usize = 3;

/// Longest and shortest n-gram looked up.
const NGRAM_MAX: usize = 3;
const NGRAM_MIN: usize = 2;

/// Drafts recorded before the acceptance rate is judged.
const JUDGE_AFTER: u32 = 12;
/// Acceptance rate under which drafting pauses.
const MIN_ACCEPTANCE: f32 = 0.3;
/// Steps of the first pause; each further failed judgement doubles it, up to [`MAX_PAUSE`].
const FIRST_PAUSE: u32 = 16;
const MAX_PAUSE: u32 = 512;

/// Whether speculation runs for a model with this rewind rule: when the setting is on (the
/// default; `--speculation off`, `BERTH_SPECULATION=off` or `speculation = "off"` in berth.toml
/// turn it off) and the plugin rewinds anywhere (rejected drafts are cut off).
pub fn enabled(setting: bool, rewind: berth_plugin_api::Rewind) -> bool {
    setting && rewind == berth_plugin_api::Rewind::Anywhere
}

/// Reads a speculation setting: `on`/`off` (also `true`/`false`, `1`/`0`).
pub fn parse_setting(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        other => Err(format!("speculation is `on` or `off`, not `{other}`")),
    }
}

/// Up to `max` tokens that followed the most recent earlier occurrence of the longest n-gram
/// (`NGRAM_MAX` down to `NGRAM_MIN` tokens) that `history` ends with; empty when none occurs.
/// Keys above `u32::MAX` (image rows) never match and are never drafted.
pub fn draft(history: &[u64], max: usize) -> Vec<u32> {
    let len = history.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let tail = &history[len - n..];
        if tail.iter().any(|&t| t > u64::from(u32::MAX)) {
            continue;
        }
        // The latest start p < len - n whose n tokens equal the tail.
        let found = (0..len - n).rev().find(|&p| &history[p..p + n] == tail);
        if let Some(p) = found {
            return history[p + n..len.min(p + n + max)]
                .iter()
                .map_while(|&t| u32::try_from(t).ok())
                .collect();
        }
    }
    Vec::new()
}

/// One sequence's speculation record: drafts and acceptances, the measured speed with and
/// without drafts, and whether drafting is paused.
#[derive(Clone, Debug, Default)]
pub struct Speculator {
    /// Drafted tokens since the last judgement.
    drafted: u32,
    /// Of those, accepted.
    accepted: u32,
    /// Tokens taken and seconds spent in verify steps since the last judgement.
    spec_tokens: f64,
    spec_secs: f64,
    /// Moving average of tokens per second of steps without drafts.
    plain_rate: Option<f64>,
    /// Steps left without drafting.
    paused: u32,
    /// The next pause's length.
    next_pause: u32,
    /// Drafted tokens over the sequence's life.
    pub total_drafted: u64,
    /// Accepted tokens over the sequence's life.
    pub total_accepted: u64,
}

impl Speculator {
    /// Whether this step may draft (counts a paused step down).
    pub fn may_draft(&mut self) -> bool {
        if self.paused > 0 {
            self.paused -= 1;
            return false;
        }
        true
    }

    /// Records a step without drafts that took `secs` (one token).
    pub fn record_plain(&mut self, secs: f64) {
        if secs > 0.0 {
            let rate = 1.0 / secs;
            self.plain_rate = Some(self.plain_rate.map_or(rate, |r| 0.8 * r + 0.2 * rate));
        }
    }

    /// Records one verify step that took `secs`: `drafted` tokens fed, `accepted` of them kept
    /// (so `accepted + 1` tokens taken). Every [`JUDGE_AFTER`] drafts the window is judged:
    /// drafting pauses (for longer each time) when few drafts were accepted or when the verify
    /// steps made fewer tokens per second than steps without drafts.
    pub fn record(&mut self, drafted: usize, accepted: usize, secs: f64) {
        self.drafted += drafted as u32;
        self.accepted += accepted as u32;
        self.spec_tokens += (accepted + 1) as f64;
        self.spec_secs += secs.max(0.0);
        self.total_drafted += drafted as u64;
        self.total_accepted += accepted as u64;
        if self.drafted < JUDGE_AFTER {
            return;
        }
        let rarely = (self.accepted as f32) < MIN_ACCEPTANCE * self.drafted as f32;
        let slower = self
            .plain_rate
            .is_some_and(|plain| self.spec_tokens < plain * self.spec_secs);
        if rarely || slower {
            self.next_pause = (self.next_pause * 2).clamp(FIRST_PAUSE, MAX_PAUSE);
            self.paused = self.next_pause;
        } else {
            self.next_pause = 0;
        }
        self.drafted = 0;
        self.accepted = 0;
        self.spec_tokens = 0.0;
        self.spec_secs = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(s: &str) -> Vec<u64> {
        s.bytes().map(u64::from).collect()
    }

    #[test]
    fn drafts_what_followed_the_latest_occurrence_of_the_longest_ngram() {
        // "bcd" occurred twice before; the latest one was followed by "XY".
        let h = keys("abcdQRabcdXYZ..bcd");
        assert_eq!(draft(&h, 2), vec![b'X' as u32, b'Y' as u32]);
        assert_eq!(
            draft(&h, 5),
            keys("XYZ..").iter().map(|&k| k as u32).collect::<Vec<_>>()
        );
        // Only a 2-gram matches.
        assert_eq!(draft(&keys("xyQ..zyQ"), 2), vec![b'.' as u32, b'.' as u32]);
        assert_eq!(draft(&keys("xyQ..zxy"), 2), vec![b'Q' as u32, b'.' as u32]);
        // Nothing repeats, or too short.
        assert_eq!(draft(&keys("abcdefg"), 2), Vec::<u32>::new());
        assert_eq!(draft(&keys("ab"), 2), Vec::<u32>::new());
        // The draft stops at the history's end.
        assert_eq!(draft(&keys("abab"), 2), vec![b'a' as u32, b'b' as u32]);
        assert_eq!(
            draft(&keys("abcab"), 4),
            keys("cab").iter().map(|&k| k as u32).collect::<Vec<_>>()
        );
    }

    #[test]
    fn image_rows_are_never_matched_or_drafted() {
        let img = 1u64 << 63;
        let h = vec![1, 2, 3, img, 5, 1, 2, 3];
        assert_eq!(draft(&h, 2), Vec::<u32>::new());
        let h = vec![img, 1, 2, 3, 1, 2];
        assert_eq!(draft(&h, 2), vec![3, 1]);
        let h = vec![9, img, img, 1, 2, 9];
        assert_eq!(draft(&h, 2), Vec::<u32>::new());
    }

    #[test]
    fn low_acceptance_pauses_drafting_for_longer_each_time() {
        let mut s = Speculator::default();
        assert!(s.may_draft());
        for _ in 0..6 {
            s.record(2, 0, 0.01);
        }
        let paused = (0..).take_while(|_| !s.may_draft()).count();
        assert_eq!(paused, FIRST_PAUSE as usize);
        for _ in 0..6 {
            s.record(2, 0, 0.01);
        }
        let paused = (0..).take_while(|_| !s.may_draft()).count();
        assert_eq!(paused, 2 * FIRST_PAUSE as usize);
        // Good acceptance keeps it on and resets the backoff.
        for _ in 0..6 {
            s.record(2, 2, 0.01);
        }
        assert!(s.may_draft());
        assert_eq!((s.total_drafted, s.total_accepted), (36, 12));
    }

    #[test]
    fn drafts_that_do_not_pay_for_their_rows_pause_drafting() {
        // Plain steps: 100 tokens/s.
        let mut s = Speculator::default();
        for _ in 0..5 {
            s.record_plain(0.01);
        }
        // All drafts accepted (3 tokens a step) but a step takes 0.04 s: 75 tokens/s.
        for _ in 0..6 {
            s.record(2, 2, 0.04);
        }
        assert!(!s.may_draft(), "slower than plain decoding");
        // 3 tokens in 0.02 s: 150 tokens/s, kept on.
        let mut s = Speculator::default();
        s.record_plain(0.01);
        for _ in 0..6 {
            s.record(2, 2, 0.02);
        }
        assert!(s.may_draft());
    }
}
