//! Per-sequence decoding as the engine sees it: [`crate::decoding::DecodeState`] (sampler,
//! constraint mask, penalties, stop tokens and strings, token budget) under the engine's names.

pub use crate::decoding::{DecodeOptions, DecodeState as SequenceDecoder, FinishReason, Step};
