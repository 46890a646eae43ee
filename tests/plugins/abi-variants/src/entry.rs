//! The entry table, vtable and model of the variants that have an entry symbol, hand-written
//! against the C ABI. Struct layouts differ per variant; the functions are shared.

use crate::{ABI_MAJOR, ABI_MINOR, MANIFEST};
#[cfg(any(feature = "newer", feature = "v1_3"))]
use berth_plugin_api::abi::ImageInput;
use berth_plugin_api::abi::{
    self, Batch, ErrorBuf, Header, Instance, Logits, Status, StrRef, STATUS_INVALID_ARGUMENT, STATUS_OK,
};
#[cfg(feature = "newer")]
use berth_plugin_api::abi::{ImageSink, PreparedSlice, RgbImage};
use std::ffi::c_void;
use std::mem::size_of;

/// Logits per row.
pub const VOCAB: u32 = 16;
/// Longest sequence accepted.
pub const CONTEXT: u32 = 64;
/// Most sequences at once.
pub const MAX_SEQUENCES: u32 = 4;
/// The capability bits reported: `newer` claims images and embeddings with the 1.3, 1.4 and 1.5
/// fields to back them.
#[cfg(feature = "newer")]
const CAPABILITIES: u64 = abi::CAP_VISION | abi::CAP_EMBEDDING;
/// The capability bits reported: `v1_3` states images with the 1.3 fields (but has no 1.5
/// `prepare_image`, so a 1.5 host loads it text-only), and claims `CAP_EMBEDDING`, as a 1.3
/// plugin could, though 1.3 has no way to embed (the host must clear both).
#[cfg(feature = "v1_3")]
const CAPABILITIES: u64 = abi::CAP_VISION | abi::CAP_EMBEDDING;
/// The capability bits reported: `v1_2` claims `CAP_VISION`, as a 1.2 plugin could, though 1.2
/// has no way to take images (the host must clear it).
#[cfg(feature = "v1_2")]
const CAPABILITIES: u64 = abi::CAP_VISION;
/// The capability bits reported.
#[cfg(not(any(feature = "newer", feature = "v1_3", feature = "v1_2")))]
const CAPABILITIES: u64 = 0;
/// Tokens that end generation (borrowed by the host until destroy: static).
static STOP_TOKENS: [i32; 1] = [0];
/// Everything else the model reports.
const EXTRA_JSON: &str = r#"{"architecture": "abi-test"}"#;
/// The `newer`, `v1_3` and `v1_2` variants rewind to snapshots every this many positions (an ABI
/// 1.2 field).
pub const SNAPSHOT_EVERY: u32 = 16;
/// How the `newer` and `v1_3` variants take images (an ABI 1.3 field), with a key no host knows.
#[cfg(any(feature = "newer", feature = "v1_3"))]
pub const VISION_JSON: &str =
    r#"{"scheme": "abi-test", "layout": "chw", "patch_size": 4, "image_token_id": 15, "future_knob": 1}"#;
/// Length of the `newer` variant's embedding vectors.
#[cfg(feature = "newer")]
pub const EMBEDDING_DIMENSIONS: u32 = 4;
/// How the `newer` variant embeds text (an ABI 1.4 field), with a key no host knows.
#[cfg(feature = "newer")]
pub const EMBEDDING_JSON: &str = r#"{"dimensions": 4, "pooling": "mean", "normalized": false, "max_tokens": 64,
    "prompts": {"query": "query: "}, "default_prompt": "query", "future_knob": {"x": 1}}"#;

/// The entry table of ABI 1.0-1.5 (unchanged since 1.0) plus one trailing field (ABI 1.6).
#[cfg(feature = "newer")]
#[repr(C)]
pub struct EntryTable {
    /// Struct header: this struct's own (larger) size, ABI 1.6.
    pub header: Header,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// The manifest JSON (without its NUL).
    pub manifest_json: StrRef,
    /// Scores a model description.
    pub probe: Option<unsafe extern "C" fn(model_config_json: StrRef) -> u32>,
    /// Creates a model instance.
    pub create: Option<
        unsafe extern "C" fn(load_config_json: StrRef, out: *mut Instance, err: *mut ErrorBuf) -> Status,
    >,
    /// A field from the future that a 1.5 host never reads.
    pub future_flags: u64,
}
/// The entry table layout of ABI 1.0 to 2.0 (unchanged).
#[cfg(not(feature = "newer"))]
pub use abi::EntryTable;

/// The 1.1-1.2 vtable (its `model_info` filling this variant's model info), plus the 1.3
/// `encode_images` in `v1_3` and `newer`, and in `newer` the 1.4 `embed`, the 1.5
/// `prepare_image` and one trailing entry (ABI 1.6).
#[cfg(any(feature = "newer", feature = "v1_3", feature = "v1_1", feature = "v1_2"))]
#[repr(C)]
pub struct ModelVtable {
    /// Struct header: this struct's own size (larger than the host's in `newer`).
    pub header: Header,
    /// Releases the instance.
    pub destroy: Option<unsafe extern "C" fn(handle: *mut c_void)>,
    /// Fills a host-allocated model info.
    pub model_info:
        Option<unsafe extern "C" fn(handle: *mut c_void, out: *mut ModelInfo, err: *mut ErrorBuf) -> Status>,
    /// Runs a batch.
    pub decode: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            batch: *const Batch,
            logits: *mut Logits,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// Feeds one token.
    pub force_token:
        Option<unsafe extern "C" fn(handle: *mut c_void, seq: i32, token: i32, err: *mut ErrorBuf) -> Status>,
    /// Whether the model thinks.
    pub thinking_enabled: Option<unsafe extern "C" fn(handle: *mut c_void, requested: i32) -> i32>,
    /// Whether the model calls tools.
    pub tools_enabled: Option<unsafe extern "C" fn(handle: *mut c_void) -> i32>,
    /// Drops positions at or after `len`.
    pub seq_truncate:
        Option<unsafe extern "C" fn(handle: *mut c_void, seq: i32, len: u32, err: *mut ErrorBuf) -> Status>,
    /// Copies a sequence (ABI 1.1).
    pub seq_fork:
        Option<unsafe extern "C" fn(handle: *mut c_void, src: i32, dst: i32, err: *mut ErrorBuf) -> Status>,
    /// Encodes images (ABI 1.3).
    #[cfg(any(feature = "newer", feature = "v1_3"))]
    pub encode_images: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            seq: i32,
            images: *const *const ImageInput,
            n_images: u32,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// Embeds whole sequences (ABI 1.4).
    #[cfg(feature = "newer")]
    pub embed: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            batch: *const Batch,
            out: *mut Logits,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// Prepares an image (ABI 1.5).
    #[cfg(feature = "newer")]
    pub prepare_image: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            image: *const RgbImage,
            index: u32,
            sink: *const ImageSink,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// An entry from the future that a 1.5 host never calls.
    #[cfg(feature = "newer")]
    pub future_entry: Option<unsafe extern "C" fn(handle: *mut c_void) -> Status>,
}

/// The 1.0 vtable: everything before `seq_fork`.
#[cfg(feature = "older")]
#[repr(C)]
pub struct ModelVtable {
    /// Struct header: `abi::MODEL_VTABLE_SIZE_V1_0`, ABI 1.0.
    pub header: Header,
    /// Releases the instance.
    pub destroy: Option<unsafe extern "C" fn(handle: *mut c_void)>,
    /// Fills a host-allocated model info.
    pub model_info:
        Option<unsafe extern "C" fn(handle: *mut c_void, out: *mut ModelInfo, err: *mut ErrorBuf) -> Status>,
    /// Runs a batch.
    pub decode: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            batch: *const Batch,
            logits: *mut Logits,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// Feeds one token.
    pub force_token:
        Option<unsafe extern "C" fn(handle: *mut c_void, seq: i32, token: i32, err: *mut ErrorBuf) -> Status>,
    /// Whether the model thinks.
    pub thinking_enabled: Option<unsafe extern "C" fn(handle: *mut c_void, requested: i32) -> i32>,
    /// Whether the model calls tools.
    pub tools_enabled: Option<unsafe extern "C" fn(handle: *mut c_void) -> i32>,
    /// Drops positions at or after `len`.
    pub seq_truncate:
        Option<unsafe extern "C" fn(handle: *mut c_void, seq: i32, len: u32, err: *mut ErrorBuf) -> Status>,
}

/// The vtable layout of ABI 1.5 (the `v2` variant reuses it under another major).
#[cfg(feature = "v2")]
pub use abi::ModelVtable;

/// The model info of ABI 1.3 (in `v1_3`: it ends before the 1.4 `embedding_json`), or of ABI
/// 1.4-1.5 plus one trailing field (ABI 1.6, in `newer`).
#[cfg(any(feature = "newer", feature = "v1_3"))]
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModelInfo {
    /// Struct header: how much was written, ABI 1.3 or 1.6.
    pub header: Header,
    /// Logits per row.
    pub vocab_size: u32,
    /// Longest sequence accepted.
    pub context_length: u32,
    /// Most sequences at once.
    pub max_sequences: u32,
    /// Always 0.
    pub reserved: u32,
    /// `CAP_*` bits.
    pub capabilities: u64,
    /// Tokens that end generation.
    pub stop_tokens: *const i32,
    /// Number of `stop_tokens`.
    pub n_stop_tokens: u32,
    /// Always 0.
    pub reserved2: u32,
    /// Everything else, as JSON.
    pub extra_json: StrRef,
    /// How far a sequence rewinds: a `REWIND_*` value (ABI 1.2).
    pub rewind: u32,
    /// Snapshot spacing for `REWIND_SNAPSHOTS` (ABI 1.2).
    pub rewind_every: u32,
    /// How the model takes images, as JSON (ABI 1.3).
    pub vision_json: StrRef,
    /// How the model embeds text, as JSON (ABI 1.4).
    #[cfg(feature = "newer")]
    pub embedding_json: StrRef,
    /// A field from the future that a 1.5 host has no room for.
    #[cfg(feature = "newer")]
    pub max_batch_tokens: u64,
}

/// The model info of ABI 1.2: it ends before the 1.3 `vision_json`.
#[cfg(feature = "v1_2")]
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModelInfo {
    /// Struct header: how much was written, ABI 1.2.
    pub header: Header,
    /// Logits per row.
    pub vocab_size: u32,
    /// Longest sequence accepted.
    pub context_length: u32,
    /// Most sequences at once.
    pub max_sequences: u32,
    /// Always 0.
    pub reserved: u32,
    /// `CAP_*` bits.
    pub capabilities: u64,
    /// Tokens that end generation.
    pub stop_tokens: *const i32,
    /// Number of `stop_tokens`.
    pub n_stop_tokens: u32,
    /// Always 0.
    pub reserved2: u32,
    /// Everything else, as JSON.
    pub extra_json: StrRef,
    /// How far a sequence rewinds: a `REWIND_*` value (ABI 1.2).
    pub rewind: u32,
    /// Snapshot spacing for `REWIND_SNAPSHOTS` (ABI 1.2).
    pub rewind_every: u32,
}

/// The model info of ABI 1.0-1.1: it ends before the 1.2 rewind fields.
#[cfg(any(feature = "v1_1", feature = "older"))]
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModelInfo {
    /// Struct header: how much was written, ABI 1.0 or 1.1.
    pub header: Header,
    /// Logits per row.
    pub vocab_size: u32,
    /// Longest sequence accepted.
    pub context_length: u32,
    /// Most sequences at once.
    pub max_sequences: u32,
    /// Always 0.
    pub reserved: u32,
    /// `CAP_*` bits.
    pub capabilities: u64,
    /// Tokens that end generation.
    pub stop_tokens: *const i32,
    /// Number of `stop_tokens`.
    pub n_stop_tokens: u32,
    /// Always 0.
    pub reserved2: u32,
    /// Everything else, as JSON.
    pub extra_json: StrRef,
}

/// The model info layout of ABI 1.5 (the `v2` variant reuses it under another major).
#[cfg(feature = "v2")]
pub use abi::ModelInfo;

// The variants' layouts agree with the host's up to where they end.
const _: () = {
    #[cfg(feature = "newer")]
    {
        use std::mem::offset_of;
        assert!(size_of::<EntryTable>() == size_of::<abi::EntryTable>() + 8);
        assert!(offset_of!(EntryTable, create) == offset_of!(abi::EntryTable, create));
        assert!(size_of::<ModelVtable>() == size_of::<abi::ModelVtable>() + 8);
        assert!(offset_of!(ModelVtable, seq_fork) == offset_of!(abi::ModelVtable, seq_fork));
        assert!(size_of::<ModelInfo>() == size_of::<abi::ModelInfo>() + 8);
        assert!(offset_of!(ModelInfo, extra_json) == offset_of!(abi::ModelInfo, extra_json));
        assert!(offset_of!(ModelInfo, rewind) == offset_of!(abi::ModelInfo, rewind));
        assert!(offset_of!(ModelInfo, rewind_every) == offset_of!(abi::ModelInfo, rewind_every));
        assert!(offset_of!(ModelInfo, vision_json) == offset_of!(abi::ModelInfo, vision_json));
        assert!(offset_of!(ModelVtable, encode_images) == offset_of!(abi::ModelVtable, encode_images));
        assert!(offset_of!(ModelVtable, embed) == offset_of!(abi::ModelVtable, embed));
        assert!(offset_of!(ModelVtable, prepare_image) == offset_of!(abi::ModelVtable, prepare_image));
        assert!(offset_of!(ModelInfo, embedding_json) == offset_of!(abi::ModelInfo, embedding_json));
    }
    #[cfg(feature = "v1_3")]
    {
        use std::mem::offset_of;
        assert!(size_of::<ModelVtable>() == abi::MODEL_VTABLE_SIZE_V1_3);
        assert!(offset_of!(ModelVtable, encode_images) == offset_of!(abi::ModelVtable, encode_images));
        assert!(size_of::<ModelInfo>() == abi::MODEL_INFO_SIZE_V1_3);
        assert!(offset_of!(ModelInfo, vision_json) == offset_of!(abi::ModelInfo, vision_json));
    }
    #[cfg(any(feature = "v1_1", feature = "v1_2"))]
    {
        use std::mem::offset_of;
        assert!(size_of::<ModelVtable>() == abi::MODEL_VTABLE_SIZE_V1_2);
        assert!(offset_of!(ModelVtable, seq_fork) == offset_of!(abi::ModelVtable, seq_fork));
    }
    #[cfg(feature = "v1_2")]
    {
        use std::mem::offset_of;
        assert!(size_of::<ModelInfo>() == abi::MODEL_INFO_SIZE_V1_2);
        assert!(offset_of!(ModelInfo, rewind_every) == offset_of!(abi::ModelInfo, rewind_every));
    }
    #[cfg(any(feature = "v1_1", feature = "older"))]
    {
        use std::mem::offset_of;
        assert!(size_of::<ModelInfo>() == abi::MODEL_INFO_SIZE_V1_1);
        assert!(offset_of!(ModelInfo, extra_json) == offset_of!(abi::ModelInfo, extra_json));
    }
    #[cfg(feature = "older")]
    {
        use std::mem::offset_of;
        assert!(size_of::<ModelVtable>() == abi::MODEL_VTABLE_SIZE_V1_0);
        assert!(offset_of!(ModelVtable, seq_truncate) == offset_of!(abi::ModelVtable, seq_truncate));
    }
};

/// The header this variant writes in front of a struct of `size` bytes.
const fn header(size: usize) -> Header {
    Header {
        struct_size: size as u32,
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
    }
}

/// Lets an immutable table of plain data and function pointers live in a `static`.
struct Shared<T>(T);
// SAFETY: the tables are never mutated; their pointers refer to static strings and functions.
unsafe impl<T> Sync for Shared<T> {}

static ENTRY: Shared<EntryTable> = Shared(EntryTable {
    header: header(size_of::<EntryTable>()),
    flags: abi::FLAG_PANIC_UNWIND,
    manifest_json: StrRef {
        ptr: MANIFEST.as_ptr(),
        len: MANIFEST.len() - 1,
    },
    probe: Some(probe),
    create: Some(create),
    #[cfg(feature = "newer")]
    future_flags: 0,
});

static VTABLE: Shared<ModelVtable> = Shared(ModelVtable {
    header: header(size_of::<ModelVtable>()),
    destroy: Some(destroy),
    model_info: Some(model_info),
    decode: Some(decode),
    force_token: Some(force_token),
    thinking_enabled: Some(thinking_enabled),
    tools_enabled: Some(tools_enabled),
    seq_truncate: Some(seq_truncate),
    #[cfg(not(feature = "older"))]
    seq_fork: Some(seq_fork),
    #[cfg(any(feature = "newer", feature = "v1_3"))]
    encode_images: Some(encode_images),
    #[cfg(feature = "v2")]
    encode_images: None,
    #[cfg(feature = "newer")]
    embed: Some(embed),
    #[cfg(feature = "v2")]
    embed: None,
    #[cfg(feature = "newer")]
    prepare_image: Some(prepare_image),
    #[cfg(feature = "v2")]
    prepare_image: None,
    #[cfg(feature = "newer")]
    future_entry: Some(future_entry),
});

/// Entry symbol of ABI 1 (the `newer`, `v1_3`, `v1_2`, `v1_1` and `older` variants).
#[cfg(not(feature = "v2"))]
#[no_mangle]
pub extern "C" fn berth_plugin_entry_v1() -> *const EntryTable {
    &ENTRY.0
}

/// Entry symbol of ABI 2 (the `v2` variant): a 1.x host never looks it up.
#[cfg(feature = "v2")]
#[no_mangle]
pub extern "C" fn berth_plugin_entry_v2() -> *const EntryTable {
    &ENTRY.0
}

/// The model state behind the opaque handle: how many calls it has served.
struct Toy {
    calls: u64,
}

/// Writes `value` into a struct the host allocated: at most min(host's `struct_size`, ours)
/// bytes, then a header saying how much was written and at which ABI version.
///
/// # Safety
/// `dst` must be null or point to a writable struct whose header holds its allocated size.
unsafe fn write_prefix<T: Copy>(dst: *mut T, value: &T) -> bool {
    if dst.is_null() {
        return false;
    }
    // SAFETY: dst is non-null and begins with the Header its allocator wrote.
    let host = unsafe { std::ptr::read_unaligned(dst as *const Header) };
    let host_size = host.struct_size as usize;
    if host_size < size_of::<Header>() {
        return false;
    }
    let n = host_size.min(size_of::<T>());
    // SAFETY: the host promised `host_size` writable bytes and we write at most that many; no
    // reference to the (possibly smaller) destination as a `T` is ever made.
    unsafe {
        std::ptr::copy_nonoverlapping(value as *const T as *const u8, dst as *mut u8, n);
        std::ptr::write_unaligned(dst as *mut Header, header(n));
    }
    true
}

/// Reports an error: the message into the host's buffer, `status` back.
fn fail(err: *mut ErrorBuf, status: Status, message: &str) -> Status {
    // SAFETY: `err` comes from the host, which passes null or a valid buffer.
    unsafe { abi::write_error(err, message) };
    status
}

unsafe extern "C" fn probe(model_config_json: StrRef) -> u32 {
    // SAFETY: the host passes a string valid for the call.
    let text = unsafe { model_config_json.as_str() };
    let config: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if config["family"] == "abi-test" {
        10
    } else {
        0
    }
}

unsafe extern "C" fn create(_load_config_json: StrRef, out: *mut Instance, err: *mut ErrorBuf) -> Status {
    let handle = Box::into_raw(Box::new(Toy { calls: 0 })) as *mut c_void;
    let instance = Instance {
        header: header(size_of::<Instance>()),
        handle,
        vtable: (&VTABLE.0 as *const ModelVtable).cast(),
    };
    // SAFETY: `out` is the host's Instance, its header set to its allocated size.
    if unsafe { write_prefix(out, &instance) } {
        return STATUS_OK;
    }
    // SAFETY: the handle came from Box::into_raw above and was never handed out.
    drop(unsafe { Box::from_raw(handle as *mut Toy) });
    fail(
        err,
        STATUS_INVALID_ARGUMENT,
        "instance out-struct is null or too small",
    )
}

unsafe extern "C" fn destroy(handle: *mut c_void) {
    if !handle.is_null() {
        // SAFETY: the host calls destroy once, last, with the handle `create` returned.
        drop(unsafe { Box::from_raw(handle as *mut Toy) });
    }
}

/// Counts a call on the instance; false for a null handle.
///
/// # Safety
/// `handle` must be null or a live handle from `create`, used by one thread at a time.
unsafe fn touch(handle: *mut c_void) -> bool {
    if handle.is_null() {
        return false;
    }
    // SAFETY: per the caller, handle points at a live Toy with no other borrow.
    unsafe { (*(handle as *mut Toy)).calls += 1 };
    true
}

unsafe extern "C" fn model_info(handle: *mut c_void, out: *mut ModelInfo, err: *mut ErrorBuf) -> Status {
    // SAFETY: forwarded host contract.
    if !unsafe { touch(handle) } {
        return fail(err, STATUS_INVALID_ARGUMENT, "null handle");
    }
    let info = ModelInfo {
        header: header(size_of::<ModelInfo>()),
        vocab_size: VOCAB,
        context_length: CONTEXT,
        max_sequences: MAX_SEQUENCES,
        reserved: 0,
        capabilities: CAPABILITIES,
        stop_tokens: STOP_TOKENS.as_ptr(),
        n_stop_tokens: STOP_TOKENS.len() as u32,
        reserved2: 0,
        extra_json: StrRef {
            ptr: EXTRA_JSON.as_ptr(),
            len: EXTRA_JSON.len(),
        },
        #[cfg(any(feature = "newer", feature = "v1_3", feature = "v1_2"))]
        rewind: abi::REWIND_SNAPSHOTS,
        #[cfg(any(feature = "newer", feature = "v1_3", feature = "v1_2"))]
        rewind_every: SNAPSHOT_EVERY,
        #[cfg(any(feature = "newer", feature = "v1_3"))]
        vision_json: StrRef {
            ptr: VISION_JSON.as_ptr(),
            len: VISION_JSON.len(),
        },
        #[cfg(feature = "newer")]
        embedding_json: StrRef {
            ptr: EMBEDDING_JSON.as_ptr(),
            len: EMBEDDING_JSON.len(),
        },
        #[cfg(feature = "newer")]
        max_batch_tokens: 512,
        #[cfg(feature = "v2")]
        rewind: abi::REWIND_ANYWHERE,
        #[cfg(feature = "v2")]
        rewind_every: 0,
        #[cfg(feature = "v2")]
        vision_json: StrRef::EMPTY,
        #[cfg(feature = "v2")]
        embedding_json: StrRef::EMPTY,
    };
    // SAFETY: `out` is the host's ModelInfo, its header set to its allocated size (which may be
    // smaller than our struct: write_prefix never writes past it).
    if unsafe { write_prefix(out, &info) } {
        STATUS_OK
    } else {
        fail(
            err,
            STATUS_INVALID_ARGUMENT,
            "model info out-struct is null or too small",
        )
    }
}

unsafe extern "C" fn decode(
    handle: *mut c_void,
    batch: *const Batch,
    logits: *mut Logits,
    err: *mut ErrorBuf,
) -> Status {
    // SAFETY: forwarded host contract.
    if !unsafe { touch(handle) } {
        return fail(err, STATUS_INVALID_ARGUMENT, "null handle");
    }
    // SAFETY: the host passes a valid batch; we read no further than its struct_size.
    let Some((b, _)) = (unsafe { abi::read_versioned(batch) }) else {
        return fail(err, STATUS_INVALID_ARGUMENT, "null batch");
    };
    if logits.is_null() {
        return fail(err, STATUS_INVALID_ARGUMENT, "null logits");
    }
    // SAFETY: the logits struct is host-owned and valid for the call; nothing else aliases it.
    let out = unsafe { &mut *logits };
    out.rows_written = 0;
    let n = b.n_tokens as usize;
    if n == 0 {
        return STATUS_OK;
    }
    if b.positions.is_null() || b.want_logits.is_null() {
        return fail(err, STATUS_INVALID_ARGUMENT, "batch has a null array");
    }
    // SAFETY: the host guarantees each batch array holds n_tokens elements for the call.
    let (positions, want) = unsafe {
        (
            std::slice::from_raw_parts(b.positions, n),
            std::slice::from_raw_parts(b.want_logits, n),
        )
    };
    let rows = want.iter().filter(|&&w| w != 0).count();
    let row_len = out.row_len as usize;
    if row_len < VOCAB as usize || rows * row_len > out.capacity || (rows > 0 && out.data.is_null()) {
        return fail(err, STATUS_INVALID_ARGUMENT, "logits buffer too small");
    }
    if rows == 0 {
        return STATUS_OK;
    }
    // SAFETY: data holds `capacity` >= rows * row_len writable floats, host-owned for the call.
    let data = unsafe { std::slice::from_raw_parts_mut(out.data, rows * row_len) };
    let wanted = positions.iter().zip(want).filter(|(_, &w)| w != 0);
    for (row, (&pos, _)) in data.chunks_exact_mut(row_len).zip(wanted) {
        row.fill(0.0);
        row[(pos + 1).rem_euclid(VOCAB as i32) as usize] = 1.0;
    }
    out.rows_written = rows as u32;
    STATUS_OK
}

unsafe extern "C" fn force_token(handle: *mut c_void, _seq: i32, _token: i32, err: *mut ErrorBuf) -> Status {
    // SAFETY: forwarded host contract.
    if unsafe { touch(handle) } {
        STATUS_OK
    } else {
        fail(err, STATUS_INVALID_ARGUMENT, "null handle")
    }
}

unsafe extern "C" fn thinking_enabled(_handle: *mut c_void, _requested: i32) -> i32 {
    0
}

unsafe extern "C" fn tools_enabled(_handle: *mut c_void) -> i32 {
    0
}

unsafe extern "C" fn seq_truncate(handle: *mut c_void, _seq: i32, _len: u32, err: *mut ErrorBuf) -> Status {
    // SAFETY: forwarded host contract.
    if unsafe { touch(handle) } {
        STATUS_OK
    } else {
        fail(err, STATUS_INVALID_ARGUMENT, "null handle")
    }
}

#[cfg(not(feature = "older"))]
unsafe extern "C" fn seq_fork(handle: *mut c_void, _src: i32, _dst: i32, err: *mut ErrorBuf) -> Status {
    // SAFETY: forwarded host contract.
    if unsafe { touch(handle) } {
        STATUS_OK
    } else {
        fail(err, STATUS_INVALID_ARGUMENT, "null handle")
    }
}

/// Accepts images whose structs and placeholder positions are present, counting a call.
#[cfg(any(feature = "newer", feature = "v1_3"))]
unsafe extern "C" fn encode_images(
    handle: *mut c_void,
    _seq: i32,
    images: *const *const ImageInput,
    n_images: u32,
    err: *mut ErrorBuf,
) -> Status {
    // SAFETY: forwarded host contract.
    if !unsafe { touch(handle) } {
        return fail(err, STATUS_INVALID_ARGUMENT, "null handle");
    }
    if n_images == 0 || images.is_null() {
        return fail(err, STATUS_INVALID_ARGUMENT, "no images");
    }
    // SAFETY: the host passes n_images image pointers, valid for the call.
    let ptrs = unsafe { std::slice::from_raw_parts(images, n_images as usize) };
    for &p in ptrs {
        // SAFETY: each pointer is null or a valid image struct; read within its struct_size.
        match unsafe { abi::read_versioned(p) } {
            Some((img, _)) if img.n_positions > 0 && !img.positions.is_null() => {}
            _ => {
                return fail(
                    err,
                    STATUS_INVALID_ARGUMENT,
                    "an image without placeholder positions",
                )
            }
        }
    }
    STATUS_OK
}

/// The `newer` variant's embedding of one sequence: its length, the sum of its tokens, its
/// first token and its last, as floats.
#[cfg(feature = "newer")]
pub fn toy_embedding(tokens: &[i32]) -> [f32; EMBEDDING_DIMENSIONS as usize] {
    let first = tokens.first().copied().unwrap_or(0);
    let last = tokens.last().copied().unwrap_or(0);
    let sum: i64 = tokens.iter().map(|&t| i64::from(t)).sum();
    [tokens.len() as f32, sum as f32, first as f32, last as f32]
}

/// Groups an embed batch's rows into whole sequences, in the order they first appear: each
/// sequence's rows must hold positions 0, 1, ... in order, its id below [`MAX_SEQUENCES`].
#[cfg(feature = "newer")]
fn whole_sequences(tokens: &[i32], positions: &[i32], seq_ids: &[i32]) -> Result<Vec<Vec<i32>>, String> {
    let mut ids: Vec<i32> = Vec::new();
    let mut seqs: Vec<Vec<i32>> = Vec::new();
    for ((&t, &p), &s) in tokens.iter().zip(positions).zip(seq_ids) {
        if s < 0 || s as u32 >= MAX_SEQUENCES {
            return Err(format!("embed: sequence id {s} is out of range"));
        }
        let k = match ids.iter().position(|&id| id == s) {
            Some(k) => k,
            None => {
                ids.push(s);
                seqs.push(Vec::new());
                seqs.len() - 1
            }
        };
        if usize::try_from(p) != Ok(seqs[k].len()) {
            return Err(format!(
                "embed: sequence {s} has position {p} where {} was next",
                seqs[k].len()
            ));
        }
        seqs[k].push(t);
    }
    Ok(seqs)
}

/// Writes [`toy_embedding`] of each whole sequence in the batch, in order of first appearance.
#[cfg(feature = "newer")]
unsafe extern "C" fn embed(
    handle: *mut c_void,
    batch: *const Batch,
    out: *mut Logits,
    err: *mut ErrorBuf,
) -> Status {
    // SAFETY: forwarded host contract.
    if !unsafe { touch(handle) } {
        return fail(err, STATUS_INVALID_ARGUMENT, "null handle");
    }
    // SAFETY: the host passes a valid batch; we read no further than its struct_size.
    let Some((b, _)) = (unsafe { abi::read_versioned(batch) }) else {
        return fail(err, STATUS_INVALID_ARGUMENT, "null batch");
    };
    if out.is_null() {
        return fail(err, STATUS_INVALID_ARGUMENT, "null output buffer");
    }
    // SAFETY: the output struct is host-owned and valid for the call; nothing else aliases it.
    let o = unsafe { &mut *out };
    o.rows_written = 0;
    let n = b.n_tokens as usize;
    if n > 0 && (b.tokens.is_null() || b.positions.is_null() || b.seq_ids.is_null()) {
        return fail(err, STATUS_INVALID_ARGUMENT, "batch has a null array");
    }
    let (tokens, positions, seq_ids): (&[i32], &[i32], &[i32]) = if n == 0 {
        (&[], &[], &[])
    } else {
        // SAFETY: the host guarantees each batch array holds n_tokens elements for the call.
        unsafe {
            (
                std::slice::from_raw_parts(b.tokens, n),
                std::slice::from_raw_parts(b.positions, n),
                std::slice::from_raw_parts(b.seq_ids, n),
            )
        }
    };
    let seqs = match whole_sequences(tokens, positions, seq_ids) {
        Ok(seqs) => seqs,
        Err(message) => return fail(err, STATUS_INVALID_ARGUMENT, &message),
    };
    let dim = EMBEDDING_DIMENSIONS as usize;
    let len = seqs.len() * dim;
    if o.row_len as usize != dim || len > o.capacity || (len > 0 && o.data.is_null()) {
        return fail(
            err,
            STATUS_INVALID_ARGUMENT,
            "embedding buffer has the wrong rows or too few",
        );
    }
    if len == 0 {
        return STATUS_OK;
    }
    // SAFETY: data holds `capacity` >= len writable floats, host-owned for the call.
    let data = unsafe { std::slice::from_raw_parts_mut(o.data, len) };
    for (row, seq) in data.chunks_exact_mut(dim).zip(&seqs) {
        row.copy_from_slice(&toy_embedding(seq));
    }
    o.rows_written = seqs.len() as u32;
    STATUS_OK
}

/// The `newer` variant's image preparation: the placeholder is `<img>` (token 15), and the one
/// slice holds the image's bytes as floats in channel-first order, `[3, height, width]`.
#[cfg(feature = "newer")]
unsafe extern "C" fn prepare_image(
    handle: *mut c_void,
    image: *const RgbImage,
    _index: u32,
    sink: *const ImageSink,
    err: *mut ErrorBuf,
) -> Status {
    // SAFETY: forwarded host contract.
    if !unsafe { touch(handle) } {
        return fail(err, STATUS_INVALID_ARGUMENT, "null handle");
    }
    // SAFETY: the host passes a valid image and sink for the call; read within their sizes.
    let (Some((img, _)), Some((sink, _))) = (unsafe { abi::read_versioned(image) }, unsafe {
        abi::read_versioned(sink)
    }) else {
        return fail(err, STATUS_INVALID_ARGUMENT, "null image or sink");
    };
    let (w, h) = (img.width as usize, img.height as usize);
    if img.data.is_null() || img.len != w * h * 3 {
        return fail(err, STATUS_INVALID_ARGUMENT, "image bytes do not match its size");
    }
    let (Some(set_placeholder), Some(add_slice)) = (sink.set_placeholder, sink.add_slice) else {
        return fail(err, STATUS_INVALID_ARGUMENT, "sink without callbacks");
    };
    // SAFETY: `data` holds `len` bytes for the call.
    let bytes = unsafe { std::slice::from_raw_parts(img.data, img.len) };
    let mut pixels = vec![0f32; w * h * 3];
    for (i, &b) in bytes.iter().enumerate() {
        pixels[(i % 3) * w * h + i / 3] = f32::from(b);
    }
    let slice = PreparedSlice {
        header: header(size_of::<PreparedSlice>()),
        ndim: 3,
        tokens: 1,
        shape: [3, h as u32, w as u32, 0],
        pixels: pixels.as_ptr(),
        n_pixels: pixels.len(),
        patch_mask: std::ptr::null(),
        n_patch_mask: 0,
        grid_rows: 0,
        grid_cols: 0,
    };
    let text = "<img>";
    // SAFETY: the callbacks are the host's; the text and the slice outlive each call.
    unsafe {
        let status = set_placeholder(
            sink.context,
            StrRef {
                ptr: text.as_ptr(),
                len: text.len(),
            },
        );
        if status != STATUS_OK {
            return status;
        }
        add_slice(sink.context, &slice)
    }
}

#[cfg(feature = "newer")]
unsafe extern "C" fn future_entry(_handle: *mut c_void) -> Status {
    STATUS_OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_plugin_api::Plugin;

    #[cfg(not(feature = "v2"))]
    fn plugin() -> Plugin {
        // SAFETY: the table is this crate's own static.
        unsafe { Plugin::from_entry(berth_plugin_entry_v1().cast()) }.expect("a 1.x table is accepted")
    }

    #[cfg(not(feature = "v2"))]
    #[test]
    fn the_host_client_loads_it_and_decodes() {
        let p = plugin();
        assert_eq!(p.abi_version(), (ABI_MAJOR, ABI_MINOR));
        assert_eq!(p.probe(r#"{"family": "abi-test"}"#), 10);
        assert_eq!(p.probe(r#"{"family": "other"}"#), 0);
        let mut m = p.create("{}").unwrap();
        assert_eq!(m.abi_version(), (ABI_MAJOR, ABI_MINOR));
        let d = m.description();
        assert_eq!(
            (d.vocab_size, d.context_length, d.stop_tokens.clone()),
            (16, 64, vec![0])
        );
        let mut logits = vec![-1.0; 32];
        let b = berth_plugin_api::BatchView {
            tokens: &[3, 4, 5],
            positions: &[0, 1, 15],
            seq_ids: &[0, 0, 0],
            want_logits: &[0, 1, 1],
        };
        assert_eq!(m.decode(&b, &mut logits).unwrap(), 2);
        assert_eq!(logits[2], 1.0);
        assert_eq!(logits[16], 1.0);
        assert_eq!(logits.iter().sum::<f32>(), 2.0);
        m.force_token(0, 1).unwrap();
        m.seq_truncate(0, 0).unwrap();
    }

    #[cfg(feature = "newer")]
    #[test]
    fn fork_works_and_model_info_stays_within_the_hosts_struct() {
        let mut m = plugin().create("{}").unwrap();
        m.seq_fork(0, 1).unwrap();

        // A 1.1-sized ModelInfo followed by a guard the plugin must not touch.
        #[repr(C)]
        struct Guarded {
            info: abi::ModelInfo,
            guard: u64,
        }
        // SAFETY: all-zero is valid for these plain integers and pointers.
        let mut g: Guarded = unsafe { std::mem::zeroed() };
        g.info.header = Header::for_struct::<abi::ModelInfo>();
        g.guard = 0xdead_beef;
        let mut inst: Instance = unsafe { std::mem::zeroed() };
        inst.header = Header::for_struct::<Instance>();
        // SAFETY: valid out-structs and a null error buffer (allowed).
        unsafe {
            assert_eq!(create(StrRef::EMPTY, &mut inst, std::ptr::null_mut()), STATUS_OK);
            let out = &mut g.info as *mut abi::ModelInfo as *mut ModelInfo;
            assert_eq!(model_info(inst.handle, out, std::ptr::null_mut()), STATUS_OK);
            destroy(inst.handle);
        }
        assert_eq!(g.guard, 0xdead_beef);
        assert_eq!(g.info.header, header(size_of::<abi::ModelInfo>()));
        assert_eq!(g.info.vocab_size, VOCAB);
        assert_eq!(
            (g.info.rewind, g.info.rewind_every),
            (abi::REWIND_SNAPSHOTS, SNAPSHOT_EVERY)
        );
        assert_eq!(
            plugin().create("{}").unwrap().description().rewind,
            berth_plugin_api::Rewind::Snapshots {
                every: SNAPSHOT_EVERY
            }
        );
        assert_eq!(
            ENTRY.0.header.struct_size as usize,
            size_of::<abi::EntryTable>() + 8
        );
    }

    #[cfg(feature = "v1_3")]
    #[test]
    fn a_1_3_vision_spec_without_prepare_image_loads_text_only() {
        let m = plugin().create("{}").unwrap();
        assert!(!m.supports_images() && m.vision().is_none());
        assert_eq!(m.description().capabilities & abi::CAP_VISION, 0);
        assert!(m.vision_refused().unwrap().contains("prepare_image"));
    }

    #[cfg(feature = "newer")]
    #[test]
    fn images_are_prepared_through_the_sink_and_reach_its_encode_entry() {
        let mut m = plugin().create("{}").unwrap();
        assert!(m.supports_images());
        let rgb = berth_plugin_api::RgbView {
            width: 2,
            height: 1,
            data: &[1, 2, 3, 4, 5, 6],
        };
        let p = m.prepare_image(&rgb, 0).unwrap();
        assert_eq!(p.placeholder, "<img>");
        assert_eq!(p.slices.len(), 1);
        assert_eq!(
            (p.slices[0].shape.clone(), p.slices[0].tokens),
            (vec![3, 1, 2], 1)
        );
        assert_eq!(p.slices[0].pixels, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        assert_ne!(m.description().capabilities & abi::CAP_VISION, 0);
        let spec = m.vision().unwrap();
        assert_eq!(
            (
                spec.scheme.as_str(),
                spec.layout,
                spec.patch_size,
                spec.image_token_id
            ),
            ("abi-test", berth_plugin_api::PixelLayout::Chw, 4, 15)
        );
        let pixels = [0.5f32; 48];
        let img = berth_plugin_api::ImageInput {
            shape: &[3, 4, 4],
            pixels: &pixels,
            patch_mask: None,
            grid: Some((1, 1)),
            positions: &[2],
        };
        m.encode_images(0, &[img, img]).unwrap();
    }

    #[cfg(feature = "newer")]
    #[test]
    fn the_1_4_embedding_fields_are_read_and_sequences_embed_in_order() {
        let mut m = plugin().create("{}").unwrap();
        assert_ne!(m.description().capabilities & abi::CAP_EMBEDDING, 0);
        let spec = m.embedding().expect("the 1.4 fields are read").clone();
        assert_eq!(
            (spec.dimensions, spec.pooling, spec.normalized, spec.max_tokens),
            (
                EMBEDDING_DIMENSIONS,
                berth_plugin_api::Pooling::Mean,
                false,
                CONTEXT
            )
        );
        assert_eq!(spec.prompts.get("query").map(String::as_str), Some("query: "));
        assert_eq!(spec.default_prompt.as_deref(), Some("query"));
        let vectors = m.embed(&[&[3, 4, 5], &[7]]).unwrap();
        assert_eq!(vectors, vec![vec![3.0, 12.0, 3.0, 5.0], vec![1.0, 7.0, 7.0, 7.0]]);
    }

    /// Calls the `newer` variant's raw `embed` entry on a fresh instance; returns the status
    /// and the rows written.
    #[cfg(feature = "newer")]
    fn raw_embed(
        tokens: &[i32],
        positions: &[i32],
        seq_ids: &[i32],
        row_len: u32,
        data: &mut [f32],
    ) -> (Status, u32) {
        let b = Batch {
            header: Header::for_struct::<Batch>(),
            n_tokens: tokens.len() as u32,
            reserved: 0,
            tokens: tokens.as_ptr(),
            positions: positions.as_ptr(),
            seq_ids: seq_ids.as_ptr(),
            want_logits: std::ptr::null(),
        };
        let mut out = Logits {
            header: Header::for_struct::<Logits>(),
            data: data.as_mut_ptr(),
            capacity: data.len(),
            row_len,
            rows_written: 0,
        };
        // SAFETY: all-zero is valid for these plain integers and pointers.
        let mut inst: Instance = unsafe { std::mem::zeroed() };
        inst.header = Header::for_struct::<Instance>();
        // SAFETY: valid out-structs, a batch whose arrays hold n_tokens rows, an output buffer
        // of `capacity` floats and a null error buffer (allowed); the handle is destroyed last.
        unsafe {
            assert_eq!(create(StrRef::EMPTY, &mut inst, std::ptr::null_mut()), STATUS_OK);
            let status = embed(inst.handle, &b, &mut out, std::ptr::null_mut());
            destroy(inst.handle);
            (status, out.rows_written)
        }
    }

    #[cfg(feature = "newer")]
    #[test]
    fn embed_groups_interleaved_whole_sequences_and_refuses_gaps_and_wrong_buffers() {
        // Sequence 2 starts first, so its vector comes first.
        let mut data = vec![-1.0; 8];
        assert_eq!(
            raw_embed(&[9, 3, 8, 4], &[0, 0, 1, 1], &[2, 0, 2, 0], 4, &mut data),
            (STATUS_OK, 2)
        );
        assert_eq!(data, [2.0, 17.0, 9.0, 8.0, 2.0, 7.0, 3.0, 4.0]);
        let invalid = (STATUS_INVALID_ARGUMENT, 0);
        for (positions, seq_ids) in [
            ([0, 2], [0, 0]),
            ([1, 2], [0, 0]),
            ([1, 0], [0, 0]),
            ([0, -1], [0, 0]),
            ([0, 1], [0, MAX_SEQUENCES as i32]),
        ] {
            let got = raw_embed(&[3, 4], &positions, &seq_ids, 4, &mut [0.0; 8]);
            assert_eq!(got, invalid, "{positions:?} {seq_ids:?}");
        }
        assert_eq!(raw_embed(&[3, 4], &[0, 0], &[0, 1], 3, &mut [0.0; 8]), invalid);
        assert_eq!(raw_embed(&[3, 4], &[0, 0], &[0, 1], 4, &mut [0.0; 7]), invalid);
    }

    #[cfg(not(any(feature = "newer", feature = "v2")))]
    #[test]
    fn a_plugin_before_1_4_has_no_embeddings_and_embed_is_unsupported() {
        let mut m = plugin().create("{}").unwrap();
        assert!(m.embedding().is_none());
        assert_eq!(m.description().capabilities & abi::CAP_EMBEDDING, 0);
        assert_eq!(
            m.embed(&[&[3, 4]]).unwrap_err().kind,
            berth_plugin_api::ErrorKind::Unsupported
        );
    }

    #[cfg(feature = "v1_3")]
    #[test]
    fn model_info_ends_before_embedding_json_and_the_embedding_bit_is_cleared() {
        // The host's ModelInfo with embedding_json pre-set: the plugin must leave it.
        // SAFETY: all-zero is valid for these plain integers and pointers.
        let mut info: abi::ModelInfo = unsafe { std::mem::zeroed() };
        info.header = Header::for_struct::<abi::ModelInfo>();
        info.embedding_json.len = 0xaaaa;
        // SAFETY: all-zero is valid for these plain integers and pointers.
        let mut inst: Instance = unsafe { std::mem::zeroed() };
        inst.header = Header::for_struct::<Instance>();
        // SAFETY: valid out-structs and a null error buffer (allowed).
        unsafe {
            assert_eq!(create(StrRef::EMPTY, &mut inst, std::ptr::null_mut()), STATUS_OK);
            let out = &mut info as *mut abi::ModelInfo as *mut ModelInfo;
            assert_eq!(model_info(inst.handle, out, std::ptr::null_mut()), STATUS_OK);
            destroy(inst.handle);
        }
        assert_eq!(info.header.struct_size as usize, abi::MODEL_INFO_SIZE_V1_3);
        assert_eq!(info.embedding_json.len, 0xaaaa, "written past a 1.3 model info");
        assert_ne!(
            info.capabilities & abi::CAP_EMBEDDING,
            0,
            "the variant claims embeddings"
        );
        assert_eq!(VTABLE.0.header.struct_size as usize, abi::MODEL_VTABLE_SIZE_V1_3);

        let m = plugin().create("{}").unwrap();
        assert!(m.embedding().is_none());
        let caps = m.description().capabilities;
        assert_eq!(caps & abi::CAP_EMBEDDING, 0);
        assert_eq!(
            caps & abi::CAP_VISION,
            0,
            "vision without the 1.5 prepare_image is cleared"
        );
    }

    #[cfg(feature = "v1_2")]
    #[test]
    fn model_info_ends_before_vision_json_and_the_vision_bit_is_cleared() {
        // A 1.3 host's ModelInfo with vision_json pre-set: the plugin must leave it.
        // SAFETY: all-zero is valid for these plain integers and pointers.
        let mut info: abi::ModelInfo = unsafe { std::mem::zeroed() };
        info.header = Header::for_struct::<abi::ModelInfo>();
        info.vision_json.len = 0xaaaa;
        let mut inst: Instance = unsafe { std::mem::zeroed() };
        inst.header = Header::for_struct::<Instance>();
        // SAFETY: valid out-structs and a null error buffer (allowed).
        unsafe {
            assert_eq!(create(StrRef::EMPTY, &mut inst, std::ptr::null_mut()), STATUS_OK);
            let out = &mut info as *mut abi::ModelInfo as *mut ModelInfo;
            assert_eq!(model_info(inst.handle, out, std::ptr::null_mut()), STATUS_OK);
            destroy(inst.handle);
        }
        assert_eq!(info.header.struct_size as usize, abi::MODEL_INFO_SIZE_V1_2);
        assert_eq!(info.vision_json.len, 0xaaaa, "written past a 1.2 model info");
        assert_ne!(
            info.capabilities & abi::CAP_VISION,
            0,
            "the variant claims vision"
        );
        assert_eq!(VTABLE.0.header.struct_size as usize, abi::MODEL_VTABLE_SIZE_V1_2);

        let mut m = plugin().create("{}").unwrap();
        assert!(!m.supports_images() && m.vision().is_none());
        assert_eq!(m.description().capabilities & abi::CAP_VISION, 0);
        assert_eq!(
            m.description().rewind,
            berth_plugin_api::Rewind::Snapshots {
                every: SNAPSHOT_EVERY
            }
        );
        let img = berth_plugin_api::ImageInput {
            shape: &[1],
            pixels: &[0.0],
            patch_mask: None,
            grid: None,
            positions: &[0],
        };
        assert_eq!(
            m.encode_images(0, &[img]).unwrap_err().kind,
            berth_plugin_api::ErrorKind::Unsupported
        );
    }

    #[cfg(any(feature = "v1_1", feature = "older"))]
    #[test]
    fn model_info_ends_before_the_rewind_fields_which_read_as_anywhere() {
        // A 1.2 host's ModelInfo with the rewind fields pre-set: the plugin must leave them.
        // SAFETY: all-zero is valid for these plain integers and pointers.
        let mut info: abi::ModelInfo = unsafe { std::mem::zeroed() };
        info.header = Header::for_struct::<abi::ModelInfo>();
        info.rewind = 0xaaaa;
        let mut inst: Instance = unsafe { std::mem::zeroed() };
        inst.header = Header::for_struct::<Instance>();
        // SAFETY: valid out-structs and a null error buffer (allowed).
        unsafe {
            assert_eq!(create(StrRef::EMPTY, &mut inst, std::ptr::null_mut()), STATUS_OK);
            let out = &mut info as *mut abi::ModelInfo as *mut ModelInfo;
            assert_eq!(model_info(inst.handle, out, std::ptr::null_mut()), STATUS_OK);
            destroy(inst.handle);
        }
        assert_eq!(info.header.struct_size as usize, abi::MODEL_INFO_SIZE_V1_1);
        assert_eq!(info.rewind, 0xaaaa, "written past a 1.1 model info");
        let m = plugin().create("{}").unwrap();
        assert_eq!(m.description().rewind, berth_plugin_api::Rewind::Anywhere);
    }

    #[cfg(feature = "older")]
    #[test]
    fn fork_is_unsupported_because_the_vtable_ends_before_it() {
        let mut m = plugin().create("{}").unwrap();
        assert_eq!(
            m.seq_fork(0, 1).unwrap_err().kind,
            berth_plugin_api::ErrorKind::Unsupported
        );
        assert_eq!(VTABLE.0.header.struct_size as usize, abi::MODEL_VTABLE_SIZE_V1_0);
    }

    #[cfg(feature = "v2")]
    #[test]
    fn a_1x_host_refuses_the_v2_table() {
        // SAFETY: the table is this crate's own static.
        let e = unsafe { Plugin::from_entry(berth_plugin_entry_v2().cast()) }.unwrap_err();
        assert_eq!(e, berth_plugin_api::AbiError::WrongMajor { major: 2, minor: 0 });
    }
}
