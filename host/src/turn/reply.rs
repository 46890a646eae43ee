//! The one stream driver: a choice's engine events go through its reply parser and come out as
//! typed [`ReplyEvent`]s; a surface encodes those ([`Encoder`]) into its wire events, and the
//! non-streamed answer ([`collect`]) is the fold of the same deltas.

use crate::chat::{Delta, ParsedMessage, StreamParser};
use crate::decoding::FinishReason;
use crate::engine::{Event, Finish};
use crate::sampling::TokenLogprobs;
use axum::http::StatusCode;
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc::UnboundedReceiver;

use super::ApiError;

/// How a reply ended.
#[derive(Debug, Clone)]
pub struct End {
    /// The engine's end: reason, counts, times, the stop string.
    pub finish: Finish,
    /// Whether the reply holds tool calls.
    pub calls: bool,
}

impl End {
    /// The chat `finish_reason`: `length` whenever `max_tokens` or the context cut the reply
    /// (also inside a call), else `tool_calls` when the reply holds calls, else `stop`.
    pub fn reason(&self) -> FinishReason {
        if self.finish.reason == FinishReason::Length {
            FinishReason::Length
        } else if self.calls {
            FinishReason::ToolCalls
        } else {
            self.finish.reason
        }
    }
}

/// What one choice's stream carries, in order.
#[derive(Debug, Clone)]
pub enum ReplyEvent {
    /// What one flush of output added, with the log-probabilities of the tokens behind it.
    Grew {
        /// The deltas (never empty).
        deltas: Vec<Delta>,
        /// The log-probabilities of the tokens since the last event.
        logprobs: Vec<TokenLogprobs>,
    },
    /// The reply ended: its last deltas and log-probabilities, and how it ended.
    Ended {
        /// Deltas the end released (may be empty).
        deltas: Vec<Delta>,
        /// Log-probabilities not sent yet.
        logprobs: Vec<TokenLogprobs>,
        /// How it ended.
        end: End,
    },
    /// The engine failed the sequence.
    Failed(String),
}

/// One choice's reply, parsing as it goes (`parser: None` passes the text on as content).
struct Choice {
    rx: UnboundedReceiver<Event>,
    parser: Option<StreamParser>,
    logprobs: Vec<TokenLogprobs>,
    calls: bool,
    done: bool,
}

impl Choice {
    async fn next(&mut self) -> Option<ReplyEvent> {
        if self.done {
            return None;
        }
        loop {
            match self.rx.recv().await {
                Some(Event::Logprobs(lp)) => self.logprobs.push(lp),
                Some(Event::Text(t)) => {
                    let deltas = match &mut self.parser {
                        Some(p) => p.push(&t),
                        None => vec![Delta::Content(t)],
                    };
                    if !deltas.is_empty() {
                        self.calls |= deltas.iter().any(|d| matches!(d, Delta::CallStart { .. }));
                        let logprobs = std::mem::take(&mut self.logprobs);
                        return Some(ReplyEvent::Grew { deltas, logprobs });
                    }
                }
                Some(Event::Done(finish)) => {
                    self.done = true;
                    let (deltas, calls) = match &mut self.parser {
                        // A cut reply is parsed as the prefix it is (`StreamParser::finish_output`).
                        Some(p) => {
                            let (d, msg) = p.finish_output(finish.reason == FinishReason::Length);
                            (d, !msg.tool_calls.is_empty())
                        }
                        None => (Vec::new(), false),
                    };
                    let end = End {
                        finish,
                        calls: self.calls || calls,
                    };
                    let logprobs = std::mem::take(&mut self.logprobs);
                    return Some(ReplyEvent::Ended {
                        deltas,
                        logprobs,
                        end,
                    });
                }
                Some(Event::Error(e)) => {
                    self.done = true;
                    return Some(ReplyEvent::Failed(e));
                }
                // The engine went away (the model was unloaded): the stream just ends.
                None => return None,
            }
        }
    }
}

/// The events of one choice.
pub fn events(
    rx: UnboundedReceiver<Event>,
    parser: Option<StreamParser>,
) -> impl Stream<Item = ReplyEvent> + Send {
    let choice = Choice {
        rx,
        parser,
        logprobs: Vec::new(),
        calls: false,
        done: false,
    };
    futures_util::stream::unfold(choice, |mut c| async move { c.next().await.map(|e| (e, c)) })
}

/// The events of several choices (one parser each), merged as they come, each tagged with its
/// choice's index.
pub fn merged(
    rxs: Vec<UnboundedReceiver<Event>>,
    parsers: Vec<Option<StreamParser>>,
) -> impl Stream<Item = (usize, ReplyEvent)> + Send {
    let streams = rxs
        .into_iter()
        .zip(parsers)
        .enumerate()
        .map(|(i, (rx, parser))| events(rx, parser).map(move |e| (i, e)).boxed());
    futures_util::stream::select_all(streams)
}

/// A surface's encoder: typed events in, its wire events out (SSE frames, NDJSON lines).
pub trait Encoder: Send + 'static {
    /// What goes out before any event (a role chunk, `message_start`, ...).
    fn start(&mut self) -> String {
        String::new()
    }
    /// One event of choice `index`.
    fn event(&mut self, index: usize, event: ReplyEvent) -> String;
    /// What goes out after the last event of every choice (usage, `[DONE]`); not called when
    /// the stream ended early.
    fn end(&mut self) -> String {
        String::new()
    }
}

/// Drives merged choices through an encoder: the wire text, piece by piece (empty pieces are
/// skipped).
pub fn encode<E: Encoder>(
    events: impl Stream<Item = (usize, ReplyEvent)> + Send + 'static,
    mut encoder: E,
) -> impl Stream<Item = String> + Send {
    let first = encoder.start();
    let state = (Box::pin(events), encoder, Some(first), false);
    futures_util::stream::unfold(state, |(mut events, mut enc, first, ended)| async move {
        if let Some(f) = first {
            return Some((f, (events, enc, None, ended)));
        }
        if ended {
            return None;
        }
        match events.next().await {
            Some((i, ev)) => {
                let out = enc.event(i, ev);
                Some((out, (events, enc, None, false)))
            }
            None => {
                let out = enc.end();
                Some((out, (events, enc, None, true)))
            }
        }
    })
    .filter(|s| futures_util::future::ready(!s.is_empty()))
}

/// A whole reply: the message its deltas fold to, the tokens' log-probabilities and how it
/// ended.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The parsed message (the fold of the reply's deltas; without a parser, the text as
    /// generated is its content).
    pub message: ParsedMessage,
    /// One entry per generated token, when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprobs>,
    /// How it ended.
    pub end: End,
}

/// Collects one choice's whole reply: the same events as streamed, folded.
pub async fn collect(rx: UnboundedReceiver<Event>, parser: Option<StreamParser>) -> Result<Reply, ApiError> {
    let mut stream = Box::pin(events(rx, parser));
    let mut deltas = Vec::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            ReplyEvent::Grew {
                deltas: d,
                logprobs: l,
            } => {
                deltas.extend(d);
                logprobs.extend(l);
            }
            ReplyEvent::Ended {
                deltas: d,
                logprobs: l,
                end,
            } => {
                deltas.extend(d);
                logprobs.extend(l);
                let message = ParsedMessage::fold(&deltas);
                return Ok(Reply {
                    message,
                    logprobs,
                    end,
                });
            }
            ReplyEvent::Failed(e) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e)),
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the model was unloaded during the request",
    ))
}

/// Collects every choice's whole reply (one parser each), in order.
pub async fn collect_all(
    rxs: Vec<UnboundedReceiver<Event>>,
    parsers: Vec<Option<StreamParser>>,
) -> Result<Vec<Reply>, ApiError> {
    futures_util::future::try_join_all(rxs.into_iter().zip(parsers).map(|(rx, p)| collect(rx, p))).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatFormat, ParseStart};
    use serde_json::json;
    use std::time::Duration;
    use tokio::sync::mpsc::unbounded_channel;

    fn finish(reason: FinishReason) -> Finish {
        Finish {
            reason,
            prompt_tokens: 5,
            cached_tokens: 0,
            completion_tokens: 3,
            prompt_duration: Duration::ZERO,
            generation_duration: Duration::ZERO,
            stop_sequence: None,
        }
    }

    const OUTPUT: [&str; 4] = [
        "Sure.",
        "\n<tool_call>\n{\"name\": \"get_time\", ",
        "\"arguments\": {\"tz\": \"CET\"}}",
        "\n</tool_call>",
    ];

    fn replay(reason: FinishReason) -> UnboundedReceiver<Event> {
        let (tx, rx) = unbounded_channel();
        for piece in OUTPUT {
            tx.send(Event::Text(piece.into())).unwrap();
        }
        tx.send(Event::Done(finish(reason))).unwrap();
        rx
    }

    fn parser() -> Option<StreamParser> {
        let tools =
            [json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}})];
        Some(StreamParser::new(
            ChatFormat::HermesJson,
            ParseStart::Content,
            Some(&tools),
        ))
    }

    #[tokio::test]
    async fn the_whole_reply_is_the_fold_of_the_streamed_events() {
        let whole = collect(replay(FinishReason::Stop), parser()).await.unwrap();
        assert_eq!(whole.message.content.as_deref(), Some("Sure."));
        assert_eq!(whole.message.tool_calls[0].arguments, r#"{"tz": "CET"}"#);
        assert_eq!(whole.end.reason(), FinishReason::ToolCalls);
        let events: Vec<ReplyEvent> = events(replay(FinishReason::Stop), parser()).collect().await;
        let mut folded = ParsedMessage::default();
        for e in &events {
            if let ReplyEvent::Grew { deltas, .. } | ReplyEvent::Ended { deltas, .. } = e {
                deltas.iter().for_each(|d| folded.apply(d));
            }
        }
        assert_eq!(folded, whole.message);
        assert!(matches!(events.last(), Some(ReplyEvent::Ended { .. })));
        // A reply the token cap cut ends as `length`, calls or not.
        let cut = collect(replay(FinishReason::Length), parser()).await.unwrap();
        assert_eq!(cut.end.reason(), FinishReason::Length);
    }

    /// Counts what it is given.
    struct Tally(usize, usize);

    impl Encoder for Tally {
        fn start(&mut self) -> String {
            "start;".into()
        }
        fn event(&mut self, index: usize, event: ReplyEvent) -> String {
            self.0 += 1;
            match event {
                ReplyEvent::Ended { .. } => {
                    self.1 += 1;
                    format!("end{index};")
                }
                _ => String::new(),
            }
        }
        fn end(&mut self) -> String {
            format!("done {} {};", self.0, self.1)
        }
    }

    #[tokio::test]
    async fn the_encoder_sees_every_choice_start_to_end() {
        let rxs = vec![replay(FinishReason::Stop), replay(FinishReason::Stop)];
        let text: String = encode(merged(rxs, vec![parser(), None]), Tally(0, 0))
            .collect()
            .await;
        assert!(text.starts_with("start;"), "{text}");
        assert!(text.contains("end0;") && text.contains("end1;"), "{text}");
        assert!(text.ends_with(" 2;"), "both choices ended before the end: {text}");
    }

    #[tokio::test]
    async fn an_engine_error_fails_the_reply_and_a_vanished_engine_is_a_503() {
        let (tx, rx) = unbounded_channel();
        tx.send(Event::Error("boom".into())).unwrap();
        let e = collect(rx, parser()).await.unwrap_err();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        let (tx, rx) = unbounded_channel::<Event>();
        drop(tx);
        assert_eq!(
            collect(rx, parser()).await.unwrap_err().status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
