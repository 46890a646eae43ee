//! The ABI 1.4 embedding path within one process: a family exported through the SDK's entry
//! table, driven by the host client (`ModelInstance::embedding`, `ModelInstance::embed`) and,
//! for batches and buffers the client never sends, through the raw vtable `embed` entry.

use berth_plugin_api::abi::{self, Batch, ErrorBuf, Header, Instance, Logits, Status, StrRef};
use berth_plugin_api::sdk::{self, Family, Model};
use berth_plugin_api::{
    BatchView, EmbeddingSpec, ErrorKind, LoadConfig, LogitsOut, ModelDescription, ModelInstance, Plugin,
    PluginError, PluginManifest, Pooling,
};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::OnceLock;

/// Most sequences the toy model holds (and so embeds) at once.
const MAX_SEQUENCES: u32 = 2;

/// The toy's embedding of one sequence: its length, the sum of its tokens, its first token and
/// its last.
fn toy_vector(tokens: &[i32]) -> Vec<f32> {
    let sum: i32 = tokens.iter().sum();
    let first = tokens.first().copied().unwrap_or(0);
    let last = tokens.last().copied().unwrap_or(0);
    vec![tokens.len() as f32, sum as f32, first as f32, last as f32]
}

/// The spec the toy reports when it embeds.
fn toy_spec() -> EmbeddingSpec {
    EmbeddingSpec {
        dimensions: 4,
        pooling: Pooling::LastToken,
        normalized: true,
        max_tokens: 32,
        prompts: BTreeMap::from([("query".to_string(), "Query: ".to_string())]),
        default_prompt: Some("query".into()),
    }
}

/// A model that embeds with [`toy_vector`] unless its load options say `"plain": true`; with
/// `"claims": true` it also sets `CAP_EMBEDDING` in its own description.
struct Toy {
    embeds: bool,
    claims: bool,
}

impl Model for Toy {
    fn describe(&self) -> ModelDescription {
        ModelDescription {
            vocab_size: 8,
            context_length: 32,
            max_sequences: MAX_SEQUENCES,
            capabilities: if self.claims { abi::CAP_EMBEDDING } else { 0 },
            ..Default::default()
        }
    }

    fn decode(&mut self, _batch: &BatchView<'_>, _logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        Err(PluginError::unsupported("decode: an embedding-only toy"))
    }

    fn force_token(&mut self, _seq: i32, _token: i32) -> Result<(), PluginError> {
        Ok(())
    }

    fn seq_truncate(&mut self, _seq: i32, _len: u32) -> Result<(), PluginError> {
        Ok(())
    }

    fn embedding(&self) -> Option<EmbeddingSpec> {
        self.embeds.then(toy_spec)
    }

    fn embed(&mut self, sequences: &[&[i32]]) -> Result<Vec<f32>, PluginError> {
        if !self.embeds {
            return Err(PluginError::unsupported("embed"));
        }
        Ok(sequences.iter().flat_map(|s| toy_vector(s)).collect())
    }
}

/// The family exporting [`Toy`].
struct ToyFamily;

impl Family for ToyFamily {
    type Model = Toy;

    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "embed-toy".into(),
            version: "0.1.0".into(),
            families: vec!["embed-toy".into()],
            ..Default::default()
        }
    }

    fn probe(_model_config: &serde_json::Value) -> u32 {
        1
    }

    fn create(config: &LoadConfig) -> Result<Toy, PluginError> {
        let flag = |key: &str| config.options.get(key).and_then(serde_json::Value::as_bool) == Some(true);
        Ok(Toy {
            embeds: !flag("plain"),
            claims: flag("claims"),
        })
    }
}

/// The family's entry table, as `export_plugin!` would build it (once per process).
fn entry_table() -> &'static abi::EntryTable {
    static TABLE: OnceLock<sdk::StaticEntry> = OnceLock::new();
    TABLE
        .get_or_init(|| sdk::StaticEntry(sdk::build_entry_table::<ToyFamily>(true)))
        .0
}

/// A load configuration with these `options`.
fn config(options: serde_json::Value) -> String {
    let config = LoadConfig {
        family: "embed-toy".into(),
        options: options.as_object().cloned().unwrap_or_default(),
        ..Default::default()
    };
    serde_json::to_string(&config).unwrap()
}

/// A model created through the host client.
fn instance(options: serde_json::Value) -> ModelInstance {
    // SAFETY: the table is leaked static data of this process.
    let plugin = unsafe { Plugin::from_entry(entry_table()) }.expect("the SDK's table is accepted");
    plugin.create(&config(options)).expect("the toy loads")
}

/// A model created through the raw entry table, so tests can hand its vtable what the client
/// never sends; destroyed on drop.
struct Raw {
    handle: *mut c_void,
    vtable: abi::ModelVtable,
}

/// What a raw call gave back: its status, the rows it wrote and its error message.
#[derive(Debug, PartialEq)]
struct Answer {
    status: Status,
    rows: u32,
    message: String,
}

impl Raw {
    fn create(options: serde_json::Value) -> Raw {
        let create = entry_table().create.expect("a create entry");
        let config = config(options);
        // SAFETY: all-zero is valid for the Instance's integers and pointers.
        let mut inst: Instance = unsafe { std::mem::zeroed() };
        inst.header = Header::for_struct::<Instance>();
        // SAFETY: the config string and the out-struct outlive the call; a null error buffer is
        // allowed.
        let status = unsafe { create(StrRef::borrow(&config), &mut inst, std::ptr::null_mut()) };
        assert_eq!(status, abi::STATUS_OK);
        // SAFETY: the SDK's vtable stays valid while the instance lives; read within its size.
        let (vtable, _) = unsafe { abi::read_versioned(inst.vtable) }.expect("a vtable");
        Raw {
            handle: inst.handle,
            vtable,
        }
    }

    /// Calls the raw `embed` with one `(token, position, seq_id)` row per token and `out` as the
    /// output buffer, in rows of `row_len`.
    fn embed(&mut self, rows: &[(i32, i32, i32)], row_len: u32, out: &mut [f32]) -> Answer {
        let tokens: Vec<i32> = rows.iter().map(|r| r.0).collect();
        let positions: Vec<i32> = rows.iter().map(|r| r.1).collect();
        let seq_ids: Vec<i32> = rows.iter().map(|r| r.2).collect();
        let batch = Batch {
            header: Header::for_struct::<Batch>(),
            n_tokens: rows.len() as u32,
            reserved: 0,
            tokens: tokens.as_ptr(),
            positions: positions.as_ptr(),
            seq_ids: seq_ids.as_ptr(),
            want_logits: std::ptr::null(),
        };
        let mut logits = Logits {
            header: Header::for_struct::<Logits>(),
            data: out.as_mut_ptr(),
            capacity: out.len(),
            row_len,
            rows_written: 0,
        };
        let mut bytes = vec![0u8; 512];
        let mut err = ErrorBuf {
            header: Header::for_struct::<ErrorBuf>(),
            buf: bytes.as_mut_ptr(),
            cap: bytes.len(),
            len: 0,
        };
        let embed = self.vtable.embed.expect("a 1.4 vtable has embed");
        // SAFETY: the handle is live; the batch arrays hold n_tokens rows, the output holds
        // `capacity` floats and the error buffer `cap` bytes, all outliving the call.
        let status = unsafe { embed(self.handle, &batch, &mut logits, &mut err) };
        Answer {
            status,
            rows: logits.rows_written,
            message: String::from_utf8_lossy(&bytes[..err.len]).into_owned(),
        }
    }

    /// Calls the raw `model_info`: the capability bits and the embedding JSON it wrote.
    fn info(&mut self) -> (u64, String) {
        // SAFETY: all-zero is valid for the ModelInfo's integers and pointers.
        let mut info: abi::ModelInfo = unsafe { std::mem::zeroed() };
        info.header = Header::for_struct::<abi::ModelInfo>();
        let model_info = self.vtable.model_info.expect("a model_info entry");
        // SAFETY: the handle is live and the out-struct outlives the call; a null error buffer
        // is allowed.
        let status = unsafe { model_info(self.handle, &mut info, std::ptr::null_mut()) };
        assert_eq!(status, abi::STATUS_OK);
        assert_eq!(
            info.header.struct_size as usize,
            std::mem::size_of::<abi::ModelInfo>()
        );
        // SAFETY: the SDK keeps the string alive until the next model_info or destroy.
        let json = unsafe { info.embedding_json.as_str() }.into_owned();
        (info.capabilities, json)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(destroy) = self.vtable.destroy {
            // SAFETY: the handle came from create and is destroyed once, last.
            unsafe { destroy(self.handle) };
        }
    }
}

#[test]
fn a_model_with_an_embedding_spec_reports_cap_embedding_and_the_spec_round_trips() {
    let (capabilities, json) = Raw::create(serde_json::json!({})).info();
    assert_ne!(capabilities & abi::CAP_EMBEDDING, 0, "the SDK sets the bit");
    assert_eq!(serde_json::from_str::<EmbeddingSpec>(&json).unwrap(), toy_spec());

    let m = instance(serde_json::json!({}));
    assert_eq!(m.embedding(), Some(&toy_spec()));
    assert_ne!(m.description().capabilities & abi::CAP_EMBEDDING, 0);
    assert_eq!(m.description().max_sequences, MAX_SEQUENCES);
}

#[test]
fn embed_through_the_client_gives_the_models_vector_for_each_sequence_in_order() {
    let mut m = instance(serde_json::json!({}));
    let vectors = m.embed(&[&[1, 2, 3], &[5]]).unwrap();
    assert_eq!(vectors, vec![toy_vector(&[1, 2, 3]), toy_vector(&[5])]);
    assert_eq!(vectors[0], [3.0, 6.0, 1.0, 3.0]);
    let vectors = m.embed(&[&[5], &[1, 2, 3]]).unwrap();
    assert_eq!(vectors, vec![toy_vector(&[5]), toy_vector(&[1, 2, 3])]);
}

#[test]
fn the_raw_embed_groups_interleaved_whole_sequences_in_order_of_first_appearance() {
    let mut raw = Raw::create(serde_json::json!({}));
    let mut out = vec![-1.0; 8];
    // Sequence 1 appears first, so its vector is the first row; want_logits is null.
    let rows = [(9, 0, 1), (3, 0, 0), (8, 1, 1), (4, 1, 0), (5, 2, 0)];
    let answer = raw.embed(&rows, 4, &mut out);
    assert_eq!(
        (answer.status, answer.rows),
        (abi::STATUS_OK, 2),
        "{}",
        answer.message
    );
    assert_eq!(out[..4], toy_vector(&[9, 8]));
    assert_eq!(out[4..], toy_vector(&[3, 4, 5]));
}

#[test]
fn a_batch_whose_sequences_are_not_whole_or_in_order_is_an_invalid_argument() {
    let mut raw = Raw::create(serde_json::json!({}));
    for rows in [
        // Starts past 0 (the start of the sequence is missing).
        vec![(3, 1, 0), (4, 2, 0)],
        // A gap.
        vec![(3, 0, 0), (4, 2, 0)],
        // Out of order.
        vec![(3, 1, 0), (4, 0, 0)],
        // A repeated position.
        vec![(3, 0, 0), (4, 0, 0)],
        // A negative position.
        vec![(3, 0, 0), (4, -1, 0)],
        // Whole first sequence, then the second starts past 0.
        vec![(3, 0, 0), (4, 1, 1)],
    ] {
        let mut out = vec![-1.0; 8];
        let answer = raw.embed(&rows, 4, &mut out);
        assert_eq!(
            (answer.status, answer.rows),
            (abi::STATUS_INVALID_ARGUMENT, 0),
            "{rows:?}"
        );
        assert!(answer.message.contains("whole"), "{rows:?}: {}", answer.message);
        assert!(out.iter().all(|&x| x == -1.0), "{rows:?}: nothing is written");
    }
}

#[test]
fn a_wrong_row_length_or_a_buffer_too_small_is_an_invalid_argument() {
    let mut raw = Raw::create(serde_json::json!({}));
    let rows = [(3, 0, 0), (4, 0, 1)];
    for (row_len, capacity) in [(3, 8), (5, 10), (8, 16), (4, 7), (4, 0)] {
        let mut out = vec![-1.0; capacity];
        let answer = raw.embed(&rows, row_len, &mut out);
        assert_eq!(
            (answer.status, answer.rows),
            (abi::STATUS_INVALID_ARGUMENT, 0),
            "rows of {row_len}, {capacity} floats"
        );
        assert!(answer.message.contains("embedding buffer"), "{}", answer.message);
        assert!(out.iter().all(|&x| x == -1.0), "nothing is written");
    }
    // Exactly enough room is enough.
    let answer = raw.embed(&rows, 4, &mut [0.0; 8]);
    assert_eq!((answer.status, answer.rows), (abi::STATUS_OK, 2));
}

#[test]
fn a_model_without_embeddings_reports_none_and_embed_is_unsupported() {
    // `claims`: the model sets CAP_EMBEDDING itself, without a spec to back it.
    for options in [
        serde_json::json!({"plain": true}),
        serde_json::json!({"plain": true, "claims": true}),
    ] {
        let mut raw = Raw::create(options.clone());
        let (capabilities, json) = raw.info();
        assert_eq!(json, "", "{options}: no embedding spec");
        let claims = options["claims"] == true;
        assert_eq!(capabilities & abi::CAP_EMBEDDING != 0, claims, "{options}");
        let answer = raw.embed(&[(3, 0, 0)], 4, &mut [0.0; 4]);
        assert_eq!(
            (answer.status, answer.rows),
            (abi::STATUS_UNSUPPORTED, 0),
            "{options}"
        );

        let mut m = instance(options.clone());
        assert_eq!(m.embedding(), None, "{options}");
        assert_eq!(
            m.description().capabilities & abi::CAP_EMBEDDING,
            0,
            "{options}: the host clears the bit"
        );
        let e = m.embed(&[&[3, 4]]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported, "{options}: {e}");
    }
}

#[test]
fn the_client_refuses_more_sequences_than_the_model_holds_and_empty_sequences() {
    let mut m = instance(serde_json::json!({}));
    let e = m.embed(&[&[1], &[2], &[3]]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("3 sequences"), "{e}");
    let e = m.embed(&[&[1, 2], &[]]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("sequence 1 is empty"), "{e}");
    // The instance still embeds afterwards.
    assert_eq!(
        m.embed(&[&[1], &[2]]).unwrap(),
        vec![toy_vector(&[1]), toy_vector(&[2])]
    );
}
