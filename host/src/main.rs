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
    // openai-harmony reads its vocabulary from $TIKTOKEN_ENCODINGS_BASE and downloads it when the
    // variable is unset; Berth writes that file itself (from the pack's own tokenizer) and never
    // downloads it. Set here, first, because changing the environment is only sound while no
    // other thread runs (the server's runtime and the engines start later).
    berth::harmony::set_encodings_base();
    let cli = berth::cli::Cli::parse();
    if let Err(e) = berth::cli::run(cli) {
        eprintln!("berth: {}", one_line(&e));
        std::process::exit(1);
    }
}
