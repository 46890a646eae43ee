//! Constrained-decoding benchmark: `cargo bench -p berth --bench constrain`.
//!
//! Prints grammar build times, the per-token mask time (mean, p99) at Qwen2.5's 151,936 and
//! Gemma 3's 262,144 vocabularies, and Qwen2.5-Coder 0.5B generation tokens/s with and without a
//! constraint (the engine computes the mask on a second thread during the forward pass). Uses the real
//! GGUFs (`scripts/fetch-models`). `BENCH_THREADS` sets the plugin's threads (default 1).

#[path = "../tests/common/mod.rs"]
mod common;

use berth::chat::{ChatFormat, Detected, ParseStart};
use berth::constraint::{ConstraintFactory, RequestConstraints};
use berth::decoding::DecodeOptions;
use berth::engine::metrics::Metrics;
use berth::engine::{Event, Finish, Job};
use berth::sampling::SamplingParams;
use berth::state::models::{LoadSettings, Model};
use berth::template::RenderInput;
use berth::tokenizer::Tokenizer;
use berth_registry::gguf::GgufFile;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn tools(n: usize) -> Value {
    let list: Vec<Value> = (0..n)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"), "parameters": {
                "type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    "units": {"type": "string", "enum": ["c", "f"]},
                    "tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["city"]}}})
        })
        .collect();
    Value::Array(list)
}

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "kind": {"type": "string", "enum": ["city", "town", "village"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 40000000},
        "sights": {"type": "array", "minItems": 12, "maxItems": 12, "items": {"type": "object",
            "properties": {"name": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 0, "maximum": 2025}},
            "required": ["name", "year"], "additionalProperties": false}}},
        "required": ["name", "kind", "population", "sights"], "additionalProperties": false})
}

fn json_request() -> RequestConstraints {
    RequestConstraints::from_openai(
        None,
        None,
        None,
        Some(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema()}})),
    )
    .unwrap()
}

/// Mean and 99th percentile.
fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let p99 = v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)];
    (mean, p99)
}

/// Times the mask before every token of `text`, fed through the constraint `reps` times.
fn mask_times(
    f: &ConstraintFactory,
    tok: &Tokenizer,
    req: &RequestConstraints,
    text: &str,
    reps: usize,
) -> Vec<f64> {
    let ids = tok.encode(text, false);
    let mut times = Vec::new();
    for _ in 0..reps {
        let mut c = f.build(req, false, ParseStart::Content).unwrap().unwrap();
        for &id in &ids {
            let t = Instant::now();
            let (mask, _) = c.compute_mask().unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e6);
            assert!(
                berth::sampling::mask_allows(&mask, id),
                "token {id} of the sample text is masked"
            );
            c.consume(id).unwrap();
        }
    }
    times
}

/// Runs one job on the model's engine to its end, throwing the text away.
fn generate(model: &Model, prompt: &[u32], decode: DecodeOptions) -> Finish {
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        id: "bench".into(),
        prompt: prompt.to_vec(),
        decode,
        events,
        received: Instant::now(),
        images: Vec::new(),
        siblings: Vec::new(),
    };
    model.engine.submit(job).unwrap();
    loop {
        match rx.blocking_recv().expect("the engine ends every job") {
            Event::Done(f) => return f,
            Event::Error(e) => panic!("generation failed: {e}"),
            _ => {}
        }
    }
}

fn grammar_times(f: &ConstraintFactory, req: &RequestConstraints, reps: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        f.build(req, false, ParseStart::Content).unwrap().unwrap();
    }
    ms(t.elapsed()) / reps as f64
}

const JSON_SAMPLE: &str = r#"{"name": "Paris", "kind": "city", "population": 2100000, "sights": [{"name": "Eiffel Tower", "year": 1889}, {"name": "Louvre", "year": 1793}, {"name": "Notre-Dame", "year": 1345}, {"name": "Arc de Triomphe", "year": 1836}, {"name": "Sacre-Coeur", "year": 1914}, {"name": "Pantheon", "year": 1790}, {"name": "Opera Garnier", "year": 1875}, {"name": "Sainte-Chapelle", "year": 1248}, {"name": "Musee d'Orsay", "year": 1986}, {"name": "Pont Neuf", "year": 1607}, {"name": "Invalides", "year": 1706}, {"name": "Centre Pompidou", "year": 1977}]}"#;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!(
        "machine load (uptime):{}",
        String::from_utf8_lossy(&std::process::Command::new("uptime").output().unwrap().stdout).trim_end()
    );
    let qwen_path = common::real_model("qwen2.5-coder-0.5b");
    let gemma_path = common::real_model("gemma3-270m");
    let qwen_tok = Tokenizer::from_gguf(&GgufFile::open(&qwen_path).unwrap()).unwrap();
    let gemma_tok = Tokenizer::from_gguf(&GgufFile::open(&gemma_path).unwrap()).unwrap();

    println!("\n## Grammar and mask (llguidance)\n");
    println!("| vocabulary | what | figure |\n| --- | --- | ---: |");
    let hermes = Detected {
        format: ChatFormat::HermesJson,
        reasoning: None,
    };
    let content = Detected {
        format: ChatFormat::ContentOnly,
        reasoning: None,
    };
    for (label, tok, detected, vocab) in [
        ("qwen2.5 151,936", &qwen_tok, hermes, 151_936usize),
        ("gemma3 262,144", &gemma_tok, content, 262_144),
    ] {
        let t = Instant::now();
        let f = ConstraintFactory::new(tok, &detected, vocab, true).unwrap();
        println!(
            "| {label} | token trie (once per model) | {:.0} ms |",
            ms(t.elapsed())
        );
        let js = json_request();
        println!(
            "| {label} | json_schema grammar build | {:.2} ms |",
            grammar_times(&f, &js, 20)
        );
        let (mean, p99) = stats(mask_times(&f, tok, &js, JSON_SAMPLE, 5));
        println!("| {label} | json_schema mask per token, mean / p99 | {mean:.0} / {p99:.0} µs |");
        if detected.format == ChatFormat::HermesJson {
            for n in [1, 10] {
                let req =
                    RequestConstraints::from_openai(Some(&tools(n)), Some(&json!("required")), None, None)
                        .unwrap();
                println!(
                    "| {label} | required, {n} tool(s): grammar build | {:.2} ms |",
                    grammar_times(&f, &req, 20)
                );
            }
            let req =
                RequestConstraints::from_openai(Some(&tools(10)), Some(&json!("auto")), None, None).unwrap();
            let text = "Let me check.\n<tool_call>\n{\"name\": \"tool_7\", \"arguments\": {\"city\": \"Paris\", \"days\": 3, \"units\": \"c\", \"tags\": [\"now\", \"later\"]}}\n</tool_call>";
            let (mean, p99) = stats(mask_times(&f, tok, &req, text, 10));
            println!("| {label} | auto, 10 tools: mask per token, mean / p99 | {mean:.0} / {p99:.0} µs |");
        }
    }

    println!("\n## Generation, Qwen2.5-Coder 0.5B\n");
    let threads: u32 = std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let home = tempfile::tempdir().unwrap();
    common::berth_ok(
        home.path(),
        None,
        &[
            "plugins",
            "install",
            common::plugin_library("qwen3").to_str().unwrap(),
        ],
    );
    common::berth_ok(
        home.path(),
        None,
        &["import", qwen_path.to_str().unwrap(), "--name", "qwen:bench"],
    );
    let store = berth_registry::store::Store::new(home.path().to_path_buf());
    let settings = LoadSettings {
        threads: Some(threads),
        slots: 1,
        queue: 1,
        context: None,
        keep_alive: None,
        // The grammar's own cost, without drafts.
        speculation: false,
    };
    let model = Model::load(
        &store,
        home.path(),
        "qwen:bench",
        &settings,
        Arc::new(Metrics::default()),
    )
    .unwrap();
    let f = model.constraints.as_ref().unwrap();
    let prompt = model
        .template
        .as_ref()
        .unwrap()
        .render(&RenderInput {
            messages: vec![json!({"role": "user", "content": "Describe Paris and twelve of its sights with the year each was built, as JSON."})],
            add_generation_prompt: true,
            ..RenderInput::default()
        })
        .unwrap();
    let tokens = model.tokenizer.encode(&prompt, false);
    println!("| run | tokens | tokens/s |\n| --- | ---: | ---: |");
    let n = 128;
    // Pairs run back to back, in alternating order, so both sides of a pair see the same load;
    // the claim is the ratio within pairs (and their median), never figures from separate runs.
    let mut ratios = Vec::new();
    for rep in 0..3u64 {
        let order = if rep % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut rates = [0.0f64; 2];
        for constrained in order {
            let constraint = if constrained {
                f.build(&json_request(), false, ParseStart::Content).unwrap()
            } else {
                None
            };
            let opts = DecodeOptions {
                sampling: SamplingParams {
                    temperature: 0.7,
                    seed: Some(rep),
                    ..SamplingParams::default()
                },
                max_tokens: Some(n),
                stop: Vec::new(),
                context: None,
                constraint,
                logprobs: None,
            };
            let s = generate(&model, &tokens, opts);
            let rate = s.completion_tokens as f64 / s.generation_duration.as_secs_f64().max(1e-9);
            rates[usize::from(constrained)] = rate;
            println!(
                "| {} #{rep} | {} | {rate:.2} |",
                if constrained {
                    "json_schema"
                } else {
                    "unconstrained"
                },
                s.completion_tokens,
            );
        }
        ratios.push(rates[1] / rates[0]);
    }
    let pairs: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "\njson_schema / unconstrained tokens/s, per pair: {}; median {:.3}",
        pairs.join(", "),
        ratios[ratios.len() / 2]
    );
    println!(
        "\nthreads: {threads}; machine load after (uptime):{}",
        String::from_utf8_lossy(&std::process::Command::new("uptime").output().unwrap().stdout).trim_end()
    );
}
