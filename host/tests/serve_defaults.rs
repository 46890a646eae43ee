//! Pack defaults and context end to end, on Qwen2.5-Coder 0.5B: a pack made from a Modelfile
//! (`SYSTEM`, `PARAMETER temperature`, `PARAMETER stop`, `MESSAGE` pairs) answers with them on all
//! four APIs and in `berth run`, the request's own values winning; Ollama's
//! `num_ctx` per request (above the server's default, up to the model's) and its truncation of
//! conversations longer than the context, where the OpenAI surfaces keep their 400.

mod common;

use common::*;
use serde_json::{json, Value};

/// The surfaces asked: OpenAI chat, Responses, Anthropic Messages, Ollama chat.
const SURFACES: usize = 4;

/// (reply text, prompt tokens) of one request to `surface` (see [`SURFACES`]): the question as
/// the only message, with `extra` over the body.
fn ask(server: &TestServer, surface: usize, model: &str, extra: &Value, question: &str) -> (String, u64) {
    let user = json!([{"role": "user", "content": question}]);
    let (path, mut body) = match surface {
        0 => (
            "/v1/chat/completions",
            json!({"model": model, "messages": user, "max_tokens": 24}),
        ),
        1 => (
            "/v1/responses",
            json!({"model": model, "input": question, "max_output_tokens": 24}),
        ),
        2 => (
            "/v1/messages",
            json!({"model": model, "messages": user, "max_tokens": 24}),
        ),
        _ => (
            "/api/chat",
            json!({"model": model, "messages": user, "stream": false, "options": {"num_predict": 24}}),
        ),
    };
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let v = server.post_ok(path, &body);
    match surface {
        0 => (
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
        ),
        1 => (responses_text(&v), v["usage"]["input_tokens"].as_u64().unwrap()),
        2 => (
            v["content"][0]["text"].as_str().unwrap_or_default().to_string(),
            v["usage"]["input_tokens"].as_u64().unwrap(),
        ),
        _ => (
            v["message"]["content"].as_str().unwrap().to_string(),
            v["prompt_eval_count"].as_u64().unwrap(),
        ),
    }
}

const SYSTEM: &str = "You are Berthy. You answer in one short sentence.";

#[test]
fn pack_parameters_system_prompt_and_messages_apply_on_every_surface_and_requests_win() {
    let home = home_with_qwen("berth-defaults-", "qwen:plain");
    // The pack is made as an Ollama user makes one: a Modelfile over an installed pack.
    let modelfile = home.path().join("Modelfile");
    std::fs::write(
        &modelfile,
        format!(
            "FROM qwen:plain\nSYSTEM \"\"\"{SYSTEM}\"\"\"\nPARAMETER temperature 0\nPARAMETER stop \"!\"\nPARAMETER stop .\n\
             PARAMETER num_ctx 4096\nMESSAGE user My name is Ann.\nMESSAGE assistant Hello Ann\n"
        ),
    )
    .unwrap();
    berth_ok(
        home.path(),
        None,
        &["create", "qwen:pack", "-f", modelfile.to_str().unwrap()],
    );
    let server = TestServer::start(home.path(), &[]);
    let question = "Say hello to me, using my name";

    // The pack, with nothing in the request but the question.
    let by_pack: Vec<(String, u64)> = (0..SURFACES)
        .map(|k| ask(&server, k, "qwen:pack", &json!({}), question))
        .collect();
    // The plain pack, with the same settings sent by the request itself.
    let explicit = |surface: usize| -> Value {
        let turns = json!([
            {"role": "user", "content": "My name is Ann."},
            {"role": "assistant", "content": "Hello Ann"},
            {"role": "user", "content": question},
        ]);
        match surface {
            0 => json!({"messages": [{"role": "system", "content": SYSTEM}, turns[0], turns[1], turns[2]],
                        "temperature": 0.0, "stop": ["!", "."]}),
            1 => json!({"instructions": SYSTEM, "input": turns, "temperature": 0.0}),
            2 => {
                json!({"system": SYSTEM, "messages": turns, "temperature": 0.0, "stop_sequences": ["!", "."]})
            }
            _ => json!({"messages": [{"role": "system", "content": SYSTEM}, turns[0], turns[1], turns[2]],
                        "options": {"temperature": 0.0, "stop": ["!", "."], "num_predict": 24}}),
        }
    };
    let by_request: Vec<(String, u64)> = (0..SURFACES)
        .map(|k| ask(&server, k, "qwen:plain", &explicit(k), question))
        .collect();
    for (k, ((pack_text, pack_tokens), (req_text, req_tokens))) in by_pack.iter().zip(&by_request).enumerate()
    {
        eprintln!("surface {k}: pack {pack_text:?} ({pack_tokens}), request {req_text:?} ({req_tokens})");
        // Same prompt: the pack's system prompt and messages were put in; same greedy reply.
        assert_eq!(pack_tokens, req_tokens, "surface {k}");
        assert!(
            !pack_text.contains('!') && !pack_text.contains('.'),
            "surface {k}: {pack_text:?}"
        );
        if k != 1 {
            // (Responses has no stop field: there the pack's stop strings stand alone.)
            assert_eq!(pack_text, req_text, "surface {k}");
        }
    }
    assert!(by_pack.iter().all(|(t, _)| t.contains("Ann")), "{by_pack:?}");
    // `berth run` with nothing but the question answers as the server does.
    let ran = berth_ok(home.path(), None, &["run", "qwen:pack", question]);
    assert_eq!(
        ran.trim_end(),
        by_pack[0].0.trim_end(),
        "berth run and serve differ"
    );

    // The request's own values win: its system prompt replaces the pack's, its stop list the
    // pack's.
    let mine = server.post_ok("/api/chat",
        &json!({"model": "qwen:pack", "stream": false,
                "messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": question}],
                "options": {"stop": ["\n"], "num_predict": 24}}),
    );
    let plain = server.post_ok("/api/chat",
        &json!({"model": "qwen:plain", "stream": false,
                "messages": [{"role": "system", "content": "Answer in French."},
                             {"role": "user", "content": "My name is Ann."}, {"role": "assistant", "content": "Hello Ann"},
                             {"role": "user", "content": question}],
                "options": {"stop": ["\n"], "num_predict": 24, "temperature": 0.0}}),
    );
    assert_eq!(
        mine["prompt_eval_count"], plain["prompt_eval_count"],
        "{mine}\n{plain}"
    );
    assert_eq!(mine["message"]["content"], plain["message"]["content"]);
}

/// A conversation of `turns` question-and-answer pairs after a system prompt, then a question.
fn long_chat(turns: usize) -> Vec<Value> {
    let mut ms = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for i in 0..turns {
        ms.push(json!({"role": "user", "content": format!("Tell me fact number {i} about the sea, in one sentence.")}));
        ms.push(json!({"role": "assistant", "content": format!("Fact {i}: the sea covers most of the Earth and holds most of its water, salt and life.")}));
    }
    ms.push(json!({"role": "user", "content": "What is 2 + 2? Answer with the number."}));
    ms
}

#[test]
fn context_per_request_truncation_for_ollama_and_a_400_for_openai() {
    let home = home_with_qwen("berth-ctx-", "qwen:ctx");
    // The server's default context is small; the model holds 32768.
    let server = TestServer::start(home.path(), &["--context", "256"]);
    let messages = long_chat(20);

    // OpenAI: the prompt does not fit the server's context: 400 context_length_exceeded.
    let (status, text) = server.post(
        "/v1/chat/completions",
        &json!({"model": "qwen:ctx", "messages": messages, "max_tokens": 4}).to_string(),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("context_length_exceeded"), "{text}");

    // Ollama: the oldest turns go; the system prompt and the question stay; it answers.
    let v = server.post_ok(
        "/api/chat",
        &json!({"model": "qwen:ctx", "messages": messages, "stream": false,
                "options": {"num_predict": 4, "temperature": 0.0}}),
    );
    let kept = v["prompt_eval_count"].as_u64().unwrap();
    assert!(kept < 256, "{v}");
    assert!(v["message"]["content"].as_str().unwrap().contains('4'), "{v}");
    // `truncate: false` gives the error instead.
    let (status, text) = server.post(
        "/api/chat",
        &json!({"model": "qwen:ctx", "messages": messages, "stream": false, "truncate": false,
                "options": {"num_predict": 4}})
        .to_string(),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("context"), "{text}");

    // `num_ctx` above the server's default is honoured: the whole conversation is read.
    let v = server.post_ok(
        "/api/chat",
        &json!({"model": "qwen:ctx", "messages": messages, "stream": false,
                "options": {"num_predict": 4, "temperature": 0.0, "num_ctx": 4096}}),
    );
    let whole = v["prompt_eval_count"].as_u64().unwrap();
    assert!(whole > 256 && whole > kept, "{v}");
    // And up to the model's own limit only: a larger one is the model's.
    let v = server.post_ok(
        "/api/chat",
        &json!({"model": "qwen:ctx", "messages": messages, "stream": false,
                "options": {"num_predict": 4, "temperature": 0.0, "num_ctx": 10_000_000}}),
    );
    assert_eq!(v["prompt_eval_count"].as_u64().unwrap(), whole, "{v}");
    // A small `num_ctx` bounds the reply too: prompt and reply together stay within it.
    let v = server.post_ok(
        "/api/generate",
        &json!({"model": "qwen:ctx", "prompt": "Count from 1 to 100, comma separated.", "stream": false,
                "options": {"num_ctx": 64, "temperature": 0.0}}),
    );
    let total = v["prompt_eval_count"].as_u64().unwrap() + v["eval_count"].as_u64().unwrap();
    assert!(total <= 64, "{v}");
    assert_eq!(v["done_reason"], "length", "{v}");
}
