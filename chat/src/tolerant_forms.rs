//! Tool calls written without the chat format's markup, as small models write them under
//! `tool_choice: "auto"`: the corpus the tolerant parser's unit tests and the end-to-end test
//! (host/tests/serve_tolerant.rs) share. Each form is read the same in `hermes_json` and
//! `qwen_xml`, with the tools `get_weather(location)` and `get_time(tz)` offered.

/// A form as the model writes it, the content and the calls (name, arguments) it must give.
pub type Form = (
    &'static str,
    Option<&'static str>,
    Vec<(&'static str, &'static str)>,
);

/// Every bare form: (output, content, calls).
pub fn bare_forms() -> Vec<Form> {
    let lima = ("get_weather", r#"{"location": "Lima"}"#);
    let cet = ("get_time", r#"{"tz": "CET"}"#);
    vec![
        (r#"{"name": "get_weather", "arguments": {"location": "Lima"}}"#, None, vec![lima]),
        ("```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}\n```", None, vec![lima]),
        ("```\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}\n```", None, vec![lima]),
        ("```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}", None, vec![lima]),
        (
            r#"[{"name": "get_weather", "arguments": {"location": "Lima"}}, {"name": "get_time", "arguments": {"tz": "CET"}}]"#,
            None,
            vec![lima, cet],
        ),
        (
            "```json\n[\n  {\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n]\n```",
            None,
            vec![cet],
        ),
        (
            "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}\n{\"name\": \"get_time\", \"parameters\": {\"tz\": \"CET\"}}",
            None,
            vec![lima, cet],
        ),
        (r#"{"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}"#, None, vec![cet]),
        (
            r#"{"type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}"#,
            None,
            vec![cet],
        ),
        (
            "Sure, let me check the weather.\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}",
            Some("Sure, let me check the weather."),
            vec![lima],
        ),
        (
            "I'll call the tool:\n\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}\n```",
            Some("I'll call the tool:"),
            vec![lima],
        ),
        ("<tools>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tools>", None, vec![cet]),
        (
            "<function_call>{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}</function_call>",
            None,
            vec![cet],
        ),
        ("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}", None, vec![cet]),
        ("{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>", None, vec![cet]),
    ]
}
