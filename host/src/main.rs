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
    if !matches!(cli.command, berth::cli::Command::Serve(_)) {
        // A command's output piped into `head` ends it quietly, as with other Unix tools, instead
        // of a panic in `println!`. The server keeps Rust's default (SIGPIPE ignored): its
        // sockets report a closed peer as an error on that connection alone.
        // SAFETY: restoring a signal's default disposition at startup, before any thread or
        // handler exists; sockets are written with MSG_NOSIGNAL by std and tokio regardless.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if let Err(e) = berth::cli::run(cli) {
        eprintln!("berth: {}", one_line(&e));
        std::process::exit(1);
    }
}
