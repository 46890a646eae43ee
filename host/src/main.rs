//! `berth`: the command-line entry point.

use clap::Parser;

/// One line for the user: the error and each cause that adds something new.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !line.contains(&c) {
            line = format!("{line}: {c}");
        }
    }
    line
}

fn main() {
    let cli = berth::cli::Cli::parse();
    if let Err(e) = berth::cli::run(cli) {
        eprintln!("berth: {}", one_line(&e));
        std::process::exit(1);
    }
}
