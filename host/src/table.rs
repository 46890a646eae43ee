//! Plain-text tables for the CLI's listings (`berth list`, `berth catalog`, ...).

use std::io::Write;

/// Prints rows under a header, columns padded to their widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}   ", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line(header.to_vec()));
    for r in rows {
        let _ = writeln!(out, "{}", line(r.iter().map(String::as_str).collect()));
    }
}
