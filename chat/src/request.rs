//! The request's tool and format parameters, parsed and validated (OpenAI and Ollama shapes).
//! `null` means unset everywhere; every error names the parameter it is about.

use std::fmt;

use serde_json::Value;

/// A client error in a request parameter: becomes HTTP 400 with an OpenAI error body naming `param`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError {
    /// The parameter at fault, as the client spelled it (`tool_choice`, `tools[0].function.name`).
    pub param: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.param, self.message)
    }
}

impl std::error::Error for ParamError {}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// The JSON schema of its arguments (an empty object schema when the tool gave none).
    pub parameters: Value,
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool.
    None,
    /// Free text or calls, as the model likes.
    Auto,
    /// At least one call.
    Required,
    /// Exactly this function.
    Named(String),
}

/// What `response_format` (or Ollama's `format`) asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON following this schema.
    JsonSchema(Value),
}

/// The request's tool/format parameters, validated (null = unset everywhere).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestConstraints {
    /// The declared tools, in request order.
    pub tools: Vec<ToolSpec>,
    /// The tools as the chat parser and the template take them: name, description and
    /// parameters, without transport keys such as `strict` (see `described_tool`).
    pub tools_json: Vec<Value>,
    /// The effective tool choice (`auto` with tools, `none` without, when unset).
    pub tool_choice: ToolChoice,
    /// Whether several calls may be made in one turn.
    pub parallel_tool_calls: bool,
    /// The content format.
    pub response_format: ResponseFormat,
}

impl Default for RequestConstraints {
    fn default() -> Self {
        RequestConstraints {
            tools: Vec::new(),
            tools_json: Vec::new(),
            tool_choice: ToolChoice::None,
            parallel_tool_calls: true,
            response_format: ResponseFormat::Text,
        }
    }
}

/// `None` for an absent or null value.
fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn err(param: &str, message: impl Into<String>) -> ParamError {
    ParamError {
        param: param.to_owned(),
        message: message.into(),
    }
}

impl RequestConstraints {
    /// Parses the OpenAI fields as sent (raw JSON values; None or Null = absent).
    pub fn from_openai(
        tools: Option<&Value>,
        tool_choice: Option<&Value>,
        parallel_tool_calls: Option<&Value>,
        response_format: Option<&Value>,
    ) -> Result<Self, ParamError> {
        let (tools, tools_json) = parse_tools(tools)?;
        let tool_choice = parse_tool_choice(tool_choice, &tools)?;
        let parallel_tool_calls = match present(parallel_tool_calls) {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(err("parallel_tool_calls", "must be a boolean")),
        };
        let response_format = match present(response_format) {
            None => ResponseFormat::Text,
            Some(v) => parse_response_format(v)?,
        };
        Ok(RequestConstraints {
            tools,
            tools_json,
            tool_choice,
            parallel_tool_calls,
            response_format,
        })
    }

    /// Ollama: `format` ("json" or a schema) and `tools`.
    pub fn from_ollama(tools: Option<&Value>, format: Option<&Value>) -> Result<Self, ParamError> {
        let (tools, tools_json) = parse_tools(tools)?;
        let tool_choice = if tools.is_empty() {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        };
        let response_format = match present(format) {
            None => ResponseFormat::Text,
            Some(Value::String(s)) if s.is_empty() => ResponseFormat::Text,
            Some(Value::String(s)) if s == "json" => ResponseFormat::JsonObject,
            Some(Value::String(s)) => {
                return Err(err(
                    "format",
                    format!("must be \"json\" or a JSON schema, not \"{s}\""),
                ))
            }
            Some(v @ (Value::Object(_) | Value::Bool(true))) => ResponseFormat::JsonSchema(v.clone()),
            Some(_) => return Err(err("format", "must be \"json\" or a JSON schema object")),
        };
        Ok(RequestConstraints {
            tools,
            tools_json,
            tool_choice,
            parallel_tool_calls: true,
            response_format,
        })
    }

    /// Whether nothing is constrained (no tools in play, free-text content).
    pub fn is_unconstrained(&self) -> bool {
        self.response_format == ResponseFormat::Text
            && (self.tools.is_empty() || self.tool_choice == ToolChoice::None)
    }

    /// The tools the chat parser should recognise calls of: `None` when there are none or
    /// `tool_choice` is `none` (then whatever call-like text the model writes stays content).
    pub fn parser_tools(&self) -> Option<&[Value]> {
        (!self.tools_json.is_empty() && self.tool_choice != ToolChoice::None)
            .then_some(self.tools_json.as_slice())
    }
}

fn parse_tools(tools: Option<&Value>) -> Result<(Vec<ToolSpec>, Vec<Value>), ParamError> {
    let Some(tools) = present(tools) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let list = tools
        .as_array()
        .ok_or_else(|| err("tools", "must be an array of tools"))?;
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(list.len());
    let mut described = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        let obj = tool
            .as_object()
            .ok_or_else(|| err(&param, "a tool must be an object"))?;
        match obj.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "function" => {}
            Some(_) => {
                return Err(err(
                    &format!("{param}.type"),
                    "only \"function\" tools are supported",
                ))
            }
        }
        let function = obj
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| err(&format!("{param}.function"), "a tool needs a `function` object"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                err(
                    &format!("{param}.function.name"),
                    "a function needs a non-empty name",
                )
            })?;
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
            return Err(err(
                &format!("{param}.function.name"),
                format!("'{name}': a function name may hold only letters, digits, '_', '-' and '.'"),
            ));
        }
        if specs.iter().any(|s| s.name == name) {
            return Err(err(
                &format!("{param}.function.name"),
                format!("'{name}' is declared twice"),
            ));
        }
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(err(
                    &format!("{param}.function.parameters"),
                    "must be a JSON schema object",
                ))
            }
        };
        specs.push(ToolSpec {
            name: name.to_owned(),
            parameters,
        });
        described.push(described_tool(function));
    }
    Ok((specs, described))
}

/// A tool as the chat templates and the parser read it: `{"type": "function", "function":
/// {name, description, parameters}}`, the shape of transformers' `get_json_schema` that every
/// template iterates over. Transport keys (`strict`, which openai-agents and pydantic-ai send on
/// every tool, and anything else that is not the function's description) are left out: a template
/// that dumps the tool with `tojson` (Qwen2.5's) would show them to the model, and they threw
/// Qwen2.5-Coder 0.5B off its call. The schema still constrains the arguments whole.
fn described_tool(function: &serde_json::Map<String, Value>) -> Value {
    let mut f = serde_json::Map::new();
    for key in ["name", "description", "parameters"] {
        if let Some(v) = function.get(key).filter(|v| !v.is_null()) {
            f.insert(key.into(), v.clone());
        }
    }
    serde_json::json!({"type": "function", "function": f})
}

fn parse_tool_choice(choice: Option<&Value>, tools: &[ToolSpec]) -> Result<ToolChoice, ParamError> {
    let default = if tools.is_empty() {
        ToolChoice::None
    } else {
        ToolChoice::Auto
    };
    let choice = match present(choice) {
        None => return Ok(default),
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(err(
                    "tool_choice",
                    format!("'{other}' is not one of none, auto, required or a function object"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            match o.get("type").and_then(Value::as_str) {
                Some("function") | None => {}
                Some(t) => return Err(err("tool_choice", format!("type '{t}' is not supported"))),
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| err("tool_choice", "a named tool choice needs `function.name`"))?;
            ToolChoice::Named(name.to_owned())
        }
        Some(_) => return Err(err("tool_choice", "must be a string or a function object")),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(err(
            "tool_choice",
            "\"required\" needs at least one tool in `tools`",
        )),
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => Err(err(
            "tool_choice",
            format!("function '{name}' is not among the declared tools"),
        )),
        _ => Ok(choice),
    }
}

fn parse_response_format(v: &Value) -> Result<ResponseFormat, ParamError> {
    let obj = v
        .as_object()
        .ok_or_else(|| err("response_format", "must be an object with a `type`"))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let js = obj.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                err(
                    "response_format.json_schema",
                    "a `json_schema` object is required",
                )
            })?;
            match js.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => Ok(ResponseFormat::JsonSchema(s.clone())),
                None | Some(Value::Null) => Ok(ResponseFormat::JsonObject),
                Some(_) => Err(err(
                    "response_format.json_schema.schema",
                    "must be a JSON schema object",
                )),
            }
        }
        Some(t) => Err(err(
            "response_format",
            format!("type '{t}' is not one of text, json_object, json_schema"),
        )),
        None => Err(err("response_format", "needs a `type`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    fn openai(
        tools: Value,
        choice: Value,
        parallel: Value,
        format: Value,
    ) -> Result<RequestConstraints, ParamError> {
        RequestConstraints::from_openai(Some(&tools), Some(&choice), Some(&parallel), Some(&format))
    }

    #[test]
    fn null_means_unset_everywhere() {
        let r = openai(Value::Null, Value::Null, Value::Null, Value::Null).unwrap();
        assert_eq!(r, RequestConstraints::default());
        assert!(r.is_unconstrained());
        let r = openai(weather(), Value::Null, Value::Null, Value::Null).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Auto);
        assert!(r.parallel_tool_calls);
        assert_eq!(r.tools[0].name, "get_weather");
        assert_eq!(r.parser_tools().map(<[Value]>::len), Some(1));
        let r = openai(weather(), json!("none"), Value::Null, Value::Null).unwrap();
        assert!(r.parser_tools().is_none(), "none: calls stay content");
    }

    #[test]
    fn tools_reach_the_template_without_transport_keys() {
        let params = json!({"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"], "additionalProperties": false});
        let sent = json!([{"type": "function", "function": {"name": "get_weather", "strict": true,
            "description": "Weather", "parameters": params}, "cache_control": {"type": "ephemeral"}}]);
        let r = openai(sent, json!("required"), Value::Null, Value::Null).unwrap();
        assert_eq!(
            r.tools_json,
            vec![json!({"type": "function", "function": {"name": "get_weather",
                "description": "Weather", "parameters": params}})]
        );
        // The schema constrains the arguments as sent.
        assert_eq!(r.tools[0].parameters, params);
    }

    #[test]
    fn tool_choice_forms_parse() {
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let r = openai(weather(), named, json!(false), Value::Null).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel_tool_calls);
        for (s, c) in [
            ("none", ToolChoice::None),
            ("auto", ToolChoice::Auto),
            ("required", ToolChoice::Required),
        ] {
            assert_eq!(
                openai(weather(), json!(s), Value::Null, Value::Null)
                    .unwrap()
                    .tool_choice,
                c
            );
        }
    }

    #[test]
    fn each_bad_parameter_is_named() {
        let cases: Vec<(Value, Value, Value, Value, &str)> = vec![
            (
                weather(),
                json!("sometimes"),
                Value::Null,
                Value::Null,
                "tool_choice",
            ),
            (weather(), json!(3), Value::Null, Value::Null, "tool_choice"),
            (
                weather(),
                json!({"type": "function"}),
                Value::Null,
                Value::Null,
                "tool_choice",
            ),
            (
                weather(),
                json!({"type": "function", "function": {"name": "nope"}}),
                Value::Null,
                Value::Null,
                "tool_choice",
            ),
            (
                Value::Null,
                json!("required"),
                Value::Null,
                Value::Null,
                "tool_choice",
            ),
            (
                json!([]),
                json!("required"),
                Value::Null,
                Value::Null,
                "tool_choice",
            ),
            (
                Value::Null,
                json!({"type": "function", "function": {"name": "f"}}),
                Value::Null,
                Value::Null,
                "tool_choice",
            ),
            (json!({"a": 1}), Value::Null, Value::Null, Value::Null, "tools"),
            (
                json!([{"type": "function", "function": {}}]),
                Value::Null,
                Value::Null,
                Value::Null,
                "tools[0].function.name",
            ),
            (
                json!([{"type": "retrieval"}]),
                Value::Null,
                Value::Null,
                Value::Null,
                "tools[0].type",
            ),
            (
                weather(),
                Value::Null,
                json!("yes"),
                Value::Null,
                "parallel_tool_calls",
            ),
            (
                Value::Null,
                Value::Null,
                Value::Null,
                json!("json"),
                "response_format",
            ),
            (
                Value::Null,
                Value::Null,
                Value::Null,
                json!({"type": "yaml"}),
                "response_format",
            ),
            (
                Value::Null,
                Value::Null,
                Value::Null,
                json!({"type": "json_schema"}),
                "response_format.json_schema",
            ),
        ];
        for (tools, choice, parallel, format, param) in cases {
            let e = openai(tools.clone(), choice.clone(), parallel, format).unwrap_err();
            assert_eq!(e.param, param, "{tools} {choice}: {}", e.message);
        }
    }

    #[test]
    fn response_formats_parse() {
        let r = openai(
            Value::Null,
            Value::Null,
            Value::Null,
            json!({"type": "json_object"}),
        )
        .unwrap();
        assert_eq!(r.response_format, ResponseFormat::JsonObject);
        assert!(!r.is_unconstrained());
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let r = openai(
            Value::Null,
            Value::Null,
            Value::Null,
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}),
        )
        .unwrap();
        assert_eq!(r.response_format, ResponseFormat::JsonSchema(schema));
    }

    #[test]
    fn ollama_format_and_tools() {
        let r = RequestConstraints::from_ollama(Some(&weather()), Some(&json!("json"))).unwrap();
        assert_eq!(
            (r.tool_choice, r.response_format),
            (ToolChoice::Auto, ResponseFormat::JsonObject)
        );
        let r = RequestConstraints::from_ollama(None, Some(&json!({"type": "object"}))).unwrap();
        assert!(matches!(r.response_format, ResponseFormat::JsonSchema(_)));
        assert_eq!(r.tool_choice, ToolChoice::None);
        assert_eq!(
            RequestConstraints::from_ollama(None, Some(&json!("xml")))
                .unwrap_err()
                .param,
            "format"
        );
        assert!(RequestConstraints::from_ollama(None, Some(&json!("")))
            .unwrap()
            .is_unconstrained());
    }
}
