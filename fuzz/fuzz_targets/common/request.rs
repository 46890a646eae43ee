//! What the request-body targets share: a body goes through a route's serde types and its
//! conversion into the typed chat turn (`berth::fuzzing::request_turn`); a refusal must be a 4xx.
//! An accepted turn then goes through what the server does with it before the model's weights
//! matter: its inline images loaded, its `logit_bias` read against a Qwen-sized vocabulary, its
//! messages rendered with a real chat template (the Qwen3 tiny pack's) and mapped to harmony
//! messages (as for gpt-oss, short of the o200k vocabulary), and the grammar written for its
//! tools and response format in every chat format (short of compiling it against a vocabulary).

use std::sync::OnceLock;

use berth::fuzzing::{inline_images, request_turn, template_input, Route};
use berth::harmony::{conversation, HarmonyInput};
use berth::template::{ChatTemplate, RenderInput};
use berth::turn::{harmony_effort, ApiError};
use berth_chat::grammar::{for_request, Markers};
use berth_chat::{detect, ChatFormat, Detected, ParseStart, Reasoning};
use serde_json::Value;

/// The Qwen3 tiny pack's template (tools, thinking, images).
const QWEN3_TEMPLATE: &str = include_str!("../../../tests/fixtures/tiny-packs/qwen3.jinja");

fn template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| ChatTemplate::new(QWEN3_TEMPLATE).expect("the Qwen3 fixture template parses"))
}

/// Every chat format, with and without think tags, plus what the Qwen3 template is detected as.
fn formats() -> &'static [Detected] {
    static D: OnceLock<Vec<Detected>> = OnceLock::new();
    D.get_or_init(|| {
        let mut all = vec![detect(Some(QWEN3_TEMPLATE), |_| false)];
        for format in ChatFormat::BY_ID {
            for reasoning in [None, Some(Reasoning::ThinkTags)] {
                all.push(Detected { format, reasoning });
            }
        }
        all
    })
}

/// A 4xx, as every client mistake must be.
fn refused(route: Route, e: &ApiError) {
    assert!(
        e.status.is_client_error(),
        "{route:?}: a body was answered {}: {}",
        e.status,
        e.message
    );
}

/// Runs `body` through each route and what follows an accepted turn.
pub fn check(routes: &[Route], body: &[u8]) {
    for &route in routes {
        let turn = match request_turn(route, body) {
            Ok(turn) => turn,
            Err(e) => {
                refused(route, &e);
                continue;
            }
        };
        for image in inline_images(&turn) {
            if let Err(e) = image {
                refused(route, &e);
            }
        }
        if let Some(bias) = &turn.logit_bias {
            let _ = berth::sampling::parse_logit_bias(Some(bias), 151_936);
        }
        let tools = turn.constraints.parser_tools().map(<[Value]>::to_vec);
        if let Some((messages, extra)) = template_input(&turn) {
            let _ = template().render(&RenderInput {
                messages: messages.clone(),
                tools: tools.clone(),
                add_generation_prompt: true,
                extra: extra.clone(),
                bos_token: String::new(),
                eos_token: "<|im_end|>".into(),
            });
            match harmony_effort(&extra) {
                Ok(effort) => {
                    let _ = conversation(&HarmonyInput {
                        messages: &messages,
                        tools: tools.as_deref(),
                        effort,
                        date: Some("2026-01-01".into()),
                        add_generation_prompt: true,
                    });
                }
                Err(e) => refused(route, &e),
            }
        }
        for detected in formats() {
            // Each marker one token, as a real vocabulary has them.
            let markers = Markers::resolve(detected, |text| {
                vec![text
                    .bytes()
                    .fold(1_000u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))]
            })
            .expect("one id per marker");
            for (thinking, start) in [
                (false, ParseStart::Content),
                (true, ParseStart::Reasoning),
                (true, ParseStart::Content),
            ] {
                let _ = for_request(detected, &markers, &turn.constraints, true, thinking, start);
            }
        }
    }
}
