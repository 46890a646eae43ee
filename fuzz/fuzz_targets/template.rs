//! Fuzzes chat template rendering (`berth::template::ChatTemplate`) with hostile templates: the
//! input is the template source, rendered with a fixed conversation that has tools, tool calls
//! and tool results. Compiling and rendering must return a result or an error, never panic,
//! hang (MiniJinja's fuel and recursion limits) or exhaust memory.

#![no_main]

use std::sync::OnceLock;

use berth::template::{ChatTemplate, RenderInput};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn input() -> &'static RenderInput {
    static INPUT: OnceLock<RenderInput> = OnceLock::new();
    INPUT.get_or_init(|| {
        let messages = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Zürich?"}]}),
            json!({"role": "assistant", "content": "<think>\nLook it up.\n</think>\n", "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"days\": 3}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"clear\"}"}),
            json!({"role": "assistant", "content": "Clear skies."}),
            json!({"role": "user", "content": "And tomorrow? \"quoted\" {{ not a tag }}"}),
        ];
        let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": ["integer", "null"]}, "opts": {"type": "object", "properties": {"units": {"enum": ["c", "f"]}}}},
            "required": ["city"]}}});
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), true.into());
        RenderInput {
            messages,
            tools: Some(vec![tool]),
            add_generation_prompt: true,
            extra,
            bos_token: "<bos>".into(),
            eos_token: "<eos>".into(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let source = String::from_utf8_lossy(data);
    if let Ok(template) = ChatTemplate::new(source) {
        if let Err(e) = template.render(input()) {
            assert!(!e.to_string().is_empty());
        }
    }
});
