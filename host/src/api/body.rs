//! Request bodies as typed values. [`parse`] turns a body into a `#[derive(Deserialize)]` request
//! struct and any deserialisation error into a 400 naming the field's path
//! (`messages[2].tool_call_id`, `options.num_ctx`); the struct's [`RequestBody::validate`] then
//! checks what serde cannot (ranges, fields that depend on each other, fields Berth refuses).
//! `null` is the same as an absent field throughout (every field is an `Option`).

use super::{parse_object, ApiError};
use crate::state::parse_keep_alive;
use serde::de::{self, DeserializeOwned, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::fmt;
use std::time::Duration;

/// A request body: its serde shape plus the checks serde cannot express.
pub trait RequestBody: DeserializeOwned + for<'de> Derived<'de> {
    /// The keys a strict body may hold (OpenAI refuses others, naming them); `None`: keys
    /// outside the struct are ignored (Ollama).
    fn known_keys() -> Option<Vec<&'static str>> {
        None
    }

    /// Range and cross-field checks on the typed value, each failing as a 400 naming its field.
    fn validate(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A parsed body: the typed request, and the JSON object it came from for the parts handed on
/// as JSON (messages to a chat template, tools to the constraint builder).
#[derive(Debug)]
pub struct Parsed<T> {
    /// The typed, validated request.
    pub request: T,
    /// The body as it was sent.
    pub json: Map<String, Value>,
}

/// Parses and validates a request body: 400 for a body that is not a JSON object, for an
/// unknown key on a strict body, for a value of the wrong type or out of range (naming it).
pub fn parse<T: RequestBody>(body: &[u8]) -> Result<Parsed<T>, ApiError> {
    let json = parse_object(body)?;
    if let Some(known) = T::known_keys() {
        if let Some(k) = json.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ApiError::param(
                k,
                format!("Unrecognized request argument supplied: {k}"),
            ));
        }
    }
    let value = Value::Object(json);
    let request: T = typed(&value, "")?;
    request.validate()?;
    let json = match value {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    Ok(Parsed { request, json })
}

/// A part of a body: the fields `T` names, taken from the whole object (unknown keys are the
/// body's business), deserialized and validated.
pub fn part<T: RequestBody>(json: &Map<String, Value>) -> Result<T, ApiError> {
    let mine: Map<String, Value> = field_names::<T>()
        .iter()
        .filter_map(|k| json.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let part: T = typed(&Value::Object(mine), "")?;
    part.validate()?;
    Ok(part)
}

/// Deserializes a JSON value found at `at` (a field path, `""` for the body) into `T`; an error
/// is a 400 naming the full path of the offending field.
pub fn typed<T: DeserializeOwned>(value: &Value, at: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = join(at, &e.path().to_string());
        field_error(&path, &e.into_inner().to_string())
    })
}

/// `at` followed by a path relative to it (`"."` is the value itself).
fn join(at: &str, path: &str) -> String {
    match (at, path) {
        (_, ".") => at.to_string(),
        ("", p) => p.to_string(),
        (a, p) if p.starts_with('[') => format!("{a}{p}"),
        (a, p) => format!("{a}.{p}"),
    }
}

/// A deserialisation error at `path` as a 400 in the APIs' words: "'options.top_k' must be an
/// integer; got a string".
fn field_error(path: &str, serde_message: &str) -> ApiError {
    let message = if let Some(rest) = serde_message
        .strip_prefix("invalid type: ")
        .or_else(|| serde_message.strip_prefix("invalid value: "))
    {
        let (got, want) = rest.rsplit_once(", expected ").unwrap_or((rest, "another value"));
        format!("'{path}' must be {}; got {}", wanted(want), kind(got))
    } else if let Some(field) = serde_message
        .strip_prefix("missing field `")
        .and_then(|f| f.strip_suffix('`'))
    {
        let path = join(path, field);
        return ApiError::param(&path, format!("'{path}' is required"));
    } else if let Some(field) = serde_message
        .strip_prefix("unknown field `")
        .and_then(|f| f.split_once('`'))
        .map(|(f, _)| f)
    {
        // A `deny_unknown_fields` part of a body: the path already ends with the field.
        format!("Unrecognized request argument supplied: {field}")
    } else if let Some(rest) = serde_message.strip_prefix("unknown variant ") {
        format!("'{path}' cannot be {}", rest.replace('`', "'"))
    } else {
        format!("'{path}' {serde_message}")
    };
    if path.is_empty() {
        ApiError::new(axum::http::StatusCode::BAD_REQUEST, message)
    } else {
        ApiError::param(path, message)
    }
}

/// What serde expected, as the error messages name it.
fn wanted(expected: &str) -> &str {
    match expected {
        "f32" | "f64" => "a number",
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" | "usize" => "an integer",
        "a map" => "an object",
        "a sequence" => "an array",
        "string or map" | "variant identifier" => "a string",
        s if s.starts_with("struct ") => "an object",
        other => other,
    }
}

/// What a request held instead, from serde's description of it (`integer \`5\``).
fn kind(unexpected: &str) -> &str {
    let word = unexpected.split([' ', '`']).next().unwrap_or("");
    match word {
        "string" => "a string",
        "integer" | "floating" => "a number",
        "boolean" => "a boolean",
        "sequence" => "an array",
        "map" => "an object",
        "unit" | "null" => "null",
        _ => unexpected,
    }
}

/// The field names of a struct declared with [`object_only!`], as serde lists them.
pub fn field_names<T: for<'de> Derived<'de>>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    let _ = T::derived(FieldNames(&mut names));
    names
}

/// A struct's derived deserialisation (`#[serde(remote = "Self")]`), which also takes a JSON
/// array for a struct; [`object_only!`] wraps it so that only an object is one.
pub trait Derived<'de>: Sized {
    /// Deserializes with the derived code.
    fn derived<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

/// Visits a JSON object only, handing it to the derived code (paths are kept).
pub struct ObjectOnly<T>(pub std::marker::PhantomData<T>);

impl<'de, T: Derived<'de>> Visitor<'de> for ObjectOnly<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::derived(de::value::MapAccessDeserializer::new(map))
    }
}

/// Implements `Deserialize` for structs declared `#[derive(Deserialize)] #[serde(remote =
/// "Self")]` so that each takes a JSON object only (serde's derived code also takes an array of
/// the fields in order, which no API means).
#[macro_export]
macro_rules! object_only {
    ($($t:ty),* $(,)?) => {$(
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_map($crate::api::body::ObjectOnly::<$t>(std::marker::PhantomData))
            }
        }

        impl<'de> $crate::api::body::Derived<'de> for $t {
            fn derived<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <$t>::deserialize(d)
            }
        }
    )*};
}

/// A deserializer that only records the field list a struct asks it for.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("field names recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

pub use crate::options::{int_in, num_in, Int};

/// `think`: a boolean, or a reasoning level (`low`, `medium`, `high`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Think {
    /// Thinking on or off.
    Enabled(bool),
    /// Thinking on, at this effort.
    Level(String),
}

impl<'de> Deserialize<'de> for Think {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Think, D::Error> {
        struct ThinkVisitor;
        impl Visitor<'_> for ThinkVisitor {
            type Value = Think;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a boolean (or low, medium, high)")
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Think, E> {
                Ok(Think::Enabled(v))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Think, E> {
                if ["low", "medium", "high"].contains(&v) {
                    Ok(Think::Level(v.to_string()))
                } else {
                    Err(E::invalid_value(Unexpected::Str(v), &self))
                }
            }
        }
        d.deserialize_any(ThinkVisitor)
    }
}

impl Think {
    /// Its template variables: `enable_thinking`, and for a level also `reasoning_effort`.
    pub fn apply(&self, extra: &mut Map<String, Value>) {
        match self {
            Think::Enabled(b) => {
                extra.insert("enable_thinking".into(), (*b).into());
            }
            Think::Level(s) => {
                extra.insert("reasoning_effort".into(), s.clone().into());
                extra.insert("enable_thinking".into(), true.into());
            }
        }
    }
}

/// `keep_alive` (Ollama): seconds (a number) or a duration string (`30s`, `5m`, `1h`); negative
/// keeps the model loaded forever (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAlive(pub Option<Duration>);

impl<'de> Deserialize<'de> for KeepAlive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeepAlive, D::Error> {
        struct KeepAliveVisitor;
        impl KeepAliveVisitor {
            fn parse<E: de::Error>(text: &str) -> Result<KeepAlive, E> {
                parse_keep_alive(text)
                    .map(KeepAlive)
                    .map_err(|e| E::custom(format!("is not a keep-alive: {e}")))
            }
        }
        impl Visitor<'_> for KeepAliveVisitor {
            type Value = KeepAlive;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string or seconds")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeepAlive, E> {
                Self::parse(&v.to_string())
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeepAlive, E> {
                Self::parse(&v.to_string())
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeepAlive, E> {
                Self::parse(&v.to_string())
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeepAlive, E> {
                Self::parse(v)
            }
        }
        d.deserialize_any(KeepAliveVisitor)
    }
}

/// A string, or a list of `T`: a message's content (text or parts), Responses' `input` (one
/// user message or items). Paths into the list are kept (`input[2].content[0].text`).
#[derive(Clone, Debug, PartialEq)]
pub enum TextOr<T> {
    /// The string.
    Text(String),
    /// The list.
    List(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TextOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TextOr<T>, D::Error> {
        struct TextOrVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for TextOrVisitor<T> {
            type Value = TextOr<T>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<TextOr<T>, E> {
                Ok(TextOr::Text(v.to_string()))
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<TextOr<T>, A::Error> {
                let mut list = Vec::new();
                while let Some(x) = seq.next_element()? {
                    list.push(x);
                }
                Ok(TextOr::List(list))
            }
        }
        d.deserialize_any(TextOrVisitor(std::marker::PhantomData))
    }
}

/// `stream_options` (OpenAI).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(remote = "Self")]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    pub include_usage: Option<bool>,
}

crate::object_only!(StreamOptions);

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    /// A body whose fields are only deserialized (their errors are what the tests look at).
    #[allow(dead_code)]
    #[derive(Debug, Deserialize)]
    #[serde(remote = "Self")]
    struct Probe {
        flag: Option<bool>,
        n: Option<Int>,
        name: Option<String>,
        opts: Option<Inner>,
        list: Option<Vec<Inner>>,
    }

    #[allow(dead_code)]
    #[derive(Debug, Deserialize)]
    #[serde(remote = "Self")]
    struct Inner {
        depth: Option<Int>,
        label: String,
    }

    crate::object_only!(Probe, Inner);

    impl RequestBody for Probe {
        fn known_keys() -> Option<Vec<&'static str>> {
            Some(field_names::<Self>().to_vec())
        }

        fn validate(&self) -> Result<(), ApiError> {
            int_in("n", self.n, 1, 5).map(|_| ())
        }
    }

    fn error(body: &str) -> (StatusCode, Option<String>, String) {
        let e = parse::<Probe>(body.as_bytes()).unwrap_err();
        (e.status, e.param, e.message)
    }

    #[test]
    fn wrong_types_name_their_path() {
        let (status, param, message) = error(r#"{"flag": "yes"}"#);
        assert_eq!(
            (status, param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("flag"))
        );
        assert_eq!(message, "'flag' must be a boolean; got a string");
        let (_, param, message) = error(r#"{"opts": {"depth": 1.5, "label": "x"}}"#);
        assert_eq!(param.as_deref(), Some("opts.depth"));
        assert_eq!(message, "'opts.depth' must be an integer; got a number");
        let (_, param, _) = error(r#"{"list": [{"label": "a"}, {"label": 3}]}"#);
        assert_eq!(param.as_deref(), Some("list[1].label"));
        let (_, param, message) = error(r#"{"list": [{"label": "a"}, {"depth": 2}]}"#);
        assert_eq!(param.as_deref(), Some("list[1].label"));
        assert_eq!(message, "'list[1].label' is required");
        let (_, param, message) = error(r#"{"opts": [1]}"#);
        assert_eq!(param.as_deref(), Some("opts"));
        assert!(message.contains("got an array"), "{message}");
    }

    #[test]
    fn null_is_absent_integral_floats_are_integers_and_ranges_are_checked() {
        let p = parse::<Probe>(br#"{"flag": null, "n": 2.0, "name": null}"#).unwrap();
        assert_eq!(
            (p.request.flag, p.request.n, p.request.name),
            (None, Some(Int(2)), None)
        );
        assert_eq!(p.json["n"], 2.0);
        let (_, param, message) = error(r#"{"n": 9}"#);
        assert_eq!(param.as_deref(), Some("n"));
        assert_eq!(message, "'n' must be between 1 and 5; got 9");
        let (_, param, _) = error(r#"{"n": 18446744073709551615}"#);
        assert_eq!(param.as_deref(), Some("n"));
    }

    #[test]
    fn strict_bodies_refuse_unknown_keys_and_bodies_must_be_objects() {
        let (_, param, message) = error(r#"{"flag": true, "bogus": 1}"#);
        assert_eq!(param.as_deref(), Some("bogus"));
        assert!(message.contains("Unrecognized request argument"), "{message}");
        assert_eq!(field_names::<Probe>(), ["flag", "n", "name", "opts", "list"]);
        for bad in ["[1]", "{", "7"] {
            let (status, param, _) = error(bad);
            assert_eq!((status, param), (StatusCode::BAD_REQUEST, None), "{bad}");
        }
    }

    #[test]
    fn think_is_a_boolean_or_a_level() {
        let t = |s: &str| typed::<Think>(&serde_json::from_str(s).unwrap(), "think");
        assert_eq!(t("true").unwrap(), Think::Enabled(true));
        assert_eq!(t(r#""high""#).unwrap(), Think::Level("high".into()));
        for bad in [r#""extreme""#, "3", "[]"] {
            let e = t(bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("think"), "{bad}");
            assert!(
                e.message.contains("a boolean (or low, medium, high)"),
                "{}",
                e.message
            );
        }
    }
}
