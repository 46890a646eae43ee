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

use std::fmt;

use serde_json::{json, Map, Value};

use crate::format::{ChatFormat, Detected, ParseStart, Reasoning};
use crate::formats::harmony::{ANALYSIS, ASSISTANT_HEADER};
use crate::formats::{self, Format};
use crate::request::{ParamError, RequestConstraints, ResponseFormat, ToolChoice, ToolSpec};

/// A marker the format needs that the vocabulary does not hold as exactly one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkerError {
    /// The marker's text (`<tool_call>`).
    pub marker: String,
    /// The ids it encodes to (none, or more than one).
    pub ids: Vec<u32>,
}

impl fmt::Display for MarkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "marker {:?} is {} tokens ({:?}), not one",
            self.marker,
            self.ids.len(),
            self.ids
        )
    }
}

impl std::error::Error for MarkerError {}

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
    pub fn resolve(detected: &Detected, encode: impl Fn(&str) -> Vec<u32>) -> Result<Markers, MarkerError> {
        let one = |text: &str| -> Result<u32, MarkerError> {
            match encode(text).as_slice() {
                [id] => Ok(*id),
                ids => Err(MarkerError {
                    marker: text.to_owned(),
                    ids: ids.to_vec(),
                }),
            }
        };
        let pair = |(a, b): (&str, &str)| -> Result<(u32, u32), MarkerError> { Ok((one(a)?, one(b)?)) };
        let names = formats::of(detected.format).markers();
        Ok(Markers {
            think: detected
                .reasoning
                .and_then(Reasoning::markers)
                .map(pair)
                .transpose()?,
            tool: names.tool.map(pair).transpose()?,
            quote: names.quote.map(one).transpose()?,
            harmony: match names.harmony {
                Some(h) => Some([one(h[0])?, one(h[1])?, one(h[2])?, one(h[3])?, one(h[4])?]),
                None => None,
            },
        })
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

    /// The tool-call open and close as grammar tokens; an error for a format without them.
    pub(crate) fn tool_tokens(&self, format: &str) -> Result<(String, String), ParamError> {
        let (open, close) = self
            .tool
            .ok_or_else(|| param_err(format!("format {format} has no tool-call markers")))?;
        Ok((tok(open), tok(close)))
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
pub(crate) fn compact_json_rule(schema: &Value) -> String {
    format!("%json {}", with_guidance(schema, (",", ":")))
}

/// A Lark string literal.
pub(crate) fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("string serializes")
}

pub(crate) fn tok(id: u32) -> String {
    format!("<[{id}]>")
}

/// Grammar text under construction: named rules, in order.
pub(crate) struct Lark {
    rules: Vec<String>,
}

impl Lark {
    /// Adds a rule; a name already defined keeps its first definition (shared helpers).
    pub(crate) fn rule(&mut self, name: &str, body: impl AsRef<str>) {
        let head = format!("{name}: ");
        if !self.rules.iter().any(|r| r.starts_with(&head)) {
            self.rules.push(format!("{head}{}", body.as_ref()));
        }
    }
}

pub(crate) fn param_err(msg: impl Into<String>) -> ParamError {
    ParamError {
        param: "tool_choice".into(),
        message: msg.into(),
    }
}

/// The grammar a request gets in the detected format, or `None` when nothing is constrained.
/// `tools_enabled`: whether the model may call tools at all; `thinking`: whether the template was
/// rendered with thinking on; `start`: the prefill state. A forced call (`required`, a named
/// function) on a model without a tool-call format is the client's error.
pub fn for_request(
    detected: &Detected,
    markers: &Markers,
    req: &RequestConstraints,
    tools_enabled: bool,
    thinking: bool,
    start: ParseStart,
) -> Result<Option<String>, ParamError> {
    let tools_usable = tools_enabled && detected.format != ChatFormat::ContentOnly;
    let forced = matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Named(_));
    if forced && !tools_usable {
        return Err(ParamError {
            param: "tool_choice".into(),
            message: format!(
                "this model has no tool-call format (chat format {}, tools {}): only \"none\" or \"auto\" is possible",
                detected.format,
                if tools_enabled { "enabled" } else { "disabled" }
            ),
        });
    }
    let plan = Plan::new(req, tools_usable);
    if plan.is_free() {
        return Ok(None);
    }
    write(detected, markers, &plan, thinking, start).map(Some)
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
    let body = body(&mut g, formats::of(detected.format), markers, plan)?;
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
            let tail = format!("TEXT {} {} {}", tok(end), tok(startm), lit(ASSISTANT_HEADER));
            g.rule(
                "think",
                format!("{} {} {} {tail}", tok(channel), lit(ANALYSIS), tok(message)),
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

/// The content rule: free text (that cannot open a call) or JSON.
pub(crate) fn content(g: &mut Lark, format: &dyn Format, plan: &Plan) -> String {
    match &plan.content {
        ResponseFormat::Text => format.text_grammar(g),
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
fn body(g: &mut Lark, format: &dyn Format, markers: &Markers, plan: &Plan) -> Result<String, ParamError> {
    if let Some(body) = format.body_grammar(g, markers, plan) {
        return body;
    }
    if plan.calls == Calls::Never {
        return Ok(content(g, format, plan));
    }
    if plan.tools.is_empty() {
        return Err(param_err("no declared tool can be called"));
    }
    let calls = format
        .call_grammar(g, markers, plan)
        .unwrap_or_else(|| Err(param_err(format!("format {} has no call markup", format.name()))))?;
    Ok(match (plan.calls, &plan.content) {
        (Calls::Forced, _) => calls,
        (_, ResponseFormat::Text) => format.text_then_calls(g, &calls, plan),
        _ => format!("({} | {calls})", content(g, format, plan)),
    })
}

/// Writes a rule `call_I` per tool the plan allows (its body from `call`) and `call_body`, their
/// alternatives.
pub(crate) fn call_alternatives(
    g: &mut Lark,
    plan: &Plan,
    mut call: impl FnMut(&mut Lark, usize, &ToolSpec) -> Result<String, ParamError>,
) -> Result<(), ParamError> {
    let mut alts = Vec::new();
    for (i, tool) in plan.tools.iter().enumerate() {
        let name = format!("call_{i}");
        let body = call(g, i, tool)?;
        g.rule(&name, body);
        alts.push(name);
    }
    g.rule("call_body", alts.join(" | "));
    Ok(())
}

/// The calls of a format that writes each between its tool-call tokens: a rule per tool (its
/// body from `call`), then `wrap` (given the open and close tokens) writes the rule `call` and
/// returns the calls rule.
pub(crate) fn token_wrapped_calls(
    g: &mut Lark,
    markers: &Markers,
    plan: &Plan,
    format: &str,
    call: impl FnMut(&mut Lark, usize, &ToolSpec) -> Result<String, ParamError>,
    wrap: impl FnOnce(&mut Lark, &str, &str) -> String,
) -> Result<String, ParamError> {
    let (open, close) = markers.tool_tokens(format)?;
    call_alternatives(g, plan, call)?;
    Ok(wrap(g, &open, &close))
}

/// Writes the rule `call` and returns the calls rule: one call, or with parallel calls several,
/// joined by `separator` (`None`: written back to back).
///
/// The end of the turn is reachable after every complete call, also after the separator that
/// would lead to the next one: a model that writes the separator after its call (as Qwen's
/// templates separate calls, so it is likely) must still be free to stop, or under `required` it
/// could only call again until `max_tokens` (or forever without it). A call identical to an
/// earlier one may still follow: the grammar cannot tell a repeat from a second roll of the dice,
/// and OpenAI's parallel calls allow the same call twice.
pub(crate) fn repeated(g: &mut Lark, call: &str, separator: Option<&str>, plan: &Plan) -> String {
    g.rule("call", call);
    match (plan.parallel, separator) {
        (false, _) => "call".into(),
        (true, Some(sep)) => format!("call ({sep} call)* {sep}?"),
        (true, None) => "call+".into(),
    }
}

/// The properties of an object schema, in order, with whether each is required.
pub(crate) fn properties(schema: &Value) -> Vec<(String, Value, bool)> {
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

/// Parameters one after another in schema order (an optional one may be left out), each written
/// by `param` (given its key, its schema and the rule name for its value); the rule `args_CALL`.
pub(crate) fn params_in_order(
    g: &mut Lark,
    call: usize,
    schema: &Value,
    mut param: impl FnMut(&mut Lark, &str, &Value, &str) -> String,
) -> String {
    let mut parts = Vec::new();
    for (j, (key, s, req)) in properties(schema).iter().enumerate() {
        let p = param(g, key, s, &format!("v_{call}_{j}"));
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

/// The values of a schema's `enum`, when every one is a string.
pub(crate) fn string_enum(schema: &Value) -> Option<Vec<&str>> {
    schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.iter().map(Value::as_str).collect())
}

/// Keyword arguments: the required ones in schema order, then each optional one may follow.
pub(crate) fn kwargs(
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
