//! Lark grammars (llguidance dialect) for a request, written in the model's own chat markup.
//!
//! A grammar is `[reasoning] body`. The reasoning part follows the template: with thinking on the
//! model may open its block first, with thinking off it may not, and when the prompt already
//! opened one the grammar starts inside it (whatever the thinking flag says, so a template that
//! forces the block open never makes the constraint reject its own prefill). The body is the
//! content (free text, or JSON for `response_format`) and/or the tool calls that `tool_choice`
//! allows. Markers that are single tokens are written by id (`<[151657]>`); free text never
//! produces such tokens, which is what keeps `none` from opening a call. Argument values follow
//! each tool's parameter schema through llguidance's `%json {..}` embedding, with fixed
//! separators so the model cannot loop on whitespace.

use anyhow::{bail, Result};
use serde_json::{json, Map, Value};

use super::request::{RequestConstraints, ResponseFormat, ToolChoice, ToolSpec};
use super::ParamError;
use crate::chat::{ChatFormat, Detected, ParseStart, Reasoning};

/// The single-token markers of one chat format, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Markers {
    /// Reasoning open and close (`<think>`/`</think>`, `<|channel>`/`<channel|>`).
    pub think: Option<(u32, u32)>,
    /// Tool-call open and close (`<tool_call>`/`</tool_call>`, `<|tool_call>`/`<tool_call|>`,
    /// `<|tool_call_start|>`/`<|tool_call_end|>`).
    pub tool: Option<(u32, u32)>,
    /// Gemma 4's string delimiter `<|"|>`.
    pub quote: Option<u32>,
    /// Harmony: `<|channel|>`, `<|message|>`, `<|constrain|>`, `<|end|>`, `<|start|>`.
    pub harmony: Option<[u32; 5]>,
}

impl Markers {
    /// Looks up each marker the format needs; each must encode to exactly one token.
    pub fn resolve(detected: &Detected, encode: impl Fn(&str) -> Vec<u32>) -> Result<Markers> {
        let one = |text: &str| -> Result<u32> {
            match encode(text).as_slice() {
                [id] => Ok(*id),
                ids => bail!("marker {text:?} is {} tokens ({ids:?}), not one", ids.len()),
            }
        };
        let pair = |a: &str, b: &str| -> Result<(u32, u32)> { Ok((one(a)?, one(b)?)) };
        let mut m = Markers {
            think: match detected.reasoning {
                Some(Reasoning::ThinkTags) => Some(pair("<think>", "</think>")?),
                Some(Reasoning::Gemma4Thought) => Some(pair("<|channel>", "<channel|>")?),
                Some(Reasoning::HarmonyAnalysis) | None => None,
            },
            ..Markers::default()
        };
        match detected.format {
            ChatFormat::HermesJson | ChatFormat::QwenXml => {
                m.tool = Some(pair("<tool_call>", "</tool_call>")?)
            }
            ChatFormat::Gemma4 => {
                m.tool = Some(pair("<|tool_call>", "<tool_call|>")?);
                m.quote = Some(one("<|\"|>")?);
            }
            ChatFormat::Lfm2Pythonic => m.tool = Some(pair("<|tool_call_start|>", "<|tool_call_end|>")?),
            ChatFormat::Harmony => {
                m.harmony = Some([
                    one("<|channel|>")?,
                    one("<|message|>")?,
                    one("<|constrain|>")?,
                    one("<|end|>")?,
                    one("<|start|>")?,
                ])
            }
            // MiniCPM5's `<function name=..>` markup is plain text, not special tokens: no markers.
            ChatFormat::ContentOnly | ChatFormat::MiniCpmXml => {}
        }
        Ok(m)
    }

    /// Every marker id.
    pub fn ids(&self) -> Vec<u32> {
        let pairs = [self.think, self.tool]
            .into_iter()
            .flatten()
            .flat_map(|(a, b)| [a, b]);
        pairs
            .chain(self.quote)
            .chain(self.harmony.into_iter().flatten())
            .collect()
    }
}

/// Whether and how calls are allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calls {
    /// No call (the opener is banned).
    Never,
    /// Content, or calls once the opener appears.
    Optional,
    /// Calls only.
    Forced,
}

/// What the grammar has to allow, decided from the request.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The functions a call may name.
    pub tools: Vec<ToolSpec>,
    /// Whether calls are allowed or forced.
    pub calls: Calls,
    /// Whether more than one call may be made.
    pub parallel: bool,
    /// The content's format.
    pub content: ResponseFormat,
    /// Whether the request declared tools at all (then `none` needs a grammar to ban calls).
    pub has_tools: bool,
}

impl Plan {
    /// The plan for a request; `tools_usable` is false for a model that cannot call tools.
    ///
    /// A named `tool_choice` means exactly one call of that function, as OpenAI serves it, so it
    /// is planned as a single call whatever `parallel_tool_calls` says: the grammar then ends
    /// after the call, and only the end of the turn may follow.
    pub fn new(req: &RequestConstraints, tools_usable: bool) -> Plan {
        let (calls, tools) = match (&req.tool_choice, tools_usable && !req.tools.is_empty()) {
            (_, false) | (ToolChoice::None, _) => (Calls::Never, Vec::new()),
            (ToolChoice::Auto, true) => (Calls::Optional, req.tools.clone()),
            (ToolChoice::Required, true) => (Calls::Forced, req.tools.clone()),
            (ToolChoice::Named(n), true) => (
                Calls::Forced,
                req.tools.iter().filter(|t| &t.name == n).cloned().collect(),
            ),
        };
        Plan {
            tools,
            calls,
            parallel: req.parallel_tool_calls && !matches!(req.tool_choice, ToolChoice::Named(_)),
            content: req.response_format.clone(),
            has_tools: tools_usable && !req.tools.is_empty(),
        }
    }

    /// Whether nothing needs constraining.
    pub fn is_free(&self) -> bool {
        self.content == ResponseFormat::Text && self.calls == Calls::Never && !self.has_tools
    }
}

/// The embedding options every schema gets: fixed separators, no free whitespace.
fn with_guidance(schema: &Value, separators: (&str, &str)) -> Value {
    let mut s = match schema {
        Value::Object(o) => o.clone(),
        _ => Map::new(),
    };
    s.insert(
        "x-guidance".into(),
        json!({"whitespace_flexible": false, "item_separator": separators.0, "key_separator": separators.1}),
    );
    Value::Object(s)
}

/// `%json {..}` for a schema, with `, ` and `: ` between items and after keys (as Python's
/// `json.dumps` and the chat templates' `tojson` write JSON).
pub fn json_rule(schema: &Value) -> String {
    format!("%json {}", with_guidance(schema, (", ", ": ")))
}

/// `%json {..}` for a schema, written compactly (`{"a":1,"b":2}`): harmony call arguments, as
/// OpenAI's docs and API write them.
fn compact_json_rule(schema: &Value) -> String {
    format!("%json {}", with_guidance(schema, (",", ":")))
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("string serializes")
}

fn tok(id: u32) -> String {
    format!("<[{id}]>")
}

/// Grammar text under construction: named rules, in order.
struct Lark {
    rules: Vec<String>,
}

impl Lark {
    /// Adds a rule; a name already defined keeps its first definition (shared helpers).
    fn rule(&mut self, name: &str, body: impl AsRef<str>) {
        let head = format!("{name}: ");
        if !self.rules.iter().any(|r| r.starts_with(&head)) {
            self.rules.push(format!("{head}{}", body.as_ref()));
        }
    }
}

fn param_err(msg: impl Into<String>) -> ParamError {
    ParamError {
        param: "tool_choice".into(),
        message: msg.into(),
    }
}

/// Writes the grammar for a plan.
pub fn write(
    detected: &Detected,
    markers: &Markers,
    plan: &Plan,
    thinking: bool,
    start: ParseStart,
) -> Result<String, ParamError> {
    let mut g = Lark { rules: Vec::new() };
    g.rule("TEXT", "/(?s:.*)/");
    let body = body(&mut g, detected.format, markers, plan)?;
    let reasoning = reasoning(&mut g, detected, markers, thinking, start);
    let start_rule = match reasoning {
        Some(r) => format!("{r} {body}"),
        None => body,
    };
    let mut out = format!("%llguidance {{}}\nstart: {start_rule}\n");
    for r in g.rules {
        out.push_str(&r);
        out.push('\n');
    }
    Ok(out)
}

/// The reasoning prefix, if any: a block the model may open, or the rest of one the prompt opened.
fn reasoning(
    g: &mut Lark,
    detected: &Detected,
    markers: &Markers,
    thinking: bool,
    start: ParseStart,
) -> Option<String> {
    let inside = start == ParseStart::Reasoning;
    if !inside && (!thinking || start == ParseStart::ReasoningClosed) {
        return None;
    }
    match detected.reasoning? {
        Reasoning::ThinkTags => {
            let (open, close) = markers.think?;
            g.rule("AFTER_THINK", "/\\n{0,2}/");
            if inside {
                g.rule("think_rest", format!("TEXT {} AFTER_THINK", tok(close)));
                Some("think_rest".into())
            } else {
                g.rule("think", format!("{} TEXT {} AFTER_THINK", tok(open), tok(close)));
                Some("think?".into())
            }
        }
        Reasoning::Gemma4Thought => {
            let (open, close) = markers.think?;
            if inside {
                g.rule("think_rest", format!("TEXT {}", tok(close)));
                Some("think_rest".into())
            } else {
                g.rule("think", format!("{} TEXT {}", tok(open), tok(close)));
                Some("think?".into())
            }
        }
        Reasoning::HarmonyAnalysis => {
            // Any number of analysis messages, each ended by `<|end|>` and the next
            // `<|start|>assistant` (`<|end|>` is not a stop token: the turn goes on).
            let [channel, message, _, end, startm] = markers.harmony?;
            let tail = format!("TEXT {} {} \"assistant\"", tok(end), tok(startm));
            g.rule(
                "think",
                format!("{} \"analysis\" {} {tail}", tok(channel), tok(message)),
            );
            if inside {
                g.rule("think_rest", tail);
                Some("think_rest think*".into())
            } else {
                Some("think*".into())
            }
        }
    }
}

/// The content rule: free text or JSON.
fn content(g: &mut Lark, plan: &Plan) -> String {
    match &plan.content {
        ResponseFormat::Text => "TEXT".into(),
        ResponseFormat::JsonObject => {
            g.rule("content_json", json_rule(&json!({"type": "object"})));
            "content_json".into()
        }
        ResponseFormat::JsonSchema(s) => {
            g.rule("content_json", json_rule(s));
            "content_json".into()
        }
    }
}

/// The body after any reasoning: content and/or calls.
fn body(g: &mut Lark, format: ChatFormat, markers: &Markers, plan: &Plan) -> Result<String, ParamError> {
    if format == ChatFormat::Harmony {
        return harmony_body(g, markers, plan);
    }
    if plan.calls == Calls::Never {
        return Ok(content(g, plan));
    }
    if plan.tools.is_empty() {
        return Err(param_err("no declared tool can be called"));
    }
    let calls = calls(g, format, markers, plan)?;
    Ok(match (plan.calls, &plan.content) {
        (Calls::Forced, _) => calls,
        // Free text, then (once the opener appears) the calls.
        (_, ResponseFormat::Text) => format!("TEXT ({calls})?"),
        _ => format!("({} | {calls})", content(g, plan)),
    })
}

/// The `calls` rule: one call, or several in the format's own joining.
fn calls(g: &mut Lark, format: ChatFormat, markers: &Markers, plan: &Plan) -> Result<String, ParamError> {
    let (open, close) = markers
        .tool
        .ok_or_else(|| param_err(format!("format {format} has no tool-call markers")))?;
    let mut alts = Vec::new();
    for (i, tool) in plan.tools.iter().enumerate() {
        let name = format!("call_{i}");
        let body = match format {
            ChatFormat::HermesJson => format!(
                "{} {} {}",
                lit(&format!("{{\"name\": \"{}\", \"arguments\": ", tool.name)),
                json_rule(&tool.parameters),
                lit("}"),
            ),
            ChatFormat::QwenXml => format!(
                "{} {} {}",
                lit(&format!("\n<function={}>\n", tool.name)),
                xml_params(g, i, &tool.parameters),
                lit("</function>\n"),
            ),
            ChatFormat::Lfm2Pythonic => format!(
                "{} {} {}",
                lit(&format!("{}(", tool.name)),
                kwargs(g, i, &tool.parameters, ", ", |g, key, schema, j| {
                    let v = format!("v_{i}_{j}");
                    g.rule(&v, json_rule(schema));
                    format!("{} {v}", lit(&format!("{key}=")))
                }),
                lit(")"),
            ),
            ChatFormat::Gemma4 => {
                let q = markers
                    .quote
                    .ok_or_else(|| param_err("gemma4 needs the <|\"|> token"))?;
                format!(
                    "{} {} {}",
                    lit(&format!("call:{}{{", tool.name)),
                    kwargs(g, i, &tool.parameters, ",", |g, key, schema, j| {
                        let v = format!("v_{i}_{j}");
                        let value = gemma_value(g, &v, schema, q, 0);
                        format!("{} {value}", lit(&format!("{key}:")))
                    }),
                    lit("}"),
                )
            }
            ChatFormat::Harmony | ChatFormat::ContentOnly | ChatFormat::MiniCpmXml => {
                return Err(param_err(format!("format {format} has no call markup")))
            }
        };
        g.rule(&name, body);
        alts.push(name);
    }
    g.rule("call_body", alts.join(" | "));
    let (open, close) = (tok(open), tok(close));
    Ok(match format {
        ChatFormat::HermesJson => {
            g.rule("call", format!("{open} \"\\n\" call_body \"\\n\" {close}"));
            if plan.parallel {
                "call (\"\\n\" call)*".into()
            } else {
                "call".into()
            }
        }
        ChatFormat::QwenXml => {
            g.rule("call", format!("{open} call_body {close}"));
            if plan.parallel {
                "call (\"\\n\" call)*".into()
            } else {
                "call".into()
            }
        }
        ChatFormat::Lfm2Pythonic => {
            let list = if plan.parallel {
                "call_body (\", \" call_body)*"
            } else {
                "call_body"
            };
            g.rule("call", format!("{open} \"[\" {list} \"]\" {close}"));
            "call".into()
        }
        _ => {
            g.rule("call", format!("{open} call_body {close}"));
            if plan.parallel {
                "call+".into()
            } else {
                "call".into()
            }
        }
    })
}

/// The properties of an object schema, in order, with whether each is required.
fn properties(schema: &Value) -> Vec<(String, Value, bool)> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .map(|(k, v)| (k.clone(), v.clone(), required.contains(&k.as_str())))
                .collect()
        })
        .unwrap_or_default()
}

/// Keyword arguments: the required ones in schema order, then each optional one may follow.
fn kwargs(
    g: &mut Lark,
    call: usize,
    schema: &Value,
    sep: &str,
    mut arg: impl FnMut(&mut Lark, &str, &Value, usize) -> String,
) -> String {
    let props = properties(schema);
    let mut required = Vec::new();
    let mut optional = Vec::new();
    for (j, (key, s, req)) in props.iter().enumerate() {
        let a = arg(g, key, s, j);
        if *req {
            required.push(a);
        } else {
            optional.push(a);
        }
    }
    let sep = lit(sep);
    let mut out = required.join(&format!(" {sep} "));
    for a in optional {
        if out.is_empty() {
            out = format!("({a})?");
        } else {
            out = format!("{out} ({sep} {a})?");
        }
    }
    let name = format!("args_{call}");
    g.rule(&name, if out.is_empty() { "\"\"".into() } else { out });
    name
}

/// Qwen XML parameters: strings raw (up to the closing tag), every other type as JSON.
fn xml_params(g: &mut Lark, call: usize, schema: &Value) -> String {
    let close = lit("\n</parameter>\n");
    let props = properties(schema);
    let mut parts = Vec::new();
    for (j, (key, s, req)) in props.iter().enumerate() {
        let v = format!("v_{call}_{j}");
        let open = lit(&format!("<parameter={key}>\n"));
        let strings: Option<Vec<&str>> = s
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.iter().map(Value::as_str).collect());
        let p = if let Some(options) = strings {
            // Raw text, as the template writes strings: one of the enum's values.
            let alts: Vec<String> = options.iter().map(|o| lit(o)).collect();
            g.rule(&v, alts.join(" | "));
            format!("{open} {v} {close}")
        } else if s.get("type").and_then(Value::as_str) == Some("string") {
            // Lazy: the value ends at the first closing tag, which the rule includes.
            g.rule(&format!("{v}[suffix={close}]"), "/(?s:.*)/");
            format!("{open} {v}")
        } else {
            g.rule(&v, json_rule(s));
            format!("{open} {v} {close}")
        };
        parts.push(if *req { p } else { format!("({p})?") });
    }
    let name = format!("args_{call}");
    g.rule(
        &name,
        if parts.is_empty() {
            "\"\"".into()
        } else {
            parts.join(" ")
        },
    );
    name
}

/// A Gemma 4 value: strings between `<|"|>` tokens, bare keys, JSON numbers and literals.
fn gemma_value(g: &mut Lark, name: &str, schema: &Value, quote: u32, depth: usize) -> String {
    let ty = schema.get("type").and_then(Value::as_str);
    let q = tok(quote);
    let body = if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        let alts: Vec<String> = options
            .iter()
            .map(|o| match o {
                Value::String(s) => format!("{q} {} {q}", lit(s)),
                other => lit(&other.to_string()),
            })
            .collect();
        format!("({})", alts.join(" | "))
    } else {
        match ty {
            Some("string") => {
                g.rule("GEMMA_STR", "/[^<]*/");
                format!("{q} GEMMA_STR {q}")
            }
            Some("object") if depth < 4 => {
                let props = properties(schema);
                let mut req = Vec::new();
                let mut opt = Vec::new();
                for (j, (k, s, r)) in props.iter().enumerate() {
                    let v = format!("{name}_{j}");
                    let val = gemma_value(g, &v, s, quote, depth + 1);
                    let a = format!("{} {val}", lit(&format!("{k}:")));
                    if *r {
                        req.push(a)
                    } else {
                        opt.push(a)
                    }
                }
                let mut inner = req.join(" \",\" ");
                for a in opt {
                    inner = if inner.is_empty() {
                        format!("({a})?")
                    } else {
                        format!("{inner} (\",\" {a})?")
                    };
                }
                format!(
                    "\"{{\" {} \"}}\"",
                    if inner.is_empty() { "\"\"".into() } else { inner }
                )
            }
            Some("array") if depth < 4 => {
                let item = format!("{name}_i");
                let items = schema.get("items").cloned().unwrap_or(json!({}));
                let v = gemma_value(g, &item, &items, quote, depth + 1);
                format!("\"[\" ({v} (\",\" {v})*)? \"]\"")
            }
            Some("integer") | Some("number") | Some("boolean") | Some("null") => {
                let v = format!("{name}_j");
                g.rule(&v, json_rule(schema));
                v
            }
            _ => {
                g.rule("GEMMA_STR", "/[^<]*/");
                g.rule(
                    "gemma_any",
                    format!(
                        "{q} GEMMA_STR {q} | /-?[0-9]+(\\.[0-9]+)?/ | \"true\" | \"false\" | \"null\" | \"{{\" (GEMMA_KEY \":\" gemma_any (\",\" GEMMA_KEY \":\" gemma_any)*)? \"}}\" | \"[\" (gemma_any (\",\" gemma_any)*)? \"]\""
                    ),
                );
                g.rule("GEMMA_KEY", "/[A-Za-z_][A-Za-z0-9_]*/");
                "gemma_any".into()
            }
        }
    };
    g.rule(name, body);
    name.into()
}

/// Harmony (spec §1.5): the answer is a `final` message, a call a message to
/// `functions.NAME` whose body is the arguments. The recipient may sit in the channel part
/// (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`, as OpenAI's docs write
/// it) or in the role part (` to=functions.NAME<|channel|>commentary json<|message|>`, as the
/// chat template renders past calls), on `commentary` or `analysis`, with or without a content
/// type: the grammar allows every form the parser reads. A user-visible preamble (`commentary`
/// without recipient) may precede a call. A JSON `response_format` constrains the `final` body
/// only (analysis stays free); the header may carry ` <|constrain|>json`, which llama.cpp also
/// allows, though OpenAI's docs and vLLM's grammar have the model write none. Arguments are
/// compact JSON (`{"city":"Paris"}`), as in OpenAI's docs and the arguments its API returns.
///
/// One call per turn whatever `parallel_tool_calls` says: harmony ends the turn at `<|call|>`
/// (a stop token) and the grammar ends with the arguments, so `true` and `false` both hold (the
/// client sends the result and the model may call again in the next turn).
fn harmony_body(g: &mut Lark, markers: &Markers, plan: &Plan) -> Result<String, ParamError> {
    let [channel, message, constrain, end, start] = markers
        .harmony
        .ok_or_else(|| param_err("harmony markers are missing"))?;
    let (channel, message, constrain) = (tok(channel), tok(message), tok(constrain));
    // ` <|constrain|>json`, `<|constrain|>json` or ` json`.
    g.rule("json_type", format!("(\" \"? {constrain} | \" \") \"json\""));
    let content = content(g, plan);
    let final_type = match plan.content {
        ResponseFormat::Text => "",
        _ => "json_type?",
    };
    g.rule(
        "final",
        format!("{channel} \"final\" {final_type} {message} {content}"),
    );
    if plan.calls == Calls::Never {
        return Ok("final".into());
    }
    if plan.tools.is_empty() {
        return Err(param_err("no declared tool can be called"));
    }
    g.rule(
        "preamble",
        format!(
            "{channel} \"commentary\" {message} TEXT {} {} \"assistant\"",
            tok(end),
            tok(start)
        ),
    );
    g.rule("call_channel", "\"commentary\" | \"analysis\"");
    let mut alts = Vec::new();
    for (i, tool) in plan.tools.iter().enumerate() {
        let name = format!("call_{i}");
        let to = lit(&format!(" to=functions.{}", tool.name));
        g.rule(
            &name,
            format!(
                "({channel} call_channel {to} | {to} {channel} call_channel) json_type? {message} {}",
                compact_json_rule(&tool.parameters)
            ),
        );
        alts.push(name);
    }
    g.rule("call", format!("preamble? ({})", alts.join(" | ")));
    Ok(match plan.calls {
        Calls::Forced => "call".into(),
        _ => "(final | call)".into(),
    })
}
