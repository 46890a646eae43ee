//! Values typed by the request's tool schemas: XML parameter text and relaxed keyword arguments
//! read as the JSON type each parameter declares.

use serde_json::Value;

use crate::values;

/// The JSON schema `type` names of a tool's parameter, if the request declares it.
pub(crate) fn param_types(tools: &[Value], func: &str, param: &str) -> Option<Vec<String>> {
    let tool = tools
        .iter()
        .find(|t| t.get("function").unwrap_or(t).get("name").and_then(Value::as_str) == Some(func))?;
    let schema = tool
        .get("function")
        .unwrap_or(tool)
        .get("parameters")?
        .get("properties")?
        .get(param)?;
    let names = |v: &Value| -> Vec<String> {
        match v {
            Value::String(s) => vec![s.to_ascii_lowercase()],
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_ascii_lowercase)
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut types = schema.get("type").map(names).unwrap_or_default();
    for alt in ["anyOf", "oneOf"] {
        for s in schema.get(alt).and_then(Value::as_array).into_iter().flatten() {
            types.extend(s.get("type").map(names).unwrap_or_default());
        }
    }
    if schema.get("nullable") == Some(&Value::Bool(true)) {
        types.push("null".into());
    }
    Some(types)
}

/// An XML parameter's text typed by the tool's schema (a parameter not in it stays a string).
pub(crate) fn typed_value(tools: &[Value], func: &str, param: &str, raw: &str) -> Value {
    let Some(types) = param_types(tools, func, param) else {
        return Value::String(raw.to_string());
    };
    let is = |pred: &dyn Fn(&str) -> bool| types.iter().any(|t| pred(t));
    let stringy = is(&|t| t == "string" || t == "str" || t == "text");
    let t = raw.trim();
    if (t.eq_ignore_ascii_case("null") || t.eq_ignore_ascii_case("none"))
        && (!stringy || is(&|t| t == "null"))
    {
        return Value::Null;
    }
    if stringy || types.is_empty() {
        return Value::String(raw.to_string());
    }
    if is(&|t| t.starts_with("int") || t.starts_with("uint") || ["long", "short", "unsigned"].contains(&t)) {
        if let Ok(v) = t.parse::<i64>() {
            return v.into();
        }
    }
    if is(&|t| t.starts_with("int") || t.starts_with("num") || t.starts_with("float") || t == "double") {
        if let Ok(v) = t.parse::<f64>() {
            if v.fract() == 0.0 && v.abs() < 9.0e15 {
                return (v as i64).into();
            }
            if let Some(n) = serde_json::Number::from_f64(v) {
                return Value::Number(n);
            }
        }
    }
    if is(&|t| t.starts_with("bool")) {
        return Value::Bool(t.eq_ignore_ascii_case("true"));
    }
    if is(&|t| t == "object" || t == "array" || t.starts_with("dict") || t.starts_with("list")) {
        match serde_json::from_str::<Value>(t) {
            Ok(Value::String(s)) => return values::python_literal(&s).unwrap_or(Value::String(s)),
            Ok(v) => return v,
            Err(_) => {
                if let Some(v) = values::python_literal(t) {
                    return v;
                }
            }
        }
    }
    Value::String(raw.to_string())
}

/// Keyword arguments read from relaxed syntax (Gemma 4, LFM2's Python calls) typed by the tool's
/// schema: a string written bare (`zip:017`) stays the text as written for a `"type": "string"`
/// parameter, and a quoted value for a non-string parameter is read as that type.
pub(crate) fn schema_typed_pairs(
    tools: &[Value],
    func: &str,
    text: &str,
    kw: &values::Kwargs,
) -> Vec<(String, Value)> {
    kw.pairs
        .iter()
        .zip(&kw.spans)
        .map(|((key, value), span)| {
            let Some(types) = param_types(tools, func, key) else {
                return (key.clone(), value.clone());
            };
            let stringy = types.iter().any(|t| t == "string" || t == "str" || t == "text");
            let typed = match value {
                Value::String(s) if !stringy && !types.is_empty() => typed_value(tools, func, key, s),
                Value::Null if types.iter().any(|t| t == "null") => Value::Null,
                Value::Number(_) | Value::Bool(_) | Value::Null if stringy => {
                    Value::String(text[span.clone()].trim().to_string())
                }
                _ => value.clone(),
            };
            (key.clone(), typed)
        })
        .collect()
}
