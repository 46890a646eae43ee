//! The safe SDK for plugin authors: implement [`Family`] and [`Model`], then call
//! [`export_plugin!`](crate::export_plugin) once. Every entry is wrapped in `catch_unwind`: a
//! panic becomes an error carrying its message and poisons the instance.

use crate::abi::{self, ErrorBuf, Instance, ModelInfo, ModelVtable, StrRef};
use crate::types::{
    BatchView, EmbeddingSpec, ErrorKind, ImageInput, LoadConfig, LogitsOut, ModelDescription, PluginError,
    PluginManifest, PreparedImage, RgbView, VisionSpec,
};
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A model family: what the plugin serves and how to create a model.
pub trait Family: 'static {
    /// The model type this family creates.
    type Model: Model;

    /// Name, version, families, architectures and formats (ABI fields are filled in by the SDK).
    fn manifest() -> PluginManifest;

    /// How well this plugin serves a model described by `model_config` (a JSON object with at
    /// least `family`, `architecture` and `format`); 0 means it cannot.
    fn probe(model_config: &serde_json::Value) -> u32;

    /// Loads a model.
    fn create(config: &LoadConfig) -> Result<Self::Model, PluginError>;
}

/// A loaded model instance. The host calls it from one thread at a time.
pub trait Model: Send + 'static {
    /// Vocabulary, context, capabilities, stop and special tokens.
    fn describe(&self) -> ModelDescription;

    /// Runs a batch; writes one logits row per row that wants logits, in batch order.
    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError>;

    /// Feeds one token to a sequence without computing logits.
    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError>;

    /// Whether the model will think, given the request's wish.
    fn thinking_enabled(&self, requested: Option<bool>) -> bool {
        requested.unwrap_or(false)
    }

    /// Whether the model can call tools.
    fn tools_enabled(&self) -> bool {
        false
    }

    /// Drops every position at or after `len` from a sequence. A model whose
    /// [`ModelDescription::rewind`] rule does not allow `len` returns an error and leaves the
    /// sequence as it was; the host then truncates to 0 and prefills again.
    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError>;

    /// Copies sequence `src` into `dst`.
    fn seq_fork(&mut self, _src: i32, _dst: i32) -> Result<(), PluginError> {
        Err(PluginError::unsupported("seq_fork"))
    }

    /// How the model takes images (ABI 1.3); `None`, the default, when it takes none. When
    /// `Some`, the SDK also sets `CAP_VISION` in the reported capabilities.
    fn vision(&self) -> Option<VisionSpec> {
        None
    }

    /// Encodes the images of sequence `seq` and keeps their features until the rows at their
    /// placeholder positions are decoded; those rows then take the features in place of the
    /// token embeddings (ABI 1.3). Each input has been validated ([`ImageInput::validate`]).
    /// A truncate below a pending image's positions drops it.
    fn encode_images(&mut self, _seq: i32, _images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        Err(PluginError::unsupported("encode_images"))
    }

    /// Prepares one decoded image as the model's own image processor does (ABI 1.5): the
    /// placeholder text that replaces it in the prompt and its slices, in the order
    /// [`Model::encode_images`] takes them, each with its pixels in the model's layout and the
    /// number of placeholder tokens its features fill. `index` is the image's number among the
    /// request's images, from 0 (MiniCPM-V writes it into the placeholder). A model whose
    /// [`Model::vision`] is `Some` implements it (the default is unsupported, and the host then
    /// refuses every image); an image the model cannot take is an `invalid_argument` error,
    /// which the host answers with a 400 naming the image.
    fn prepare_image(&self, _image: &RgbView<'_>, _index: u32) -> Result<PreparedImage, PluginError> {
        Err(PluginError::unsupported("prepare_image"))
    }

    /// How the model embeds text (ABI 1.4); `None`, the default, when it does not. When `Some`,
    /// the SDK also sets `CAP_EMBEDDING` in the reported capabilities.
    fn embedding(&self) -> Option<EmbeddingSpec> {
        None
    }

    /// Embeds whole sequences of token ids (ABI 1.4), independent of any decode state: returns
    /// one vector of [`EmbeddingSpec::dimensions`] floats per sequence, back to back, in order.
    fn embed(&mut self, _sequences: &[&[i32]]) -> Result<Vec<f32>, PluginError> {
        Err(PluginError::unsupported("embed"))
    }
}

/// The manifest with the SDK's own fields filled in.
pub fn full_manifest<F: Family>(panic_unwind: bool) -> PluginManifest {
    let mut m = F::manifest();
    m.abi_major = abi::ABI_MAJOR;
    m.abi_minor = abi::ABI_MINOR;
    m.panic = if panic_unwind { "unwind" } else { "abort" }.to_string();
    m
}

/// The entry table for family `F`, leaked once per process (used by `export_plugin!`).
pub fn build_entry_table<F: Family>(panic_unwind: bool) -> &'static abi::EntryTable {
    let json: &'static str = Box::leak(
        serde_json::to_string(&full_manifest::<F>(panic_unwind))
            .expect("manifest serializes")
            .into_boxed_str(),
    );
    Box::leak(Box::new(abi::EntryTable {
        header: abi::Header::for_struct::<abi::EntryTable>(),
        flags: if panic_unwind { abi::FLAG_PANIC_UNWIND } else { 0 },
        manifest_json: StrRef::borrow(json),
        probe: Some(probe_entry::<F>),
        create: Some(create_entry::<F>),
    }))
}

/// The manifest as a NUL-terminated string, leaked once per process (used by `export_plugin!`).
pub fn build_manifest_cstr<F: Family>(panic_unwind: bool) -> &'static CString {
    let json = serde_json::to_string(&full_manifest::<F>(panic_unwind)).expect("manifest serializes");
    Box::leak(Box::new(CString::new(json).expect("manifest has no NUL")))
}

/// `Sync` wrapper for the leaked entry table pointer so it can live in a `static`.
pub struct StaticEntry(pub &'static abi::EntryTable);
// SAFETY: the table is immutable after construction and its pointers refer to leaked, immutable
// data (a string) and plain functions.
unsafe impl Sync for StaticEntry {}
// SAFETY: as above.
unsafe impl Send for StaticEntry {}

/// Exports a [`Family`] as a Berth plugin library: defines `berth_plugin_entry_v1` and
/// `berth_plugin_manifest`. Use once per `cdylib`.
#[macro_export]
macro_rules! export_plugin {
    ($family:ty) => {
        /// Berth plugin entry point (ABI v1).
        #[no_mangle]
        pub extern "C" fn berth_plugin_entry_v1() -> *const $crate::abi::EntryTable {
            static TABLE: ::std::sync::OnceLock<$crate::sdk::StaticEntry> = ::std::sync::OnceLock::new();
            TABLE
                .get_or_init(|| {
                    $crate::sdk::StaticEntry($crate::sdk::build_entry_table::<$family>(cfg!(
                        panic = "unwind"
                    )))
                })
                .0
        }

        /// Berth plugin manifest (version-independent): NUL-terminated JSON.
        #[no_mangle]
        pub extern "C" fn berth_plugin_manifest() -> *const ::std::ffi::c_char {
            static MANIFEST: ::std::sync::OnceLock<&'static ::std::ffi::CString> =
                ::std::sync::OnceLock::new();
            MANIFEST
                .get_or_init(|| $crate::sdk::build_manifest_cstr::<$family>(cfg!(panic = "unwind")))
                .as_ptr()
        }
    };
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("plugin panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("plugin panicked: {s}")
    } else {
        "plugin panicked".to_string()
    }
}

/// Reports an error to the host: message into its buffer, kind as the status.
fn report(err: *mut ErrorBuf, e: &PluginError) -> abi::Status {
    // SAFETY: `err` comes from the host, which guarantees it is null or valid.
    unsafe { abi::write_error(err, &e.message) };
    e.kind.status()
}

unsafe extern "C" fn probe_entry<F: Family>(model_config_json: StrRef) -> u32 {
    catch_unwind(|| {
        // SAFETY: the host passes a valid borrowed string for the duration of the call.
        let text = unsafe { model_config_json.as_str() };
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => F::probe(&v),
            Err(_) => 0,
        }
    })
    .unwrap_or(0)
}

unsafe extern "C" fn create_entry<F: Family>(
    load_config_json: StrRef,
    out: *mut Instance,
    err: *mut ErrorBuf,
) -> abi::Status {
    let result = catch_unwind(|| {
        // SAFETY: the host passes a valid borrowed string for the duration of the call.
        let text = unsafe { load_config_json.as_str() };
        let config: LoadConfig = serde_json::from_str(&text)
            .map_err(|e| PluginError::invalid_argument(format!("load config: {e}")))?;
        F::create(&config)
    });
    let model = match result {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return report(err, &e),
        Err(p) => return report(err, &PluginError::failed(panic_message(&*p))),
    };
    let guarded = Box::new(Guarded::<F::Model> {
        vtable: vtable::<F::Model>(),
        model,
        poisoned: None,
        stop_tokens: Vec::new(),
        extra_json: String::new(),
        vision_json: String::new(),
        embedding_json: String::new(),
    });
    let vt: *const ModelVtable = &guarded.vtable;
    let handle = Box::into_raw(guarded) as *mut c_void;
    let instance = Instance {
        header: abi::Header::for_struct::<Instance>(),
        handle,
        vtable: vt,
    };
    // SAFETY: `out` is the host's Instance with its header set to its allocated size.
    if !unsafe { abi::write_versioned(out, &instance) } {
        // SAFETY: handle came from Box::into_raw just above and was never shared.
        drop(unsafe { Box::from_raw(handle as *mut Guarded<F::Model>) });
        return report(
            err,
            &PluginError::invalid_argument("instance out-struct is null or too small"),
        );
    }
    abi::STATUS_OK
}

/// A model plus its vtable and poison state; the opaque handle points at one of these.
struct Guarded<M: Model> {
    vtable: ModelVtable,
    model: M,
    poisoned: Option<String>,
    /// Backing storage for the last `model_info` answer (borrowed by the host until destroy).
    stop_tokens: Vec<i32>,
    /// Backing storage for the last `model_info` answer.
    extra_json: String,
    /// Backing storage for the last `model_info` answer (empty: no images).
    vision_json: String,
    /// Backing storage for the last `model_info` answer (empty: no embeddings).
    embedding_json: String,
}

fn vtable<M: Model>() -> ModelVtable {
    ModelVtable {
        header: abi::Header::for_struct::<ModelVtable>(),
        destroy: Some(destroy_entry::<M>),
        model_info: Some(model_info_entry::<M>),
        decode: Some(decode_entry::<M>),
        force_token: Some(force_token_entry::<M>),
        thinking_enabled: Some(thinking_entry::<M>),
        tools_enabled: Some(tools_entry::<M>),
        seq_truncate: Some(seq_truncate_entry::<M>),
        seq_fork: Some(seq_fork_entry::<M>),
        encode_images: Some(encode_images_entry::<M>),
        embed: Some(embed_entry::<M>),
        prepare_image: Some(prepare_image_entry::<M>),
    }
}

/// Runs `f` on the instance behind `handle` unless it is poisoned; a panic poisons it.
///
/// # Safety
/// `handle` must be a live handle created by `create_entry::<F>` for this `M`.
unsafe fn guarded_call<M: Model, T>(
    handle: *mut c_void,
    err: *mut ErrorBuf,
    f: impl FnOnce(&mut Guarded<M>) -> Result<T, PluginError>,
) -> Result<T, abi::Status> {
    if handle.is_null() {
        return Err(report(
            err,
            &PluginError::invalid_argument("null instance handle"),
        ));
    }
    // SAFETY: per the contract, handle points at a live Guarded<M> used by one thread at a time.
    let g = unsafe { &mut *(handle as *mut Guarded<M>) };
    if let Some(msg) = &g.poisoned {
        return Err(report(err, &PluginError::poisoned(msg.clone())));
    }
    match catch_unwind(AssertUnwindSafe(|| f(g))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(report(err, &e)),
        Err(p) => {
            let msg = panic_message(&*p);
            // SAFETY: as above; the panicking closure's borrow ended when it unwound.
            let g = unsafe { &mut *(handle as *mut Guarded<M>) };
            g.poisoned = Some(msg.clone());
            Err(report(
                err,
                &PluginError {
                    kind: ErrorKind::Poisoned,
                    message: msg,
                },
            ))
        }
    }
}

fn status_of(r: Result<(), abi::Status>) -> abi::Status {
    match r {
        Ok(()) => abi::STATUS_OK,
        Err(s) => s,
    }
}

unsafe extern "C" fn destroy_entry<M: Model>(handle: *mut c_void) {
    if handle.is_null() {
        return;
    }
    // SAFETY: the host calls destroy once, last, with a handle from create_entry.
    let boxed = unsafe { Box::from_raw(handle as *mut Guarded<M>) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

unsafe extern "C" fn model_info_entry<M: Model>(
    handle: *mut c_void,
    out: *mut ModelInfo,
    err: *mut ErrorBuf,
) -> abi::Status {
    let work = |g: &mut Guarded<M>| {
        let d = g.model.describe();
        g.stop_tokens = d.stop_tokens;
        g.extra_json = d.extra.to_string();
        let vision = g.model.vision();
        g.vision_json = match &vision {
            Some(v) => serde_json::to_string(v)
                .map_err(|e| PluginError::failed(format!("vision spec does not serialize: {e}")))?,
            None => String::new(),
        };
        let embedding = g.model.embedding();
        g.embedding_json = match &embedding {
            Some(e) => serde_json::to_string(e)
                .map_err(|e| PluginError::failed(format!("embedding spec does not serialize: {e}")))?,
            None => String::new(),
        };
        let mut capabilities = d.capabilities;
        if vision.is_some() {
            capabilities |= abi::CAP_VISION;
        }
        if embedding.is_some() {
            capabilities |= abi::CAP_EMBEDDING;
        }
        let (rewind, rewind_every) = d.rewind.to_abi();
        let info = ModelInfo {
            header: abi::Header::for_struct::<ModelInfo>(),
            vocab_size: d.vocab_size,
            context_length: d.context_length,
            max_sequences: d.max_sequences,
            reserved: 0,
            capabilities,
            stop_tokens: g.stop_tokens.as_ptr(),
            n_stop_tokens: g.stop_tokens.len() as u32,
            reserved2: 0,
            extra_json: StrRef::borrow(&g.extra_json),
            rewind,
            rewind_every,
            vision_json: StrRef::borrow(&g.vision_json),
            embedding_json: StrRef::borrow(&g.embedding_json),
        };
        // SAFETY: `out` is the host's ModelInfo with its header set to its allocated size.
        if unsafe { abi::write_versioned(out, &info) } {
            Ok(())
        } else {
            Err(PluginError::invalid_argument(
                "model info out-struct is null or too small",
            ))
        }
    };
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, work) })
}

unsafe extern "C" fn decode_entry<M: Model>(
    handle: *mut c_void,
    batch: *const abi::Batch,
    logits: *mut abi::Logits,
    err: *mut ErrorBuf,
) -> abi::Status {
    let work = |g: &mut Guarded<M>| {
        // SAFETY: the host passes a valid batch; we read no further than its struct_size.
        let Some((b, _)) = (unsafe { abi::read_versioned(batch) }) else {
            return Err(PluginError::invalid_argument("null batch"));
        };
        if logits.is_null() {
            return Err(PluginError::invalid_argument("null logits buffer"));
        }
        let n = b.n_tokens as usize;
        if n > 0
            && (b.tokens.is_null() || b.positions.is_null() || b.seq_ids.is_null() || b.want_logits.is_null())
        {
            return Err(PluginError::invalid_argument("batch has a null array"));
        }
        // SAFETY: the host guarantees each array holds n_tokens elements for the call.
        let view = unsafe {
            if n == 0 {
                BatchView {
                    tokens: &[],
                    positions: &[],
                    seq_ids: &[],
                    want_logits: &[],
                }
            } else {
                BatchView {
                    tokens: std::slice::from_raw_parts(b.tokens, n),
                    positions: std::slice::from_raw_parts(b.positions, n),
                    seq_ids: std::slice::from_raw_parts(b.seq_ids, n),
                    want_logits: std::slice::from_raw_parts(b.want_logits, n),
                }
            }
        };
        // SAFETY: logits is non-null and host-owned for the call.
        let l = unsafe { &mut *logits };
        let rows = view.logit_rows();
        let row_len = l.row_len as usize;
        if rows * row_len > l.capacity || (rows > 0 && l.data.is_null()) {
            return Err(PluginError::invalid_argument(format!(
                "logits buffer holds {} floats; {rows} rows of {row_len} need more",
                l.capacity
            )));
        }
        let data: &mut [f32] = if rows == 0 {
            &mut []
        } else {
            // SAFETY: data has `capacity` >= rows*row_len writable floats, host-owned.
            unsafe { std::slice::from_raw_parts_mut(l.data, rows * row_len) }
        };
        let mut out = LogitsOut::new(data, row_len);
        l.rows_written = 0;
        g.model.decode(&view, &mut out)?;
        l.rows_written = rows as u32;
        Ok(())
    };
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, work) })
}

/// Groups an embed batch's rows into whole sequences, in the order they first appear; each must
/// hold its positions 0, 1, … in order.
fn whole_sequences(tokens: &[i32], positions: &[i32], seq_ids: &[i32]) -> Result<Vec<Vec<i32>>, PluginError> {
    let mut order: Vec<i32> = Vec::new();
    let mut seqs: Vec<Vec<i32>> = Vec::new();
    for ((&t, &p), &s) in tokens.iter().zip(positions).zip(seq_ids) {
        let k = match order.iter().position(|&o| o == s) {
            Some(k) => k,
            None => {
                order.push(s);
                seqs.push(Vec::new());
                seqs.len() - 1
            }
        };
        if p < 0 || p as usize != seqs[k].len() {
            return Err(PluginError::invalid_argument(format!(
                "embed: sequence {s} has position {p} where {} was next; sequences must be whole, in order",
                seqs[k].len()
            )));
        }
        seqs[k].push(t);
    }
    Ok(seqs)
}

unsafe extern "C" fn embed_entry<M: Model>(
    handle: *mut c_void,
    batch: *const abi::Batch,
    out: *mut abi::Logits,
    err: *mut ErrorBuf,
) -> abi::Status {
    let work = |g: &mut Guarded<M>| {
        let Some(spec) = g.model.embedding() else {
            return Err(PluginError::unsupported("embed: the model does not embed text"));
        };
        // SAFETY: the host passes a valid batch; we read no further than its struct_size.
        let Some((b, _)) = (unsafe { abi::read_versioned(batch) }) else {
            return Err(PluginError::invalid_argument("null batch"));
        };
        if out.is_null() {
            return Err(PluginError::invalid_argument("null output buffer"));
        }
        let n = b.n_tokens as usize;
        if n > 0 && (b.tokens.is_null() || b.positions.is_null() || b.seq_ids.is_null()) {
            return Err(PluginError::invalid_argument("batch has a null array"));
        }
        // SAFETY: the host guarantees each array holds n_tokens elements for the call.
        let (tokens, positions, seq_ids) = unsafe {
            (
                borrow_slice(b.tokens, n),
                borrow_slice(b.positions, n),
                borrow_slice(b.seq_ids, n),
            )
        };
        let seqs = whole_sequences(tokens, positions, seq_ids)?;
        // SAFETY: out is non-null and host-owned for the call.
        let o = unsafe { &mut *out };
        o.rows_written = 0;
        let dim = spec.dimensions as usize;
        if o.row_len as usize != dim
            || seqs.len() * dim > o.capacity
            || (!seqs.is_empty() && o.data.is_null())
        {
            return Err(PluginError::invalid_argument(format!(
                "embedding buffer: {} floats in rows of {}; {} rows of {dim} needed",
                o.capacity,
                o.row_len,
                seqs.len()
            )));
        }
        let views: Vec<&[i32]> = seqs.iter().map(Vec::as_slice).collect();
        let vectors = g.model.embed(&views)?;
        if vectors.len() != seqs.len() * dim {
            return Err(PluginError::failed(format!(
                "embed returned {} floats for {} sequences of {dim}",
                vectors.len(),
                seqs.len()
            )));
        }
        if !vectors.is_empty() {
            // SAFETY: data holds `capacity` >= vectors.len() writable floats, host-owned.
            unsafe { std::ptr::copy_nonoverlapping(vectors.as_ptr(), o.data, vectors.len()) };
        }
        o.rows_written = seqs.len() as u32;
        Ok(())
    };
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, work) })
}

unsafe extern "C" fn force_token_entry<M: Model>(
    handle: *mut c_void,
    seq: i32,
    token: i32,
    err: *mut ErrorBuf,
) -> abi::Status {
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, |g| g.model.force_token(seq, token)) })
}

unsafe extern "C" fn thinking_entry<M: Model>(handle: *mut c_void, requested: i32) -> i32 {
    let requested = match requested {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    };
    // SAFETY: forwarded host contract.
    let r = unsafe {
        guarded_call::<M, bool>(handle, std::ptr::null_mut(), |g| {
            Ok(g.model.thinking_enabled(requested))
        })
    };
    r.map(i32::from).unwrap_or(0)
}

unsafe extern "C" fn tools_entry<M: Model>(handle: *mut c_void) -> i32 {
    // SAFETY: forwarded host contract.
    let r = unsafe { guarded_call::<M, bool>(handle, std::ptr::null_mut(), |g| Ok(g.model.tools_enabled())) };
    r.map(i32::from).unwrap_or(0)
}

unsafe extern "C" fn seq_truncate_entry<M: Model>(
    handle: *mut c_void,
    seq: i32,
    len: u32,
    err: *mut ErrorBuf,
) -> abi::Status {
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, |g| g.model.seq_truncate(seq, len)) })
}

unsafe extern "C" fn seq_fork_entry<M: Model>(
    handle: *mut c_void,
    src: i32,
    dst: i32,
    err: *mut ErrorBuf,
) -> abi::Status {
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, |g| g.model.seq_fork(src, dst)) })
}

/// Borrows `n` elements at `ptr` as a slice; an empty slice when `n` is 0.
///
/// # Safety
/// When `n > 0`, `ptr` must be non-null and point to `n` elements valid for `'a`.
unsafe fn borrow_slice<'a, T>(ptr: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: per the caller, ptr holds n elements valid for 'a.
        unsafe { std::slice::from_raw_parts(ptr, n) }
    }
}

/// Reads the host's image inputs: each struct within its own size, each array within its length.
///
/// # Safety
/// `images` must be null or point to `n` pointers to valid [`abi::ImageInput`]s whose arrays
/// hold the lengths they state, all valid for the call.
unsafe fn read_images(
    images: *const *const abi::ImageInput,
    n: u32,
) -> Result<Vec<abi::ImageInput>, PluginError> {
    if n > 0 && images.is_null() {
        return Err(PluginError::invalid_argument("null image list"));
    }
    // SAFETY: per the caller, images holds n pointers.
    let ptrs = unsafe { borrow_slice(images, n as usize) };
    let mut raw = Vec::with_capacity(ptrs.len());
    for (i, &p) in ptrs.iter().enumerate() {
        // SAFETY: per the caller, p is null or a valid ImageInput; read within its size.
        let Some((img, _)) = (unsafe { abi::read_versioned(p) }) else {
            return Err(PluginError::invalid_argument(format!(
                "image {i} is null or malformed"
            )));
        };
        if img.ndim as usize > img.shape.len()
            || (img.n_pixels > 0 && img.pixels.is_null())
            || (img.n_patch_mask > 0 && img.patch_mask.is_null())
            || (img.n_positions > 0 && img.positions.is_null())
        {
            return Err(PluginError::invalid_argument(format!(
                "image {i} has a null array or more than 4 dimensions"
            )));
        }
        raw.push(img);
    }
    Ok(raw)
}

unsafe extern "C" fn encode_images_entry<M: Model>(
    handle: *mut c_void,
    seq: i32,
    images: *const *const abi::ImageInput,
    n_images: u32,
    err: *mut ErrorBuf,
) -> abi::Status {
    let work = |g: &mut Guarded<M>| {
        // SAFETY: the host passes n_images valid image pointers for the call.
        let raw = unsafe { read_images(images, n_images) }?;
        let views: Vec<ImageInput<'_>> = raw
            .iter()
            .map(|img| {
                // SAFETY: read_images checked each non-empty array is non-null; the host keeps
                // them valid, with the stated lengths, for the call.
                unsafe {
                    ImageInput {
                        shape: &img.shape[..img.ndim as usize],
                        pixels: borrow_slice(img.pixels, img.n_pixels),
                        patch_mask: (!img.patch_mask.is_null())
                            .then(|| borrow_slice(img.patch_mask, img.n_patch_mask)),
                        grid: (img.grid_rows != 0 || img.grid_cols != 0)
                            .then_some((img.grid_rows, img.grid_cols)),
                        positions: borrow_slice(img.positions, img.n_positions),
                    }
                }
            })
            .collect();
        for (i, v) in views.iter().enumerate() {
            v.validate()
                .map_err(|e| PluginError::invalid_argument(format!("image {i}: {}", e.message)))?;
        }
        g.model.encode_images(seq, &views)
    };
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, work) })
}

/// The error a plugin returns when the host's sink refused what it was handed.
fn refused_by_host(status: abi::Status, what: &str) -> PluginError {
    PluginError {
        kind: ErrorKind::from_status(status),
        message: format!("the host refused the {what}"),
    }
}

unsafe extern "C" fn prepare_image_entry<M: Model>(
    handle: *mut c_void,
    image: *const abi::RgbImage,
    index: u32,
    sink: *const abi::ImageSink,
    err: *mut ErrorBuf,
) -> abi::Status {
    let work = |g: &mut Guarded<M>| {
        // SAFETY: the host passes a valid image for the call; we read within its struct_size.
        let Some((img, _)) = (unsafe { abi::read_versioned(image) }) else {
            return Err(PluginError::invalid_argument("null image"));
        };
        if img.len > 0 && img.data.is_null() {
            return Err(PluginError::invalid_argument("image has null data"));
        }
        // SAFETY: the host guarantees `data` holds `len` bytes for the call.
        let data = unsafe { borrow_slice(img.data, img.len) };
        let view = RgbView {
            width: img.width,
            height: img.height,
            data,
        };
        view.validate()?;
        // SAFETY: the host passes a valid sink for the call; we read within its struct_size.
        let Some((sink, _)) = (unsafe { abi::read_versioned(sink) }) else {
            return Err(PluginError::invalid_argument("null image sink"));
        };
        let (Some(set_placeholder), Some(add_slice)) = (sink.set_placeholder, sink.add_slice) else {
            return Err(PluginError::invalid_argument("the image sink lacks a callback"));
        };
        let prepared = g.model.prepare_image(&view, index)?;
        for (i, s) in prepared.slices.iter().enumerate() {
            s.validate()
                .map_err(|e| PluginError::failed(format!("prepared slice {i}: {}", e.message)))?;
        }
        // SAFETY: the callback is the host's; the string outlives the call.
        let status = unsafe { set_placeholder(sink.context, StrRef::borrow(&prepared.placeholder)) };
        if status != abi::STATUS_OK {
            return Err(refused_by_host(status, "placeholder"));
        }
        for (i, s) in prepared.slices.iter().enumerate() {
            let mut shape = [0u32; 4];
            shape[..s.shape.len()].copy_from_slice(&s.shape);
            let (grid_rows, grid_cols) = s.grid.unwrap_or((0, 0));
            let raw = abi::PreparedSlice {
                header: abi::Header::for_struct::<abi::PreparedSlice>(),
                ndim: s.shape.len() as u32,
                tokens: s.tokens,
                shape,
                pixels: s.pixels.as_ptr(),
                n_pixels: s.pixels.len(),
                patch_mask: s.patch_mask.as_ref().map_or(std::ptr::null(), |m| m.as_ptr()),
                n_patch_mask: s.patch_mask.as_ref().map_or(0, Vec::len),
                grid_rows,
                grid_cols,
            };
            // SAFETY: the callback is the host's; the slice and its arrays outlive the call.
            let status = unsafe { add_slice(sink.context, &raw) };
            if status != abi::STATUS_OK {
                return Err(refused_by_host(status, &format!("slice {i}")));
            }
        }
        Ok(())
    };
    // SAFETY: forwarded host contract.
    status_of(unsafe { guarded_call::<M, ()>(handle, err, work) })
}

/// Reads a NUL-terminated manifest string (helper for hosts reading `berth_plugin_manifest`).
///
/// # Safety
/// `ptr` must be null or a valid NUL-terminated string.
pub unsafe fn manifest_from_cstr(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: per the caller, ptr is a valid NUL-terminated string.
    Some(
        unsafe { std::ffi::CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    )
}
