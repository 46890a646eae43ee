//! Embedding text with a loaded model, for every surface and for `berth embed`: the model's
//! named prompt is added, the texts tokenized, each input's length checked or truncated, the
//! inputs queued on the engine (which packs them with other requests' into shared forward
//! passes), and the vectors truncated to the asked dimensions and normalised.

use axum::http::StatusCode;

use crate::engine::SubmitError;
use crate::state::models::Model;
use crate::turn::ApiError;

/// What is embedded: texts (the prompt is added, then they are tokenized) or token ids as given.
#[derive(Clone, Debug, PartialEq)]
pub enum Inputs {
    /// Texts.
    Texts(Vec<String>),
    /// Token-id sequences.
    Tokens(Vec<Vec<u32>>),
}

impl Inputs {
    fn len(&self) -> usize {
        match self {
            Inputs::Texts(t) => t.len(),
            Inputs::Tokens(t) => t.len(),
        }
    }
}

/// How an API wants its vectors.
#[derive(Clone, Debug, Default)]
pub struct EmbedOptions {
    /// A prompt of the model's (`query`, `document`, …); `None`: the model's default, if any.
    pub prompt_name: Option<String>,
    /// Cut an input longer than the model embeds (else a 400 naming it).
    pub truncate: bool,
    /// Keep the first this many dimensions (Matryoshka), renormalised.
    pub dimensions: Option<usize>,
    /// Hand out the vectors as the model's last projection leaves them, never normalised
    /// (Ollama's legacy endpoint); otherwise they are normalised when the model's modules end
    /// with a Normalize, and always for `always_normalize`.
    pub raw: bool,
    /// Normalise even when the model does not (Ollama's `/api/embed` always does).
    pub always_normalize: bool,
    /// The field the inputs came in, for error messages (`input`, `prompt`).
    pub field: &'static str,
    /// The inputs came as a list: errors name `input[i]` even when it holds one.
    pub listed: bool,
}

/// The vectors of one request.
#[derive(Debug)]
pub struct EmbedOutcome {
    /// One per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens embedded, over all inputs (prompt and special tokens included).
    pub tokens: usize,
}

/// The model must embed: a 400 saying what it is otherwise.
pub fn embedding_model(model: &Model) -> Result<&berth_plugin_api::EmbeddingSpec, ApiError> {
    model.embedding.as_ref().ok_or_else(|| {
        ApiError::param(
            "model",
            format!(
                "model '{}' is a generating model: it does not embed text (use an embedding model such as embeddinggemma:300m)",
                model.reference
            ),
        )
    })
}

/// `text`'s tokens as the model embeds them (its special tokens around the text), cut to `max`
/// keeping those special tokens when `truncate`, as sentence-transformers' tokenizer truncates.
fn tokenize(model: &Model, text: &str, max: usize, truncate: bool) -> (Vec<u32>, usize) {
    let full = model.tokenizer.encode(text, true);
    let n = full.len();
    if n <= max || !truncate {
        return (full, n);
    }
    let plain_len = model.tokenizer.encode(text, false).len();
    let head = if model.tokenizer.add_bos()
        && model.tokenizer.bos_id().is_some()
        && full.first() == model.tokenizer.bos_id().as_ref()
    {
        1
    } else {
        0
    };
    let tail = n.saturating_sub(plain_len + head);
    let keep = max.saturating_sub(head + tail);
    let mut cut = full[..head + keep].to_vec();
    cut.extend_from_slice(&full[n - tail..]);
    (cut, n)
}

/// Embeds `inputs` on `model` as `opts` asks: one vector per input, in order.
pub async fn embed(model: &Model, inputs: Inputs, opts: &EmbedOptions) -> Result<EmbedOutcome, ApiError> {
    let spec = embedding_model(model)?;
    let field = opts.field;
    let full = spec.dimensions as usize;
    if let Some(d) = opts.dimensions {
        if d == 0 || d > full {
            return Err(ApiError::param(
                "dimensions",
                format!(
                    "dimensions must be between 1 and {full} for model '{}'; got {d}",
                    model.reference
                ),
            ));
        }
    }
    let prompt = match opts.prompt_name.as_deref().or(spec.default_prompt.as_deref()) {
        None => "",
        Some(name) => spec.prompts.get(name).map(String::as_str).ok_or_else(|| {
            let known: Vec<&str> = spec.prompts.keys().map(String::as_str).collect();
            ApiError::param(
                "prompt_name",
                format!(
                    "model '{}' has no prompt named '{name}'; it has: {}",
                    model.reference,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })?,
    };
    let max = (spec.max_tokens as usize).min(model.context_length).max(1);
    let many = opts.listed || inputs.len() > 1;
    let at = |i: usize| {
        if many {
            format!("{field}[{i}]")
        } else {
            field.to_string()
        }
    };
    let mut sequences = Vec::with_capacity(inputs.len());
    match inputs {
        Inputs::Texts(texts) => {
            for (i, text) in texts.iter().enumerate() {
                let (ids, n) = tokenize(model, &format!("{prompt}{text}"), max, opts.truncate);
                if n > max && !opts.truncate {
                    return Err(too_long(&at(i), n, max));
                }
                sequences.push(ids);
            }
        }
        Inputs::Tokens(seqs) => {
            let vocab = model.vocab_size;
            for (i, ids) in seqs.into_iter().enumerate() {
                if ids.is_empty() {
                    return Err(ApiError::param(
                        &at(i),
                        format!("{} is an empty list of tokens", at(i)),
                    ));
                }
                if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ApiError::param(
                        &at(i),
                        format!("token {t} in {} is outside the vocabulary (size {vocab})", at(i)),
                    ));
                }
                let n = ids.len();
                if n > max && !opts.truncate {
                    return Err(too_long(&at(i), n, max));
                }
                sequences.push(ids.into_iter().take(max).collect());
            }
        }
    }
    let tokens = sequences.iter().map(Vec::len).sum();
    let done = match model.engine.embed(sequences) {
        Ok(rx) => rx,
        Err(SubmitError::QueueFull) => {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "the model's queue is full; retry later",
            ))
        }
        Err(SubmitError::Closed) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model is unloading; retry",
            ))
        }
    };
    let embedded = match done.await {
        Ok(Ok(e)) => e,
        Ok(Err(message)) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)),
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model was unloaded before the inputs were embedded; retry",
            ))
        }
    };
    let normalize = !opts.raw && (spec.normalized || opts.always_normalize || opts.dimensions.is_some());
    let vectors = embedded
        .vectors
        .into_iter()
        .map(|mut v| {
            if let Some(d) = opts.dimensions {
                v.truncate(d);
            }
            if normalize {
                berth_kernels::ops::l2_normalize(&mut v);
            }
            v
        })
        .collect();
    Ok(EmbedOutcome { vectors, tokens })
}

fn too_long(at: &str, n: usize, max: usize) -> ApiError {
    let mut e = ApiError::param(
        at,
        format!(
            "{at} has {n} tokens; this model embeds at most {max} (send it shorter, or ask for truncation)"
        ),
    );
    e.code = Some("context_length_exceeded");
    e
}
