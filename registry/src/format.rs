//! Human-readable sizes, parameter counts and ages for the CLI's listings.

use std::time::{Duration, SystemTime};

/// Bytes in decimal units, ollama style: `"469 MB"`, `"4.7 GB"`, `"512 B"`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 999.5 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if value < 9.95 {
        let s = format!("{value:.1}");
        let s = s.strip_suffix(".0").unwrap_or(&s);
        format!("{s} {}", UNITS[unit])
    } else {
        format!("{} {}", value.round() as u64, UNITS[unit])
    }
}

/// A parameter count: `"494.03M"`, `"268.10M"`, `"1.2B"`, `"12.5K"`, `"900"`.
pub fn human_params(n: u64) -> String {
    let n_f = n as f64;
    if n >= 1_000_000_000_000 {
        format!("{:.1}T", n_f / 1e12)
    } else if n >= 1_000_000_000 {
        format!("{:.1}B", n_f / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.2}M", n_f / 1e6)
    } else if n >= 1_000 {
        format!("{:.1}K", n_f / 1e3)
    } else {
        n.to_string()
    }
}

/// How long ago a time was: `"2 minutes ago"`, `"About an hour ago"`, `"3 days ago"`.
pub fn human_age(t: SystemTime) -> String {
    human_age_at(t, SystemTime::now())
}

/// [`human_age`] relative to a given `now`.
pub fn human_age_at(t: SystemTime, now: SystemTime) -> String {
    let d = match now.duration_since(t) {
        Ok(d) => d,
        Err(e) if e.duration() < Duration::from_secs(2) => Duration::ZERO,
        Err(_) => return "In the future".into(),
    };
    let s = d.as_secs();
    let plural = |n: u64, unit: &str| {
        if n == 1 {
            format!("1 {unit} ago")
        } else {
            format!("{n} {unit}s ago")
        }
    };
    const MIN: u64 = 60;
    const HOUR: u64 = 60 * MIN;
    const DAY: u64 = 24 * HOUR;
    match s {
        0 => "Less than a second ago".into(),
        1..60 => plural(s, "second"),
        60..120 => "About a minute ago".into(),
        120..HOUR => plural(s / MIN, "minute"),
        HOUR..7200 => "About an hour ago".into(),
        7200..DAY => plural(s / HOUR, "hour"),
        DAY..1_209_600 => plural(s / DAY, "day"),
        1_209_600..5_184_000 => plural(s / (7 * DAY), "week"),
        5_184_000..63_072_000 => plural(s / (30 * DAY), "month"),
        _ => plural(s / (365 * DAY), "year"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(999), "999 B");
        assert_eq!(human_size(1000), "1 KB");
        assert_eq!(human_size(1500), "1.5 KB");
        assert_eq!(human_size(491_400_064), "491 MB");
        assert_eq!(human_size(253_113_024), "253 MB");
        assert_eq!(human_size(4_700_000_000), "4.7 GB");
        assert_eq!(human_size(999_999), "1 MB");
        assert_eq!(human_size(12_345_678_901), "12 GB");
    }

    #[test]
    fn params() {
        assert_eq!(human_params(494_032_768), "494.03M");
        assert_eq!(human_params(268_098_176), "268.10M");
        assert_eq!(human_params(1_234_567_890), "1.2B");
        assert_eq!(human_params(12_500), "12.5K");
        assert_eq!(human_params(900), "900");
    }

    #[test]
    fn ages() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let ago = |s: u64| human_age_at(now - Duration::from_secs(s), now);
        assert_eq!(ago(0), "Less than a second ago");
        assert_eq!(ago(1), "1 second ago");
        assert_eq!(ago(30), "30 seconds ago");
        assert_eq!(ago(90), "About a minute ago");
        assert_eq!(ago(150), "2 minutes ago");
        assert_eq!(ago(3700), "About an hour ago");
        assert_eq!(ago(5 * 3600), "5 hours ago");
        assert_eq!(ago(86_400), "1 day ago");
        assert_eq!(ago(3 * 86_400), "3 days ago");
        assert_eq!(ago(21 * 86_400), "3 weeks ago");
        assert_eq!(ago(90 * 86_400), "3 months ago");
        assert_eq!(ago(800 * 86_400), "2 years ago");
        assert_eq!(human_age_at(now + Duration::from_secs(100), now), "In the future");
    }
}
