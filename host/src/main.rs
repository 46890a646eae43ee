//! `berth`: the command-line entry point.

use clap::Parser;

fn main() {
    let cli = berth::cli::Cli::parse();
    if let Err(e) = berth::cli::run(cli) {
        eprintln!("berth: {e:#}");
        std::process::exit(1);
    }
}
