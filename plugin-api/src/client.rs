//! The host side of the boundary: safe wrappers over a plugin's entry table and its instances.
//! Whoever loads the library (dlopen, or a statically linked plugin in tests) hands the entry
//! table pointer to [`Plugin::from_entry`].

use crate::abi::{self, ErrorBuf, Header, Instance, ModelInfo, ModelVtable, StrRef};
use crate::types::{
    BatchView, EmbeddingSpec, ErrorKind, ImageInput, ModelDescription, PluginError, PreparedImage,
    PreparedSlice, Rewind, RgbView, VisionSpec,
};
use std::ffi::c_void;
use std::mem::size_of;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why an entry table was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbiError {
    /// The entry symbol returned null or a table smaller than its header.
    InvalidTable,
    /// The plugin was built for another major version.
    WrongMajor {
        /// The plugin's major version.
        major: u16,
        /// The plugin's minor version.
        minor: u16,
    },
    /// The plugin was built with `panic = "abort"`, so its panics cannot be contained.
    PanicAbort,
    /// A required entry is missing from the table.
    MissingEntry(&'static str),
}

impl std::fmt::Display for AbiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbiError::InvalidTable => write!(f, "entry table is null or malformed"),
            AbiError::WrongMajor { major, minor } => write!(
                f,
                "was built for ABI {major}.{minor}; this host speaks {}.0-{}.{}",
                abi::ABI_MAJOR,
                abi::ABI_MAJOR,
                abi::ABI_MINOR
            ),
            AbiError::PanicAbort => write!(
                f,
                "was built with panic = \"abort\"; this host needs panic = \"unwind\" to contain plugin panics"
            ),
            AbiError::MissingEntry(name) => write!(f, "has no `{name}` entry"),
        }
    }
}

impl std::error::Error for AbiError {}

/// A validated plugin entry table.
#[derive(Clone, Debug)]
pub struct Plugin {
    table: abi::EntryTable,
    header: Header,
}

// SAFETY: the entry table is immutable static data in a library that is never unloaded; its
// functions are callable from any thread.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

const ERROR_CAP: usize = 4096;

impl Plugin {
    /// Validates the table returned by a plugin's entry symbol.
    ///
    /// # Safety
    /// `ptr` must be null or point to an entry table that stays valid for the rest of the
    /// process (the library is never unloaded).
    pub unsafe fn from_entry(ptr: *const abi::EntryTable) -> Result<Plugin, AbiError> {
        // SAFETY: per the caller, ptr is null or a valid table; we read within its size.
        let (table, header) = unsafe { abi::read_versioned(ptr) }.ok_or(AbiError::InvalidTable)?;
        if header.abi_major != abi::ABI_MAJOR {
            return Err(AbiError::WrongMajor {
                major: header.abi_major,
                minor: header.abi_minor,
            });
        }
        if table.flags & abi::FLAG_PANIC_UNWIND == 0 {
            return Err(AbiError::PanicAbort);
        }
        if table.create.is_none() {
            return Err(AbiError::MissingEntry("create"));
        }
        Ok(Plugin { table, header })
    }

    /// The ABI version (major, minor) the plugin was built for.
    pub fn abi_version(&self) -> (u16, u16) {
        (self.header.abi_major, self.header.abi_minor)
    }

    /// The manifest JSON embedded in the library.
    pub fn manifest_json(&self) -> String {
        // SAFETY: the manifest is static data of a library that is never unloaded.
        unsafe { self.table.manifest_json.as_str() }.into_owned()
    }

    /// Scores a model description (JSON); 0 = cannot serve it.
    pub fn probe(&self, model_config_json: &str) -> u32 {
        match self.table.probe {
            // SAFETY: the string outlives the call; the function is the plugin's probe entry.
            Some(f) => unsafe { f(StrRef::borrow(model_config_json)) },
            None => 0,
        }
    }

    /// Creates a model instance from a load configuration (JSON).
    pub fn create(&self, load_config_json: &str) -> Result<ModelInstance, PluginError> {
        let create = self
            .table
            .create
            .ok_or_else(|| PluginError::unsupported("create"))?;
        let mut err = ErrorStorage::new();
        // SAFETY: a zeroed Instance is valid (AbiStruct); the header tells the plugin its size.
        let mut inst: Instance = unsafe { std::mem::zeroed() };
        inst.header = Header::for_struct::<Instance>();
        // SAFETY: all pointers are valid for the call; the plugin writes within inst's size.
        let status = unsafe { create(StrRef::borrow(load_config_json), &mut inst, err.as_abi()) };
        if status != abi::STATUS_OK {
            return Err(err.to_error(status));
        }
        if inst.handle.is_null() || inst.vtable.is_null() {
            return Err(PluginError::failed("plugin returned a null instance"));
        }
        // SAFETY: the vtable is static for the life of the instance; read within its size.
        let (vtable, vt_header) = unsafe { abi::read_versioned(inst.vtable) }
            .ok_or_else(|| PluginError::failed("plugin returned a malformed vtable"))?;
        let mut instance = ModelInstance {
            handle: inst.handle,
            vtable,
            vt_header,
            err,
            poisoned: None,
            description: ModelDescription::default(),
            vision: None,
            vision_refused: None,
            embedding: None,
        };
        let (description, vision, embedding) = instance.fetch_info()?;
        instance.description = description;
        instance.vision = vision;
        instance.embedding = embedding;
        Ok(instance)
    }
}

/// Host-owned error buffer handed to every fallible call.
#[derive(Debug)]
struct ErrorStorage {
    bytes: Vec<u8>,
    abi: ErrorBuf,
}

impl ErrorStorage {
    fn new() -> Self {
        ErrorStorage {
            bytes: vec![0; ERROR_CAP],
            abi: ErrorBuf {
                header: Header::for_struct::<ErrorBuf>(),
                buf: std::ptr::null_mut(),
                cap: 0,
                len: 0,
            },
        }
    }

    fn as_abi(&mut self) -> *mut ErrorBuf {
        self.abi.buf = self.bytes.as_mut_ptr();
        self.abi.cap = self.bytes.len();
        self.abi.len = 0;
        &mut self.abi
    }

    fn to_error(&self, status: abi::Status) -> PluginError {
        let n = self.abi.len.min(self.bytes.len());
        let mut message = String::from_utf8_lossy(&self.bytes[..n]).into_owned();
        if message.is_empty() {
            message = format!("plugin call failed with status {status}");
        }
        PluginError {
            kind: ErrorKind::from_status(status),
            message,
        }
    }
}

/// A live model instance created by a plugin. Destroyed on drop.
#[derive(Debug)]
pub struct ModelInstance {
    handle: *mut c_void,
    vtable: ModelVtable,
    vt_header: Header,
    err: ErrorStorage,
    poisoned: Option<String>,
    description: ModelDescription,
    vision: Option<VisionSpec>,
    /// Why a vision spec the plugin stated is not honoured (it cannot prepare images).
    vision_refused: Option<String>,
    embedding: Option<EmbeddingSpec>,
}

// SAFETY: the instance is used by one thread at a time (`&mut self` on every call that reaches
// the plugin), which is the contract plugins implement.
unsafe impl Send for ModelInstance {}

impl ModelInstance {
    /// What the model reported when it was created.
    pub fn description(&self) -> &ModelDescription {
        &self.description
    }

    /// How the model takes images; `None` when it takes none (every plugin older than ABI 1.5,
    /// and any whose vision spec is missing or unreadable or that has no `encode_images` or no
    /// `prepare_image`).
    pub fn vision(&self) -> Option<&VisionSpec> {
        self.vision.as_ref()
    }

    /// Whether the model takes images: it stated a [`VisionSpec`] and has `encode_images` and
    /// `prepare_image`.
    pub fn supports_images(&self) -> bool {
        self.vision.is_some()
    }

    /// Why the model takes no images although it stated a vision spec: an ABI 1.3 or 1.4 plugin
    /// has no `prepare_image`, and its images were prepared by host code that no longer exists,
    /// so it loads as a text-only model. `None` otherwise.
    pub fn vision_refused(&self) -> Option<&str> {
        self.vision_refused.as_deref()
    }

    /// How the model embeds text; `None` when it does not (every plugin older than ABI 1.4, and
    /// any whose embedding spec is missing or unreadable or that has no `embed`).
    pub fn embedding(&self) -> Option<&EmbeddingSpec> {
        self.embedding.as_ref()
    }

    /// The ABI version (major, minor) of the plugin's vtable.
    pub fn abi_version(&self) -> (u16, u16) {
        (self.vt_header.abi_major, self.vt_header.abi_minor)
    }

    /// The panic message if the instance was poisoned; it must then be dropped and recreated.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    fn check(&mut self, status: abi::Status) -> Result<(), PluginError> {
        if status == abi::STATUS_OK {
            return Ok(());
        }
        let e = self.err.to_error(status);
        if e.kind == ErrorKind::Poisoned {
            self.poisoned = Some(e.message.clone());
        }
        Err(e)
    }

    fn fetch_info(
        &mut self,
    ) -> Result<(ModelDescription, Option<VisionSpec>, Option<EmbeddingSpec>), PluginError> {
        let f = self
            .vtable
            .model_info
            .ok_or_else(|| PluginError::unsupported("model_info"))?;
        // SAFETY: a zeroed ModelInfo is valid (AbiStruct); unwritten fields stay absent.
        let mut info: ModelInfo = unsafe { std::mem::zeroed() };
        info.header = Header::for_struct::<ModelInfo>();
        let err = self.err.as_abi();
        // SAFETY: handle is live; `info` and `err` are valid for the call.
        let status = unsafe { f(self.handle, &mut info, err) };
        self.check(status)?;
        let stop_tokens = if info.stop_tokens.is_null() || info.n_stop_tokens == 0 {
            Vec::new()
        } else {
            // SAFETY: the plugin keeps the array alive until destroy; we copy it now.
            unsafe { std::slice::from_raw_parts(info.stop_tokens, info.n_stop_tokens as usize) }.to_vec()
        };
        // SAFETY: the plugin keeps the string alive until destroy; we copy it now.
        let extra_text = unsafe { info.extra_json.as_str() };
        let extra = if extra_text.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            serde_json::from_str(&extra_text).unwrap_or(serde_json::Value::Object(Default::default()))
        };
        // ABI 1.2 fields: read only when the plugin wrote them (a 1.0-1.1 plugin rewinds anywhere).
        let written = info.header.struct_size as usize;
        let rewind = if written >= std::mem::offset_of!(ModelInfo, rewind_every) + 4 {
            Rewind::from_abi(info.rewind, info.rewind_every)
        } else {
            Rewind::Anywhere
        };
        // ABI 1.3: the vision spec, honoured only with an `encode_images` entry and (ABI 1.5) a
        // `prepare_image` one; without all three, the model takes no images whatever its
        // capability bits say.
        let mut vision = if written >= std::mem::offset_of!(ModelInfo, vision_json) + size_of::<StrRef>()
            && self.vtable.encode_images.is_some()
        {
            // SAFETY: the plugin keeps the string alive until destroy; we copy it now.
            let text = unsafe { info.vision_json.as_str() };
            serde_json::from_str::<VisionSpec>(&text).ok()
        } else {
            None
        };
        if vision.is_some() && self.vtable.prepare_image.is_none() {
            let (major, minor) = (self.vt_header.abi_major, self.vt_header.abi_minor);
            self.vision_refused = Some(format!(
                "the plugin states a vision spec but, built for ABI {major}.{minor}, has no \
                 prepare_image entry (ABI 1.5) to prepare images with: loaded as a text-only model"
            ));
            vision = None;
        }
        // ABI 1.4: the embedding spec, honoured only with an `embed` entry.
        let embedding = if written >= std::mem::offset_of!(ModelInfo, embedding_json) + size_of::<StrRef>()
            && self.vtable.embed.is_some()
        {
            // SAFETY: the plugin keeps the string alive until destroy; we copy it now.
            let text = unsafe { info.embedding_json.as_str() };
            serde_json::from_str::<EmbeddingSpec>(&text)
                .ok()
                .filter(|e| e.dimensions > 0)
        } else {
            None
        };
        let mut capabilities = info.capabilities;
        if vision.is_some() {
            capabilities |= abi::CAP_VISION;
        } else {
            capabilities &= !abi::CAP_VISION;
        }
        if embedding.is_some() {
            capabilities |= abi::CAP_EMBEDDING;
        } else {
            capabilities &= !abi::CAP_EMBEDDING;
        }
        let description = ModelDescription {
            vocab_size: info.vocab_size,
            context_length: info.context_length,
            max_sequences: info.max_sequences.max(1),
            capabilities,
            stop_tokens,
            extra,
            rewind,
        };
        Ok((description, vision, embedding))
    }

    /// Runs a batch; `logits` receives one row of `vocab_size` floats per row that wants logits.
    /// Returns the number of rows written.
    pub fn decode(&mut self, batch: &BatchView<'_>, logits: &mut [f32]) -> Result<usize, PluginError> {
        batch.validate()?;
        let f = self
            .vtable
            .decode
            .ok_or_else(|| PluginError::unsupported("decode"))?;
        let n = u32::try_from(batch.len()).map_err(|_| PluginError::invalid_argument("batch too large"))?;
        let raw = abi::Batch {
            header: Header::for_struct::<abi::Batch>(),
            n_tokens: n,
            reserved: 0,
            tokens: batch.tokens.as_ptr(),
            positions: batch.positions.as_ptr(),
            seq_ids: batch.seq_ids.as_ptr(),
            want_logits: batch.want_logits.as_ptr(),
        };
        let mut out = abi::Logits {
            header: Header::for_struct::<abi::Logits>(),
            data: logits.as_mut_ptr(),
            capacity: logits.len(),
            row_len: self.description.vocab_size,
            rows_written: 0,
        };
        let err = self.err.as_abi();
        // SAFETY: handle is live; batch arrays, logits and err are valid for the call.
        let status = unsafe { f(self.handle, &raw, &mut out, err) };
        self.check(status)?;
        Ok(out.rows_written as usize)
    }

    /// Feeds one token to a sequence without logits.
    pub fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        let f = self
            .vtable
            .force_token
            .ok_or_else(|| PluginError::unsupported("force_token"))?;
        let err = self.err.as_abi();
        // SAFETY: handle is live; err is valid for the call.
        let status = unsafe { f(self.handle, seq, token, err) };
        self.check(status)
    }

    /// Whether the model will think, given the request's wish.
    pub fn thinking_enabled(&mut self, requested: Option<bool>) -> bool {
        let Some(f) = self.vtable.thinking_enabled else {
            return false;
        };
        let r = match requested {
            None => -1,
            Some(false) => 0,
            Some(true) => 1,
        };
        // SAFETY: handle is live.
        unsafe { f(self.handle, r) != 0 }
    }

    /// Whether the model can call tools.
    pub fn tools_enabled(&mut self) -> bool {
        match self.vtable.tools_enabled {
            // SAFETY: handle is live.
            Some(f) => unsafe { f(self.handle) != 0 },
            None => false,
        }
    }

    /// Drops every position at or after `len` from a sequence; a plugin refuses lengths its
    /// [`Rewind`] rule does not allow (0 and the current length always are).
    pub fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        let f = self
            .vtable
            .seq_truncate
            .ok_or_else(|| PluginError::unsupported("seq_truncate"))?;
        let err = self.err.as_abi();
        // SAFETY: handle is live; err is valid for the call.
        let status = unsafe { f(self.handle, seq, len, err) };
        self.check(status)
    }

    /// Copies sequence `src` into `dst`; unsupported for plugins older than ABI 1.1.
    pub fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        let f = self
            .vtable
            .seq_fork
            .ok_or_else(|| PluginError::unsupported("seq_fork"))?;
        let err = self.err.as_abi();
        // SAFETY: handle is live; err is valid for the call.
        let status = unsafe { f(self.handle, src, dst, err) };
        self.check(status)
    }
}

impl ModelInstance {
    /// Hands the images of sequence `seq` to the model, which encodes them and gives their
    /// features to the rows at their placeholder positions when those are decoded (ABI 1.3).
    /// Call it before decoding those rows. Unsupported unless [`Self::supports_images`].
    pub fn encode_images(&mut self, seq: i32, images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        let f = match self.vtable.encode_images {
            Some(f) if self.vision.is_some() => f,
            _ => {
                return Err(PluginError::unsupported(
                    "encode_images: the model takes no images",
                ))
            }
        };
        for (i, img) in images.iter().enumerate() {
            img.validate()
                .map_err(|e| PluginError::invalid_argument(format!("image {i}: {}", e.message)))?;
        }
        let n = u32::try_from(images.len()).map_err(|_| PluginError::invalid_argument("too many images"))?;
        let raw: Vec<abi::ImageInput> = images
            .iter()
            .map(|img| {
                let mut shape = [0u32; 4];
                shape[..img.shape.len()].copy_from_slice(img.shape);
                let (grid_rows, grid_cols) = img.grid.unwrap_or((0, 0));
                abi::ImageInput {
                    header: Header::for_struct::<abi::ImageInput>(),
                    ndim: img.shape.len() as u32,
                    reserved: 0,
                    shape,
                    pixels: img.pixels.as_ptr(),
                    n_pixels: img.pixels.len(),
                    patch_mask: img.patch_mask.map_or(std::ptr::null(), <[u8]>::as_ptr),
                    n_patch_mask: img.patch_mask.map_or(0, <[u8]>::len),
                    grid_rows,
                    grid_cols,
                    positions: img.positions.as_ptr(),
                    n_positions: img.positions.len(),
                }
            })
            .collect();
        let ptrs: Vec<*const abi::ImageInput> = raw.iter().map(|r| r as *const abi::ImageInput).collect();
        let err = self.err.as_abi();
        // SAFETY: handle is live; every image struct and the arrays it points to outlive the call.
        let status = unsafe { f(self.handle, seq, ptrs.as_ptr(), n, err) };
        self.check(status)
    }
}

/// What a plugin hands back through the [`abi::ImageSink`] during `prepare_image`.
#[derive(Default)]
struct SinkState {
    placeholder: Option<String>,
    slices: Vec<PreparedSlice>,
    /// What the host refused, when it refused something.
    problem: Option<String>,
}

impl SinkState {
    /// Records a refusal and returns its status.
    fn refuse(&mut self, problem: String) -> abi::Status {
        self.problem.get_or_insert(problem);
        abi::STATUS_INVALID_ARGUMENT
    }
}

/// [`abi::ImageSink::set_placeholder`]: copies the text.
unsafe extern "C" fn sink_placeholder(context: *mut c_void, text: StrRef) -> abi::Status {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `context` is the `SinkState` `prepare_image` lent for this call.
        let state = unsafe { &mut *(context as *mut SinkState) };
        if state.placeholder.is_some() {
            return state.refuse("set_placeholder was called twice".into());
        }
        // SAFETY: the plugin keeps the string valid for the callback; we copy it now.
        state.placeholder = Some(unsafe { text.as_str() }.into_owned());
        abi::STATUS_OK
    }))
    .unwrap_or(abi::STATUS_ERROR)
}

/// [`abi::ImageSink::add_slice`]: checks and copies one slice.
unsafe extern "C" fn sink_slice(context: *mut c_void, slice: *const abi::PreparedSlice) -> abi::Status {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `context` is the `SinkState` `prepare_image` lent for this call.
        let state = unsafe { &mut *(context as *mut SinkState) };
        let k = state.slices.len();
        // SAFETY: the plugin passes a valid slice for the callback; read within its size.
        let Some((raw, _)) = (unsafe { abi::read_versioned(slice) }) else {
            return state.refuse(format!("slice {k} is null or malformed"));
        };
        if raw.ndim as usize > raw.shape.len()
            || (raw.n_pixels > 0 && raw.pixels.is_null())
            || (raw.n_patch_mask > 0 && raw.patch_mask.is_null())
        {
            return state.refuse(format!("slice {k} has a null array or more than 4 dimensions"));
        }
        // SAFETY: the arrays are non-null when non-empty (checked) and hold the stated lengths
        // for the callback; we copy them now.
        let (pixels, mask) = unsafe {
            (
                borrow(raw.pixels, raw.n_pixels).to_vec(),
                (!raw.patch_mask.is_null()).then(|| borrow(raw.patch_mask, raw.n_patch_mask).to_vec()),
            )
        };
        let prepared = PreparedSlice {
            shape: raw.shape[..raw.ndim as usize].to_vec(),
            pixels,
            patch_mask: mask,
            grid: (raw.grid_rows != 0 || raw.grid_cols != 0).then_some((raw.grid_rows, raw.grid_cols)),
            tokens: raw.tokens,
        };
        if let Err(e) = prepared.validate() {
            return state.refuse(format!("slice {k}: {}", e.message));
        }
        state.slices.push(prepared);
        abi::STATUS_OK
    }))
    .unwrap_or(abi::STATUS_ERROR)
}

/// Borrows `n` elements at `ptr`; an empty slice when `n` is 0.
///
/// # Safety
/// When `n > 0`, `ptr` must be non-null and point to `n` elements valid for `'a`.
unsafe fn borrow<'a, T>(ptr: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: per the caller, ptr holds n elements valid for 'a.
        unsafe { std::slice::from_raw_parts(ptr, n) }
    }
}

impl ModelInstance {
    /// Has the model prepare one decoded image (ABI 1.5): its placeholder text and its slices
    /// for [`Self::encode_images`], each with the number of placeholder tokens it fills.
    /// `index` is the image's number among the request's images. Unsupported unless
    /// [`Self::supports_images`]; an image the model cannot take is an `InvalidArgument` error.
    pub fn prepare_image(&mut self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        let f = match self.vtable.prepare_image {
            Some(f) if self.vision.is_some() => f,
            _ => {
                return Err(PluginError::unsupported(
                    "prepare_image: the model takes no images",
                ))
            }
        };
        image.validate()?;
        let raw = abi::RgbImage {
            header: Header::for_struct::<abi::RgbImage>(),
            width: image.width,
            height: image.height,
            data: image.data.as_ptr(),
            len: image.data.len(),
        };
        let mut state = SinkState::default();
        let sink = abi::ImageSink {
            header: Header::for_struct::<abi::ImageSink>(),
            context: (&mut state as *mut SinkState).cast(),
            set_placeholder: Some(sink_placeholder),
            add_slice: Some(sink_slice),
        };
        let err = self.err.as_abi();
        // SAFETY: handle is live; the image, the sink and the state it points to, and err
        // outlive the call, and nothing else touches the state during it.
        let status = unsafe { f(self.handle, &raw, index, &sink, err) };
        if let Err(mut e) = self.check(status) {
            if let Some(problem) = state.problem {
                e.message = format!("{}: {problem}", e.message);
            }
            return Err(e);
        }
        let Some(placeholder) = state.placeholder else {
            return Err(PluginError::failed("prepare_image set no placeholder text"));
        };
        if state.slices.is_empty() {
            return Err(PluginError::failed("prepare_image gave no slices"));
        }
        Ok(PreparedImage {
            placeholder,
            slices: state.slices,
        })
    }
}

impl ModelInstance {
    /// Embeds whole sequences of token ids (ABI 1.4): one vector of the spec's `dimensions` per
    /// sequence, in order. At most `max_sequences` sequences per call, none empty. Unsupported
    /// unless [`Self::embedding`] is `Some`.
    pub fn embed(&mut self, sequences: &[&[i32]]) -> Result<Vec<Vec<f32>>, PluginError> {
        let (f, dim) = match (self.vtable.embed, &self.embedding) {
            (Some(f), Some(spec)) => (f, spec.dimensions as usize),
            _ => return Err(PluginError::unsupported("embed: the model does not embed text")),
        };
        if sequences.len() > self.description.max_sequences as usize {
            return Err(PluginError::invalid_argument(format!(
                "embed: {} sequences; the model holds {} at once",
                sequences.len(),
                self.description.max_sequences
            )));
        }
        if let Some(i) = sequences.iter().position(|s| s.is_empty()) {
            return Err(PluginError::invalid_argument(format!(
                "embed: sequence {i} is empty"
            )));
        }
        let total: usize = sequences.iter().map(|s| s.len()).sum();
        let n = u32::try_from(total).map_err(|_| PluginError::invalid_argument("batch too large"))?;
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut seq_ids = Vec::with_capacity(total);
        for (k, s) in sequences.iter().enumerate() {
            tokens.extend_from_slice(s);
            positions.extend(0..s.len() as i32);
            seq_ids.extend(std::iter::repeat_n(k as i32, s.len()));
        }
        let raw = abi::Batch {
            header: Header::for_struct::<abi::Batch>(),
            n_tokens: n,
            reserved: 0,
            tokens: tokens.as_ptr(),
            positions: positions.as_ptr(),
            seq_ids: seq_ids.as_ptr(),
            want_logits: std::ptr::null(),
        };
        let mut data = vec![0f32; sequences.len() * dim];
        let mut out = abi::Logits {
            header: Header::for_struct::<abi::Logits>(),
            data: data.as_mut_ptr(),
            capacity: data.len(),
            row_len: dim as u32,
            rows_written: 0,
        };
        let err = self.err.as_abi();
        // SAFETY: handle is live; the batch arrays, the output buffer and err outlive the call.
        let status = unsafe { f(self.handle, &raw, &mut out, err) };
        self.check(status)?;
        if out.rows_written as usize != sequences.len() {
            return Err(PluginError::failed(format!(
                "embed wrote {} vectors for {} sequences",
                out.rows_written,
                sequences.len()
            )));
        }
        Ok(data.chunks_exact(dim.max(1)).map(<[f32]>::to_vec).collect())
    }
}

impl Drop for ModelInstance {
    fn drop(&mut self) {
        if let Some(destroy) = self.vtable.destroy {
            // SAFETY: destroy is called once, last, with the handle create returned.
            unsafe { destroy(self.handle) };
        }
    }
}
