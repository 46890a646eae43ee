//! The raw C ABI, version 1: the only thing that crosses between the host and a plugin library.
//!
//! Rules that keep old plugins working in new hosts and new plugins in old hosts:
//! - every struct begins with [`Header`] and only ever grows at its end;
//! - a reader never reads past the writer's `struct_size` (fields it cannot see are absent:
//!   zero, null or `None`);
//! - only `#[repr(C)]` structs, fixed-width integers, pointers with lengths, borrowed UTF-8 and
//!   opaque handles cross; rich data crosses as JSON;
//! - each side frees what it allocated; the host owns the logits and error buffers.
//!
//! Minor versions of ABI 1: 1.0 is the base; 1.1 appended [`ModelVtable::seq_fork`]; 1.2 appended
//! [`ModelInfo::rewind`] and [`ModelInfo::rewind_every`]; 1.3 appended [`ModelInfo::vision_json`]
//! and [`ModelVtable::encode_images`], which takes [`ImageInput`]s; 1.4 appended
//! [`ModelInfo::embedding_json`] and [`ModelVtable::embed`]; 1.5 appended
//! [`ModelVtable::prepare_image`], which takes an [`RgbImage`] and answers through an
//! [`ImageSink`] with [`PreparedSlice`]s.

use std::ffi::{c_char, c_void};

/// Major version of the ABI this crate speaks; a different major is never loaded.
pub const ABI_MAJOR: u16 = 1;
/// Minor version of the ABI this crate speaks; structs of other minors are read up to their size.
pub const ABI_MINOR: u16 = 5;
/// Name of the exported entry symbol; it carries the major version.
pub const ENTRY_SYMBOL: &str = "berth_plugin_entry_v1";
/// Name of the version-independent manifest symbol (`extern "C" fn() -> *const c_char`,
/// NUL-terminated JSON with at least `name`, `version`, `abi_major`, `abi_minor`, `panic`).
pub const MANIFEST_SYMBOL: &str = "berth_plugin_manifest";

/// Plugin flag: the library was built with `panic = "unwind"`, so panics can be caught.
pub const FLAG_PANIC_UNWIND: u32 = 1;

/// Status returned by fallible entries.
pub type Status = i32;
/// The call succeeded.
pub const STATUS_OK: Status = 0;
/// The call failed; the error buffer holds the message.
pub const STATUS_ERROR: Status = 1;
/// The instance panicked earlier (or just now) and refuses further work.
pub const STATUS_POISONED: Status = 2;
/// The entry is not supported by this plugin.
pub const STATUS_UNSUPPORTED: Status = 3;
/// An argument was invalid (a sequence id out of range, a batch that is too large, ...).
pub const STATUS_INVALID_ARGUMENT: Status = 4;

/// Capability flag: the model can call tools.
pub const CAP_TOOLS: u64 = 1 << 0;
/// Capability flag: the model can produce a reasoning block.
pub const CAP_THINKING: u64 = 1 << 1;
/// Capability flag: the model accepts images (honoured from ABI 1.5, with
/// [`ModelInfo::vision_json`], [`ModelVtable::encode_images`] and [`ModelVtable::prepare_image`];
/// a host clears it otherwise).
pub const CAP_VISION: u64 = 1 << 2;
/// Capability flag: the model embeds text (honoured from ABI 1.4, with
/// [`ModelInfo::embedding_json`] and [`ModelVtable::embed`]; a host clears it otherwise).
pub const CAP_EMBEDDING: u64 = 1 << 3;

/// Rewind rule: `seq_truncate` accepts any length (attention-only state; the 1.0-1.1 behaviour).
pub const REWIND_ANYWHERE: u32 = 0;
/// Rewind rule: `seq_truncate` accepts 0, multiples of `rewind_every` and the current length.
pub const REWIND_SNAPSHOTS: u32 = 1;
/// Rewind rule: `seq_truncate` accepts only 0 and the current length (recurrent state).
pub const REWIND_ONLY_TO_START: u32 = 2;

/// The prefix of every struct that crosses: who wrote it and how large the writer's struct is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Size in bytes of the struct as the writer knows it.
    pub struct_size: u32,
    /// Major ABI version of the writer.
    pub abi_major: u16,
    /// Minor ABI version of the writer.
    pub abi_minor: u16,
}

impl Header {
    /// The header a writer of this crate's version puts in front of a `T`.
    pub const fn for_struct<T>() -> Header {
        Header {
            struct_size: std::mem::size_of::<T>() as u32,
            abi_major: ABI_MAJOR,
            abi_minor: ABI_MINOR,
        }
    }
}

/// A borrowed UTF-8 string: pointer and length, no terminator required.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StrRef {
    /// First byte, or null for the empty string.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl StrRef {
    /// The empty string.
    pub const EMPTY: StrRef = StrRef {
        ptr: std::ptr::null(),
        len: 0,
    };

    /// Borrows a Rust string; the caller keeps `s` alive while the `StrRef` is used.
    pub fn borrow(s: &str) -> StrRef {
        StrRef {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// Reads the string back, replacing invalid UTF-8.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes that stay valid for `'a`.
    pub unsafe fn as_str<'a>(self) -> std::borrow::Cow<'a, str> {
        if self.ptr.is_null() || self.len == 0 {
            return std::borrow::Cow::Borrowed("");
        }
        // SAFETY: the caller guarantees `ptr` points to `len` bytes valid for 'a.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        String::from_utf8_lossy(bytes)
    }
}

/// A host-owned buffer the plugin writes an error message into.
#[repr(C)]
#[derive(Debug)]
pub struct ErrorBuf {
    /// Struct header (written by the host).
    pub header: Header,
    /// Host-allocated bytes.
    pub buf: *mut u8,
    /// Capacity of `buf` in bytes.
    pub cap: usize,
    /// Bytes of UTF-8 the plugin wrote (set by the plugin).
    pub len: usize,
}

/// The static table returned by [`ENTRY_SYMBOL`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EntryTable {
    /// Struct header (written by the plugin).
    pub header: Header,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// The plugin's manifest JSON, static for the life of the process.
    pub manifest_json: StrRef,
    /// Scores how well this plugin can serve a model described by JSON; 0 = cannot.
    pub probe: Option<unsafe extern "C" fn(model_config_json: StrRef) -> u32>,
    /// Creates a model instance from a load configuration (JSON).
    pub create: Option<
        unsafe extern "C" fn(load_config_json: StrRef, out: *mut Instance, err: *mut ErrorBuf) -> Status,
    >,
}

/// A created model: an opaque handle plus the functions that operate on it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Instance {
    /// Struct header (the host writes its size; the plugin overwrites it with what it wrote).
    pub header: Header,
    /// Opaque plugin-owned state, released by `destroy`.
    pub handle: *mut c_void,
    /// Static function table for `handle`.
    pub vtable: *const ModelVtable,
}

/// The functions of a model instance. Entries may be `None` (NULL) when not supported.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModelVtable {
    /// Struct header (written by the plugin).
    pub header: Header,
    /// Releases the instance; called once, last.
    pub destroy: Option<unsafe extern "C" fn(handle: *mut c_void)>,
    /// Fills a host-allocated [`ModelInfo`].
    pub model_info:
        Option<unsafe extern "C" fn(handle: *mut c_void, out: *mut ModelInfo, err: *mut ErrorBuf) -> Status>,
    /// Runs the model over a batch and writes one logits row per row that wants logits.
    pub decode: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            batch: *const Batch,
            logits: *mut Logits,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// Feeds one token to a sequence without computing logits.
    pub force_token:
        Option<unsafe extern "C" fn(handle: *mut c_void, seq: i32, token: i32, err: *mut ErrorBuf) -> Status>,
    /// Whether the model will think, given the request's wish (-1 unset, 0 off, 1 on); 0 or 1.
    pub thinking_enabled: Option<unsafe extern "C" fn(handle: *mut c_void, requested: i32) -> i32>,
    /// Whether the model can call tools; 0 or 1.
    pub tools_enabled: Option<unsafe extern "C" fn(handle: *mut c_void) -> i32>,
    /// Drops every position at or after `len` from a sequence's state.
    pub seq_truncate:
        Option<unsafe extern "C" fn(handle: *mut c_void, seq: i32, len: u32, err: *mut ErrorBuf) -> Status>,
    /// Copies the state of sequence `src` into `dst` (ABI 1.1).
    pub seq_fork:
        Option<unsafe extern "C" fn(handle: *mut c_void, src: i32, dst: i32, err: *mut ErrorBuf) -> Status>,
    /// Encodes `n_images` images of sequence `seq` and keeps their features until the rows at
    /// their placeholder positions are decoded, which then take the features in place of the
    /// token embeddings (ABI 1.3). `images` points at `n_images` pointers, each to an
    /// [`ImageInput`] read no further than its own `struct_size`; all are borrowed for the call.
    pub encode_images: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            seq: i32,
            images: *const *const ImageInput,
            n_images: u32,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// Embeds whole sequences (ABI 1.4): every sequence named in `batch` appears whole, its rows
    /// at positions 0, 1, … in order (`want_logits` is not read and may be null). The model runs
    /// over them as its embedding configuration says (attention, pooling, projections; a final
    /// normalisation is the host's) and writes one vector per sequence, in the order the
    /// sequences first appear, as rows of `out` whose `row_len` is the embedding length. Sequence
    /// ids only group rows (at most `max_sequences` sequences per call). A model that embeds is
    /// used for nothing else (the host decodes nothing on it), so the call may use the model's
    /// sequence state as scratch: every sequence is empty afterwards.
    pub embed: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            batch: *const Batch,
            out: *mut Logits,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
    /// Prepares one decoded image for the model (ABI 1.5): resizes, slices or tiles and
    /// normalises it as the model's own image processor does, and hands back, through `sink`'s
    /// callbacks, the placeholder text that replaces the image in the prompt and each slice in
    /// the order `encode_images` takes them (pixels in the model's layout, the number of
    /// placeholder tokens its features fill). `index` is the image's number among the
    /// request's images, from 0. Reads only what the instance fixed when it was created; an
    /// image the model cannot take (too small, too large) is an `INVALID_ARGUMENT` error.
    pub prepare_image: Option<
        unsafe extern "C" fn(
            handle: *mut c_void,
            image: *const RgbImage,
            index: u32,
            sink: *const ImageSink,
            err: *mut ErrorBuf,
        ) -> Status,
    >,
}

/// What a model is, filled by the plugin into a host-allocated struct.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModelInfo {
    /// Struct header (the host writes its size; the plugin overwrites it with what it wrote).
    pub header: Header,
    /// Number of logits per row (the padded vocabulary size).
    pub vocab_size: u32,
    /// Longest sequence the instance accepts, in tokens.
    pub context_length: u32,
    /// Most sequences the instance holds at once.
    pub max_sequences: u32,
    /// Padding that keeps the layout explicit; always 0.
    pub reserved: u32,
    /// `CAP_*` bits.
    pub capabilities: u64,
    /// Tokens that end generation, borrowed until `destroy`.
    pub stop_tokens: *const i32,
    /// Number of `stop_tokens`.
    pub n_stop_tokens: u32,
    /// Padding that keeps the layout explicit; always 0.
    pub reserved2: u32,
    /// JSON object with everything else (special tokens by name, architecture, ...), borrowed
    /// until `destroy`.
    pub extra_json: StrRef,
    /// How far `seq_truncate` can rewind a sequence: a `REWIND_*` value (ABI 1.2; absent reads
    /// as `REWIND_ANYWHERE`).
    pub rewind: u32,
    /// With `REWIND_SNAPSHOTS`: the spacing of the positions a sequence can rewind to (ABI 1.2).
    pub rewind_every: u32,
    /// JSON object stating how the model takes images: `scheme`, `layout`, `patch_size`,
    /// `image_token_id`, scheme `params`; empty when it takes none (ABI 1.3). Borrowed until
    /// `destroy`.
    pub vision_json: StrRef,
    /// JSON object stating how the model embeds text ([`crate::EmbeddingSpec`]: `dimensions`,
    /// `pooling`, `normalized`, `prompts`, …); empty when it does not (ABI 1.4). Borrowed until
    /// `destroy`.
    pub embedding_json: StrRef,
}

/// A batch of tokens to decode, shaped like `llama_batch`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    /// Struct header (written by the host).
    pub header: Header,
    /// Number of rows.
    pub n_tokens: u32,
    /// Padding that keeps the layout explicit; always 0.
    pub reserved: u32,
    /// Token id per row.
    pub tokens: *const i32,
    /// Position of each row within its sequence.
    pub positions: *const i32,
    /// Sequence id per row.
    pub seq_ids: *const i32,
    /// Per row: non-zero when the host wants that row's logits.
    pub want_logits: *const u8,
}

/// One image (one slice or tile of it) for [`ModelVtable::encode_images`], borrowed for the call:
/// f32 pixels in the layout the model's `vision_json` asks for, and the sequence positions whose
/// placeholder tokens its features replace, in order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ImageInput {
    /// Struct header (written by the host).
    pub header: Header,
    /// Number of dimensions used in `shape` (1 to 4).
    pub ndim: u32,
    /// Padding that keeps the layout explicit; always 0.
    pub reserved: u32,
    /// Dimensions of `pixels`, outermost first; entries at or after `ndim` are 0.
    pub shape: [u32; 4],
    /// The pixel values, row-major over `shape`.
    pub pixels: *const f32,
    /// Number of floats in `pixels` (the product of the shape).
    pub n_pixels: usize,
    /// Per patch: non-zero for a real patch, 0 for padding; null when every patch is real.
    pub patch_mask: *const u8,
    /// Number of bytes in `patch_mask`.
    pub n_patch_mask: usize,
    /// Rows of the image's patch grid (its spatial shape); 0 when not given.
    pub grid_rows: u32,
    /// Columns of the image's patch grid; 0 when not given.
    pub grid_cols: u32,
    /// Positions in the sequence of the placeholder tokens the image's features fill, in order.
    pub positions: *const i32,
    /// Number of `positions`.
    pub n_positions: usize,
}

/// A decoded image for [`ModelVtable::prepare_image`], borrowed for the call (ABI 1.5).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RgbImage {
    /// Struct header (written by the host).
    pub header: Header,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// 8-bit RGB, row-major, interleaved: `width * height * 3` bytes.
    pub data: *const u8,
    /// Number of bytes in `data`.
    pub len: usize,
}

/// One slice (or tile) of a prepared image, handed to [`ImageSink::add_slice`] and borrowed for
/// that callback (ABI 1.5): what the host later passes to `encode_images` as an
/// [`ImageInput`], less the positions, plus how many placeholder tokens its features fill.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PreparedSlice {
    /// Struct header (written by the plugin).
    pub header: Header,
    /// Number of dimensions used in `shape` (1 to 4).
    pub ndim: u32,
    /// Placeholder (image feature) tokens of this slice in the placeholder text.
    pub tokens: u32,
    /// Dimensions of `pixels`, outermost first; entries at or after `ndim` are 0.
    pub shape: [u32; 4],
    /// The pixel values, row-major over `shape`, in the model's layout.
    pub pixels: *const f32,
    /// Number of floats in `pixels` (the product of the shape).
    pub n_pixels: usize,
    /// Per patch: non-zero for a real patch, 0 for padding; null when every patch is real.
    pub patch_mask: *const u8,
    /// Number of bytes in `patch_mask`.
    pub n_patch_mask: usize,
    /// Rows of the slice's patch grid; 0 when not given.
    pub grid_rows: u32,
    /// Columns of the slice's patch grid; 0 when not given.
    pub grid_cols: u32,
}

/// Where a plugin hands a prepared image back during [`ModelVtable::prepare_image`] (ABI 1.5):
/// host callbacks that copy what they are given, so nothing the plugin allocated outlives the
/// call. Each callback returns `STATUS_OK`, or another status the plugin returns as its own.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ImageSink {
    /// Struct header (written by the host).
    pub header: Header,
    /// The host's state, passed back to each callback.
    pub context: *mut c_void,
    /// Sets the placeholder text that replaces the image in the prompt (called once).
    pub set_placeholder: Option<unsafe extern "C" fn(context: *mut c_void, text: StrRef) -> Status>,
    /// Appends a slice (in the order `encode_images` takes them; called once per slice).
    pub add_slice: Option<unsafe extern "C" fn(context: *mut c_void, slice: *const PreparedSlice) -> Status>,
}

/// The host-owned buffer a plugin writes logits into.
#[repr(C)]
#[derive(Debug)]
pub struct Logits {
    /// Struct header (written by the host).
    pub header: Header,
    /// Host-allocated floats.
    pub data: *mut f32,
    /// Capacity of `data` in floats.
    pub capacity: usize,
    /// Floats per row (the vocabulary size the host expects).
    pub row_len: u32,
    /// Rows the plugin wrote, in batch order of the rows that wanted logits.
    pub rows_written: u32,
}

/// Signature of the exported entry symbol.
pub type EntryFn = unsafe extern "C" fn() -> *const EntryTable;
/// Signature of the exported manifest symbol.
pub type ManifestFn = unsafe extern "C" fn() -> *const c_char;

/// Size of the 1.0 vtable: everything before `seq_fork`.
pub const MODEL_VTABLE_SIZE_V1_0: usize = std::mem::offset_of!(ModelVtable, seq_fork);
/// Size of the 1.0-1.1 model info: everything before `rewind`.
pub const MODEL_INFO_SIZE_V1_1: usize = std::mem::offset_of!(ModelInfo, rewind);
/// Size of the 1.1-1.2 vtable: everything before `encode_images`.
pub const MODEL_VTABLE_SIZE_V1_2: usize = std::mem::offset_of!(ModelVtable, encode_images);
/// Size of the 1.2 model info: everything before `vision_json`.
pub const MODEL_INFO_SIZE_V1_2: usize = std::mem::offset_of!(ModelInfo, vision_json);
/// Size of the 1.3 vtable: everything before `embed`.
pub const MODEL_VTABLE_SIZE_V1_3: usize = std::mem::offset_of!(ModelVtable, embed);
/// Size of the 1.3 model info: everything before `embedding_json`.
pub const MODEL_INFO_SIZE_V1_3: usize = std::mem::offset_of!(ModelInfo, embedding_json);
/// Size of the 1.4 vtable: everything before `prepare_image`.
pub const MODEL_VTABLE_SIZE_V1_4: usize = std::mem::offset_of!(ModelVtable, prepare_image);

// Layout of ABI v1, frozen: these must never change (only new fields at the ends).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Header>() == 8);
    assert!(size_of::<StrRef>() == 16);
    assert!(size_of::<ErrorBuf>() == 32);
    assert!(offset_of!(ErrorBuf, len) == 24);
    assert!(size_of::<EntryTable>() == 48);
    assert!(offset_of!(EntryTable, manifest_json) == 16);
    assert!(offset_of!(EntryTable, probe) == 32);
    assert!(offset_of!(EntryTable, create) == 40);
    assert!(size_of::<Instance>() == 24);
    assert!(size_of::<ModelVtable>() == 96);
    assert!(offset_of!(ModelVtable, destroy) == 8);
    assert!(offset_of!(ModelVtable, decode) == 24);
    assert!(offset_of!(ModelVtable, seq_truncate) == 56);
    assert!(offset_of!(ModelVtable, seq_fork) == 64);
    assert!(offset_of!(ModelVtable, encode_images) == 72);
    assert!(MODEL_VTABLE_SIZE_V1_2 == 72);
    assert!(offset_of!(ModelVtable, embed) == 80);
    assert!(MODEL_VTABLE_SIZE_V1_3 == 80);
    assert!(offset_of!(ModelVtable, prepare_image) == 88);
    assert!(MODEL_VTABLE_SIZE_V1_4 == 88);
    assert!(size_of::<ModelInfo>() == 104);
    assert!(offset_of!(ModelInfo, capabilities) == 24);
    assert!(offset_of!(ModelInfo, stop_tokens) == 32);
    assert!(offset_of!(ModelInfo, extra_json) == 48);
    assert!(offset_of!(ModelInfo, rewind) == 64);
    assert!(offset_of!(ModelInfo, rewind_every) == 68);
    assert!(offset_of!(ModelInfo, vision_json) == 72);
    assert!(MODEL_INFO_SIZE_V1_1 == 64);
    assert!(MODEL_INFO_SIZE_V1_2 == 72);
    assert!(offset_of!(ModelInfo, embedding_json) == 88);
    assert!(MODEL_INFO_SIZE_V1_3 == 88);
    assert!(size_of::<Batch>() == 48);
    assert!(offset_of!(Batch, want_logits) == 40);
    assert!(size_of::<ImageInput>() == 88);
    assert!(offset_of!(ImageInput, shape) == 16);
    assert!(offset_of!(ImageInput, pixels) == 32);
    assert!(offset_of!(ImageInput, patch_mask) == 48);
    assert!(offset_of!(ImageInput, grid_rows) == 64);
    assert!(offset_of!(ImageInput, positions) == 72);
    assert!(size_of::<RgbImage>() == 32);
    assert!(offset_of!(RgbImage, data) == 16);
    assert!(size_of::<PreparedSlice>() == 72);
    assert!(offset_of!(PreparedSlice, shape) == 16);
    assert!(offset_of!(PreparedSlice, pixels) == 32);
    assert!(offset_of!(PreparedSlice, patch_mask) == 48);
    assert!(offset_of!(PreparedSlice, grid_rows) == 64);
    assert!(size_of::<ImageSink>() == 32);
    assert!(offset_of!(ImageSink, add_slice) == 24);
    assert!(size_of::<Logits>() == 32);
    assert!(offset_of!(Logits, rows_written) == 28);
};

/// Marker for ABI structs whose all-zero bit pattern is a valid "every field absent" value.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, start with [`Header`], and be valid when zeroed
/// (integers, raw pointers and `Option<fn>` only).
pub unsafe trait AbiStruct: Copy {}
// SAFETY: all of these are repr(C), start with Header, and hold only integers, raw pointers,
// StrRef and Option<extern fn>, for which all-zero is valid.
unsafe impl AbiStruct for EntryTable {}
// SAFETY: as above.
unsafe impl AbiStruct for Instance {}
// SAFETY: as above.
unsafe impl AbiStruct for ModelVtable {}
// SAFETY: as above.
unsafe impl AbiStruct for ModelInfo {}
// SAFETY: as above.
unsafe impl AbiStruct for Batch {}
// SAFETY: as above (the `[u32; 4]` shape is plain integers too).
unsafe impl AbiStruct for ImageInput {}
// SAFETY: as above.
unsafe impl AbiStruct for RgbImage {}
// SAFETY: as above (the `[u32; 4]` shape is plain integers too).
unsafe impl AbiStruct for PreparedSlice {}
// SAFETY: as above.
unsafe impl AbiStruct for ImageSink {}

/// Reads a struct written by the other side, copying at most its writer's `struct_size` bytes;
/// fields beyond that read as zero (absent). Returns `None` for null or a size below the header.
///
/// # Safety
/// `ptr` must be null or point to at least `header.struct_size` readable bytes.
pub unsafe fn read_versioned<T: AbiStruct>(ptr: *const T) -> Option<(T, Header)> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: ptr is non-null and points to at least a Header (every ABI struct begins with one).
    let header = unsafe { std::ptr::read_unaligned(ptr as *const Header) };
    let writer_size = header.struct_size as usize;
    if writer_size < std::mem::size_of::<Header>() {
        return None;
    }
    let n = writer_size.min(std::mem::size_of::<T>());
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the writer promised `struct_size` readable bytes; we copy no more than that and no
    // more than our own struct holds; a zeroed T is valid per AbiStruct.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr() as *mut u8, n);
        Some((out.assume_init(), header))
    }
}

/// Writes `value` into a struct allocated by the other side, no further than the size that side
/// announced in its header; the header left behind says how much was written.
///
/// # Safety
/// `dst` must be null or point to a writable struct whose header holds its true allocated size.
pub unsafe fn write_versioned<T: AbiStruct>(dst: *mut T, value: &T) -> bool {
    if dst.is_null() {
        return false;
    }
    // SAFETY: dst is non-null and begins with a Header written by its allocator.
    let reader_header = unsafe { std::ptr::read_unaligned(dst as *const Header) };
    let cap = reader_header.struct_size as usize;
    if cap < std::mem::size_of::<Header>() {
        return false;
    }
    let n = cap.min(std::mem::size_of::<T>());
    // SAFETY: the allocator promised `cap` writable bytes; we write at most that many.
    unsafe {
        std::ptr::copy_nonoverlapping(value as *const T as *const u8, dst as *mut u8, n);
        let header = Header {
            struct_size: n as u32,
            abi_major: ABI_MAJOR,
            abi_minor: ABI_MINOR,
        };
        std::ptr::write_unaligned(dst as *mut Header, header);
    }
    true
}

/// Writes a message into a host error buffer, truncated at a character boundary.
///
/// # Safety
/// `err` must be null or a valid [`ErrorBuf`] whose `buf` has `cap` writable bytes.
pub unsafe fn write_error(err: *mut ErrorBuf, message: &str) {
    if err.is_null() {
        return;
    }
    // SAFETY: err is non-null and valid per the caller.
    let e = unsafe { &mut *err };
    if e.buf.is_null() || e.cap == 0 {
        e.len = 0;
        return;
    }
    let mut n = message.len().min(e.cap);
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: buf has cap >= n writable bytes.
    unsafe { std::ptr::copy_nonoverlapping(message.as_ptr(), e.buf, n) };
    e.len = n;
}
