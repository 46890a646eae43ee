//! Constrained decoding on the real Qwen2.5-Coder 0.5B: tool_choice and response_format hold at
//! temperature 0.7 for every seed, and what comes out parses with the model's own chat format.

mod common;

use berth::chat::{self, ChatFormat, ParseStart};
use berth::constraint::RequestConstraints;
use berth::decoding::DecodeOptions;
use berth::engine::metrics::Metrics;
use berth::engine::{Event, Job};
use berth::sampling::SamplingParams;
use berth::state::models::{LoadSettings, Model};
use berth::template::RenderInput;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// A Berth home with the Qwen plugin and Qwen2.5-Coder 0.5B imported.
fn home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        home_with(
            "berth-constrain-",
            &["qwen3"],
            &[("qwen2.5-coder-0.5b", "qwen2.5-coder:0.5b")],
        )
    })
}

/// The engine counters of [`model`].
static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();

/// The model on an engine of one slot, as `berth run` loads it (tests take turns).
fn model() -> &'static Mutex<Model> {
    static M: OnceLock<Mutex<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let metrics = METRICS.get_or_init(|| Arc::new(Metrics::default())).clone();
        let store = berth_registry::store::Store::new(home().to_path_buf());
        let settings = LoadSettings {
            threads: Some(2),
            slots: 1,
            queue: 4,
            context: None,
            keep_alive: None,
            // As users get it (speculation drafts at most one grammar-allowed token).
            speculation: true,
        };
        let model = Model::load(&store, home(), "qwen2.5-coder:0.5b", &settings, metrics).unwrap();
        assert_eq!(model.detected.format, ChatFormat::HermesJson);
        assert_eq!(model.vocab_size, 151_936, "the padded vocabulary");
        if let Err(e) = &model.constraints {
            panic!("no constraint factory: {e}");
        }
        Mutex::new(model)
    })
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"]}}})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_time",
        "description": "Get the local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

struct Reply {
    text: String,
    parsed: chat::ParsedMessage,
    finish: &'static str,
    /// Tokens generated.
    tokens: usize,
    /// Forward passes the engine ran for the job (its prompt included).
    steps: u64,
}

/// Renders one user message with tools, generates under the request's constraint, parses.
fn ask(prompt: &str, tools: &[Value], req: &RequestConstraints, seed: u64, max_tokens: usize) -> Reply {
    let m = model().lock().unwrap_or_else(|e| e.into_inner());
    let template = m.template.as_ref().unwrap();
    let rendered = template
        .render(&RenderInput {
            messages: vec![json!({"role": "user", "content": prompt})],
            tools: (!tools.is_empty()).then(|| tools.to_vec()),
            add_generation_prompt: true,
            ..RenderInput::default()
        })
        .unwrap();
    let start = chat::prefill(ChatFormat::HermesJson, &rendered);
    assert_eq!(start, ParseStart::Content);
    let tokens = m.tokenizer.encode(&rendered, false);
    let factory = m.constraints.as_ref().unwrap();
    let constraint = factory.build(req, false, start).unwrap();
    let opts = DecodeOptions {
        sampling: SamplingParams {
            temperature: 0.7,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        context: None,
        constraint,
        logprobs: None,
    };
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        id: format!("constrain-{seed}"),
        prompt: tokens,
        decode: opts,
        events,
        received: Instant::now(),
        images: Vec::new(),
        siblings: Vec::new(),
    };
    let metrics = METRICS.get().expect("set with the model");
    let steps_before = metrics.decode_steps.load(Relaxed);
    m.engine.submit(job).unwrap();
    let mut text = String::new();
    let (reason, tokens) = loop {
        match rx.blocking_recv().expect("the engine ends every job") {
            Event::Text(t) => text.push_str(&t),
            Event::Logprobs(_) => {}
            Event::Done(f) => break (f.reason.as_str(), f.completion_tokens),
            Event::Error(e) => panic!("generation failed: {e}"),
        }
    };
    let parsed = chat::parse(ChatFormat::HermesJson, start, &text, req.parser_tools(), false);
    // As the server decides it: a reply that stopped with calls in it finished with tool_calls.
    let finish = if reason == "stop" && !parsed.tool_calls.is_empty() {
        "tool_calls"
    } else {
        reason
    };
    let steps = metrics.decode_steps.load(Relaxed) - steps_before;
    Reply {
        text,
        parsed,
        finish,
        tokens,
        steps,
    }
}

fn openai(tools: &[Value], choice: Value, parallel: Value, format: Value) -> RequestConstraints {
    RequestConstraints::from_openai(Some(&json!(tools)), Some(&choice), Some(&parallel), Some(&format))
        .unwrap()
}

/// The tokens of a text (special markers as their ids).
fn m_tokens(text: &str) -> Vec<u32> {
    let guard = model().lock().unwrap_or_else(|e| e.into_inner());
    guard.tokenizer.encode(text, false)
}

/// A validator for the JSON-schema keywords these tests use.
fn validate(v: &Value, s: &Value) -> Result<(), String> {
    if let Some(options) = s.get("enum").and_then(Value::as_array) {
        if !options.contains(v) {
            return Err(format!("{v} not in {options:?}"));
        }
    }
    let ty = s.get("type").and_then(Value::as_str);
    let num = |k: &str| s.get(k).and_then(Value::as_f64);
    match ty {
        Some("object") => {
            let o = v.as_object().ok_or(format!("{v} is not an object"))?;
            let props = s.get("properties").and_then(Value::as_object);
            for r in s.get("required").and_then(Value::as_array).into_iter().flatten() {
                let r = r.as_str().unwrap();
                if !o.contains_key(r) {
                    return Err(format!("missing {r} in {v}"));
                }
            }
            for (k, x) in o {
                match props.and_then(|p| p.get(k)) {
                    Some(ps) => validate(x, ps)?,
                    None if s.get("additionalProperties") == Some(&json!(false)) => {
                        return Err(format!("unexpected {k}"))
                    }
                    None => {}
                }
            }
        }
        Some("array") => {
            let a = v.as_array().ok_or(format!("{v} is not an array"))?;
            if num("minItems").is_some_and(|n| (a.len() as f64) < n)
                || num("maxItems").is_some_and(|n| (a.len() as f64) > n)
            {
                return Err(format!("{} items", a.len()));
            }
            if let Some(items) = s.get("items") {
                for x in a {
                    validate(x, items)?;
                }
            }
        }
        Some("string") => {
            let t = v.as_str().ok_or(format!("{v} is not a string"))?;
            let n = t.chars().count() as f64;
            if num("minLength").is_some_and(|m| n < m) || num("maxLength").is_some_and(|m| n > m) {
                return Err(format!("length of {t:?}"));
            }
        }
        Some("integer") | Some("number") => {
            if ty == Some("integer") && !(v.is_i64() || v.is_u64()) {
                return Err(format!("{v} is not an integer"));
            }
            let x = v.as_f64().ok_or(format!("{v} is not a number"))?;
            if num("minimum").is_some_and(|m| x < m) || num("maximum").is_some_and(|m| x > m) {
                return Err(format!("{x} out of bounds"));
            }
        }
        Some("boolean") if !v.is_boolean() => return Err(format!("{v} is not a boolean")),
        _ => {}
    }
    Ok(())
}

#[test]
fn required_forces_a_valid_get_weather_call_for_every_seed() {
    let tools = [weather_tool()];
    let schema = tools[0]["function"]["parameters"].clone();
    let t0 = std::time::Instant::now();
    for parallel in [false, true] {
        let req = openai(&tools, json!("required"), json!(parallel), Value::Null);
        for seed in 0..10 {
            let r = ask("What is the weather in Paris right now?", &tools, &req, seed, 40);
            assert!(!r.parsed.tool_calls.is_empty(), "seed {seed}: {:?}", r.text);
            for call in &r.parsed.tool_calls {
                assert_eq!(call.name, "get_weather");
                let args: Value = serde_json::from_str(&call.arguments).unwrap();
                validate(&args, &schema).unwrap_or_else(|e| panic!("seed {seed}: {e}: {}", r.text));
            }
            assert!(r.parsed.content.is_none(), "nothing but calls: {}", r.text);
            if !parallel {
                // One call, then the grammar only allows the stop token.
                assert_eq!(r.parsed.tool_calls.len(), 1);
                assert_eq!(r.finish, "tool_calls", "seed {seed}: {}", r.text);
            }
        }
    }
    eprintln!("20 forced calls in {:.1}s", t0.elapsed().as_secs_f64());
}

#[test]
fn json_schema_content_validates_for_every_seed() {
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 30},
        "country": {"type": "string", "enum": ["FR", "DE", "IT", "ES"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 40},
        "weather": {"type": "object", "properties": {
            "sky": {"type": "string", "enum": ["sunny", "cloudy", "rainy"]},
            "temp_c": {"type": "integer", "minimum": -30, "maximum": 45}},
            "required": ["sky", "temp_c"], "additionalProperties": false},
        "landmarks": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object",
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 30},
                "year": {"type": "integer", "minimum": 1000, "maximum": 2025}},
            "required": ["name", "year"], "additionalProperties": false}}},
        "required": ["city", "country", "population_millions", "weather", "landmarks"],
        "additionalProperties": false});
    let req = openai(
        &[],
        Value::Null,
        Value::Null,
        json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": true}}),
    );
    for seed in 0..10 {
        let r = ask(
            "Describe Paris: its country, population, weather today and famous landmarks.",
            &[],
            &req,
            seed,
            200,
        );
        assert_eq!(r.finish, "stop", "seed {seed}: {}", r.text);
        let content = r.parsed.content.clone().unwrap_or_default();
        let v: Value =
            serde_json::from_str(&content).unwrap_or_else(|e| panic!("seed {seed}: {e}: {content}"));
        validate(&v, &schema).unwrap_or_else(|e| panic!("seed {seed}: {e}: {content}"));
        // The tokens the grammar forces (keys, punctuation) share the picked token's forward pass.
        assert!(
            r.steps < r.tokens as u64,
            "seed {seed}: {} forward passes for {} tokens",
            r.steps,
            r.tokens
        );
    }
}

#[test]
fn none_named_and_single_call_choices_hold() {
    let tools = [weather_tool(), time_tool()];
    let prompt = "What is the weather in Paris and the time in Tokyo?";
    let none = openai(&tools, json!("none"), Value::Null, Value::Null);
    let named = openai(
        &tools,
        json!({"type": "function", "function": {"name": "get_time"}}),
        Value::Null,
        Value::Null,
    );
    let single = openai(&tools, json!("required"), json!(false), Value::Null);
    for seed in 0..3 {
        let r = ask(prompt, &tools, &none, seed, 40);
        assert!(r.parsed.tool_calls.is_empty(), "none: {}", r.text);
        let ids = m_tokens(&r.text);
        assert!(!ids.contains(&151_657), "none never opens a call: {}", r.text);

        let r = ask(prompt, &tools, &named, seed, 48);
        let names: Vec<&str> = r.parsed.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert!(
            !names.is_empty() && names.iter().all(|n| *n == "get_time"),
            "named: {}",
            r.text
        );

        let r = ask(prompt, &tools, &single, seed, 96);
        assert_eq!(r.parsed.tool_calls.len(), 1, "parallel false: {}", r.text);
    }
}

#[test]
fn berth_run_format_json_answers_with_a_json_object() {
    let out = berth_ok(
        home(),
        Some(&home_plugins(home())),
        &[
            "run",
            "qwen2.5-coder:0.5b",
            "Give the capital of France.",
            "--format",
            r#"{"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}}, "required": ["capital"]}"#,
            "--temperature",
            "0",
            "--max-tokens",
            "30",
        ],
    );
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(
        v["capital"].as_str().is_some_and(|c| c.contains("Paris")),
        "{out}"
    );
}
