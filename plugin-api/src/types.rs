//! Safe Rust types shared by both sides of the boundary: manifests, load configs, errors.

use crate::abi;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// What a plugin is: shipped as JSON in the library and in its sidecar file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginManifest {
    /// Short plugin name, e.g. `qwen3`.
    pub name: String,
    /// The plugin's own version, e.g. `0.1.0`.
    pub version: String,
    /// One line saying what the plugin serves.
    #[serde(default)]
    pub description: String,
    /// ABI major version the library was built for (filled in by the SDK).
    #[serde(default)]
    pub abi_major: u16,
    /// ABI minor version the library was built for (filled in by the SDK).
    #[serde(default)]
    pub abi_minor: u16,
    /// Panic strategy the library was built with: `unwind` or `abort` (filled in by the SDK).
    #[serde(default)]
    pub panic: String,
    /// Model families served (`qwen3`, `gemma`, ...).
    #[serde(default)]
    pub families: Vec<String>,
    /// Architectures served (GGUF `general.architecture` or HF `model_type` values).
    #[serde(default)]
    pub architectures: Vec<String>,
    /// Weight formats read (`gguf`, `safetensors`).
    #[serde(default)]
    pub weight_formats: Vec<String>,
}

/// What the host tells a plugin when it creates a model instance (crosses as JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadConfig {
    /// Directory of the model pack.
    pub pack_dir: PathBuf,
    /// Pack reference, `name:tag`.
    #[serde(default)]
    pub reference: String,
    /// Family from the pack manifest.
    #[serde(default)]
    pub family: String,
    /// Architecture from the pack manifest.
    #[serde(default)]
    pub architecture: String,
    /// Weight format: `gguf` or `safetensors`.
    #[serde(default)]
    pub format: String,
    /// Weight files, absolute paths.
    #[serde(default)]
    pub weights: Vec<PathBuf>,
    /// Requested context length; `None` means the model's own.
    #[serde(default)]
    pub context_length: Option<u32>,
    /// Most sequences the host will run at once.
    #[serde(default)]
    pub max_sequences: Option<u32>,
    /// Compute threads; `None` means the plugin decides.
    #[serde(default)]
    pub threads: Option<u32>,
    /// Anything else, free-form.
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
}

/// How far back `seq_truncate` can take a sequence. Attention-only models cut their KV cache
/// anywhere; models with recurrent per-sequence state (short convolutions, gated delta-nets) can
/// only return to positions where they keep a snapshot. Truncating to 0 and to the current
/// length is always allowed; a plugin refuses (with an error) a truncate its rule does not allow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Rewind {
    /// To any length (the behaviour of every ABI 1.0-1.1 plugin).
    #[default]
    Anywhere,
    /// To multiples of `every` positions (where the plugin keeps snapshots), 0 and the current
    /// length.
    Snapshots {
        /// Spacing of the snapshots, in positions (at least 1).
        every: u32,
    },
    /// Only to 0 and the current length.
    OnlyToStart,
}

impl Rewind {
    /// Whether a sequence holding `current` positions can be truncated to `len`.
    pub fn allows(&self, len: u32, current: u32) -> bool {
        if len == 0 || len >= current {
            return true;
        }
        match *self {
            Rewind::Anywhere => true,
            Rewind::Snapshots { every } => every != 0 && len.is_multiple_of(every),
            Rewind::OnlyToStart => false,
        }
    }

    /// The longest length at most `len` that a sequence holding `current` positions can be
    /// truncated to (`current` itself when `len >= current`; 0 when nothing else is allowed).
    pub fn floor(&self, len: u32, current: u32) -> u32 {
        if len >= current {
            return current;
        }
        match *self {
            Rewind::Anywhere => len,
            Rewind::Snapshots { every } if every != 0 => len - len % every,
            Rewind::Snapshots { .. } | Rewind::OnlyToStart => 0,
        }
    }

    /// The ABI encoding: (`ModelInfo::rewind`, `ModelInfo::rewind_every`).
    pub fn to_abi(self) -> (u32, u32) {
        match self {
            Rewind::Anywhere => (abi::REWIND_ANYWHERE, 0),
            Rewind::Snapshots { every } => (abi::REWIND_SNAPSHOTS, every),
            Rewind::OnlyToStart => (abi::REWIND_ONLY_TO_START, 0),
        }
    }

    /// Decodes the ABI fields; a rule this version does not know, or snapshots every 0
    /// positions, reads as [`Rewind::OnlyToStart`] (the rule every plugin honours).
    pub fn from_abi(rewind: u32, every: u32) -> Rewind {
        match rewind {
            abi::REWIND_ANYWHERE => Rewind::Anywhere,
            abi::REWIND_SNAPSHOTS if every > 0 => Rewind::Snapshots { every },
            _ => Rewind::OnlyToStart,
        }
    }
}

/// What a model instance reports about itself, in safe form. Build it with
/// `..Default::default()` for the fields you leave at their defaults, so fields added by later
/// ABI minors do not break the plugin's source.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelDescription {
    /// Logits per row (padded vocabulary size).
    pub vocab_size: u32,
    /// Longest sequence accepted.
    pub context_length: u32,
    /// Most sequences held at once.
    pub max_sequences: u32,
    /// `abi::CAP_*` bits.
    pub capabilities: u64,
    /// Tokens that end generation.
    pub stop_tokens: Vec<i32>,
    /// Everything else (special tokens by name, ...), a JSON object.
    pub extra: serde_json::Value,
    /// How far `seq_truncate` can rewind a sequence (ABI 1.2; older plugins read as anywhere).
    pub rewind: Rewind,
}

/// How the pixels of an [`ImageInput`] are laid out (the model asks for one in its
/// [`VisionSpec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PixelLayout {
    /// Channel-first normalised pixels, shape `[C, H, W]`.
    Chw,
    /// Flattened patches, shape `[N, C·p·p]`: one row per patch, row-major over the patch grid,
    /// the values within a patch in the order the scheme's processor uses (SigLIP2 NaViT style);
    /// padded patches are marked in the patch mask.
    Patches,
    /// MiniCPM-V's NaViT strip, shape `[C, p, (H/p)·(W/p)·p]`: the patches of the grid laid side
    /// by side, row-major.
    PatchStrip,
}

/// How a model takes images (ABI 1.3, `ModelInfo.vision_json`). The host decodes an image,
/// has the model prepare it (`prepare_image`, ABI 1.5: resize, slices, normalisation, the
/// placeholder text), puts the placeholder in the prompt and hands the slices, with the
/// positions of their placeholder tokens, to `encode_images`. Of this spec the host reads only
/// `image_token_id`; the rest describes the model to people and tools.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VisionSpec {
    /// The model's preprocessing scheme, e.g. `minicpmv` or `lfm2_vl` (informational).
    #[serde(default)]
    pub scheme: String,
    /// Layout of each image's pixels.
    pub layout: PixelLayout,
    /// Side of a vision-encoder patch, in pixels.
    pub patch_size: u32,
    /// Token id of the placeholder whose rows take the image features.
    pub image_token_id: i32,
    /// The scheme's own settings (slicing limits, tokens per image or slice, normalisation, the
    /// other special tokens ...), a JSON object the scheme defines (informational: the plugin
    /// prepares its images itself).
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// How a model pools the hidden states of a sequence into one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The mean over every token (sentence-transformers `pooling_mode_mean_tokens`).
    Mean,
    /// The last token's state (Qwen3-Embedding; `pooling_mode_lasttoken`).
    LastToken,
    /// The first token's state (`pooling_mode_cls_token`).
    Cls,
}

/// How a model embeds text (ABI 1.4, `ModelInfo.embedding_json`). The plugin runs the embedding
/// model up to its last projection (attention, pooling, dense layers); the host adds the prompt,
/// tokenizes, may truncate a vector to fewer dimensions (Matryoshka), and L2-normalises it when
/// `normalized` says the model ends with a Normalize module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingSpec {
    /// Length of each vector `embed` writes.
    pub dimensions: u32,
    /// How token states become one vector.
    pub pooling: Pooling,
    /// The model ends with a Normalize module: the host L2-normalises each vector (after any
    /// truncation). `embed` leaves them as the last projection wrote them, so that a host can
    /// also hand out the raw vector (Ollama's legacy `/api/embeddings`).
    pub normalized: bool,
    /// Longest sequence, in tokens, the model embeds (its training length).
    pub max_tokens: u32,
    /// Named prompts put before the text (sentence-transformers `prompts`, e.g. `query`,
    /// `document`).
    #[serde(default)]
    pub prompts: std::collections::BTreeMap<String, String>,
    /// The prompt used when the request names none.
    #[serde(default)]
    pub default_prompt: Option<String>,
}

/// One image (or one slice or tile of it) for `encode_images`, in safe form.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImageInput<'a> {
    /// Dimensions of `pixels`, outermost first (1 to 4 of them).
    pub shape: &'a [u32],
    /// The pixel values, row-major over `shape`, in the model's [`PixelLayout`].
    pub pixels: &'a [f32],
    /// Per patch: non-zero for a real patch, 0 for padding; `None` when every patch is real.
    pub patch_mask: Option<&'a [u8]>,
    /// The image's patch grid as (rows, cols), when the layout needs it.
    pub grid: Option<(u32, u32)>,
    /// Positions in the sequence of the placeholder tokens its features fill, in order.
    pub positions: &'a [i32],
}

impl ImageInput<'_> {
    /// Checks the shape has 1 to 4 dimensions whose product is the pixel count, that there are
    /// placeholder positions, none negative, and that a mask and grid are not empty.
    pub fn validate(&self) -> Result<(), PluginError> {
        check_pixels(self.shape, self.pixels.len(), self.patch_mask, self.grid)?;
        if self.positions.is_empty() {
            return Err(PluginError::invalid_argument(
                "image has no placeholder positions",
            ));
        }
        if self.positions.iter().any(|&p| p < 0) {
            return Err(PluginError::invalid_argument(
                "image placeholder position is negative",
            ));
        }
        Ok(())
    }
}

/// Checks a pixel tensor: 1 to 4 dimensions whose product is `n_pixels`, a mask and a grid
/// that are not empty.
fn check_pixels(
    shape: &[u32],
    n_pixels: usize,
    patch_mask: Option<&[u8]>,
    grid: Option<(u32, u32)>,
) -> Result<(), PluginError> {
    if shape.is_empty() || shape.len() > 4 {
        return Err(PluginError::invalid_argument(format!(
            "image shape has {} dimensions; 1 to 4 are allowed",
            shape.len()
        )));
    }
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
    if count != Some(n_pixels) {
        return Err(PluginError::invalid_argument(format!(
            "image shape {shape:?} does not hold the {n_pixels} pixel values given"
        )));
    }
    if patch_mask.is_some_and(<[u8]>::is_empty) {
        return Err(PluginError::invalid_argument("image patch mask is empty"));
    }
    if grid.is_some_and(|(r, c)| r == 0 || c == 0) {
        return Err(PluginError::invalid_argument("image patch grid has a zero side"));
    }
    Ok(())
}

/// A decoded image handed to `prepare_image` (ABI 1.5): 8-bit RGB, row-major, interleaved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RgbView<'a> {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height * 3` bytes.
    pub data: &'a [u8],
}

impl RgbView<'_> {
    /// Checks neither side is 0 and the bytes are exactly `width * height * 3`.
    pub fn validate(&self) -> Result<(), PluginError> {
        let want = (self.width as usize)
            .checked_mul(self.height as usize)
            .and_then(|n| n.checked_mul(3));
        if self.width == 0 || self.height == 0 || want != Some(self.data.len()) {
            return Err(PluginError::invalid_argument(format!(
                "a {}x{} RGB image needs {} bytes; {} given",
                self.width,
                self.height,
                want.map_or_else(|| "too many".to_string(), |n| n.to_string()),
                self.data.len()
            )));
        }
        Ok(())
    }
}

/// One slice (or tile) of a prepared image (ABI 1.5): what `encode_images` later receives as
/// an [`ImageInput`], less the positions, and how many placeholder tokens its features fill.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PreparedSlice {
    /// Dimensions of `pixels`, outermost first (1 to 4 of them).
    pub shape: Vec<u32>,
    /// The pixel values, row-major over `shape`, in the model's layout.
    pub pixels: Vec<f32>,
    /// Per patch: non-zero for a real patch, 0 for padding; `None` when every patch is real.
    pub patch_mask: Option<Vec<u8>>,
    /// The slice's patch grid as (rows, cols), when the model needs it.
    pub grid: Option<(u32, u32)>,
    /// Placeholder (image feature) tokens of this slice in the placeholder text (at least 1).
    pub tokens: u32,
}

impl PreparedSlice {
    /// Checks the shape has 1 to 4 dimensions whose product is the pixel count, that a mask and
    /// grid are not empty, and that the slice fills at least one placeholder token.
    pub fn validate(&self) -> Result<(), PluginError> {
        check_pixels(
            &self.shape,
            self.pixels.len(),
            self.patch_mask.as_deref(),
            self.grid,
        )?;
        if self.tokens == 0 {
            return Err(PluginError::invalid_argument(
                "image slice fills no placeholder tokens",
            ));
        }
        Ok(())
    }
}

/// An image prepared by its model (ABI 1.5): the text that replaces it in the prompt and its
/// slices, in the order `encode_images` takes them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PreparedImage {
    /// The placeholder text; it holds the image token once per token of every slice.
    pub placeholder: String,
    /// The slices or tiles.
    pub slices: Vec<PreparedSlice>,
}

impl PreparedImage {
    /// Placeholder (image feature) tokens of all slices together.
    pub fn tokens(&self) -> usize {
        self.slices.iter().map(|s| s.tokens as usize).sum()
    }
}

/// Why a plugin call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The call failed.
    Failed,
    /// The instance panicked and refuses further work.
    Poisoned,
    /// The plugin does not implement this entry.
    Unsupported,
    /// An argument was invalid.
    InvalidArgument,
}

impl ErrorKind {
    /// The ABI status for this kind.
    pub fn status(self) -> abi::Status {
        match self {
            ErrorKind::Failed => abi::STATUS_ERROR,
            ErrorKind::Poisoned => abi::STATUS_POISONED,
            ErrorKind::Unsupported => abi::STATUS_UNSUPPORTED,
            ErrorKind::InvalidArgument => abi::STATUS_INVALID_ARGUMENT,
        }
    }

    /// The kind for an ABI status (unknown non-zero statuses are failures).
    pub fn from_status(status: abi::Status) -> ErrorKind {
        match status {
            abi::STATUS_POISONED => ErrorKind::Poisoned,
            abi::STATUS_UNSUPPORTED => ErrorKind::Unsupported,
            abi::STATUS_INVALID_ARGUMENT => ErrorKind::InvalidArgument,
            _ => ErrorKind::Failed,
        }
    }
}

/// An error from a plugin call, with its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
}

impl PluginError {
    /// A plain failure.
    pub fn failed(message: impl Into<String>) -> Self {
        PluginError {
            kind: ErrorKind::Failed,
            message: message.into(),
        }
    }

    /// An unsupported entry.
    pub fn unsupported(message: impl Into<String>) -> Self {
        PluginError {
            kind: ErrorKind::Unsupported,
            message: message.into(),
        }
    }

    /// An invalid argument.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        PluginError {
            kind: ErrorKind::InvalidArgument,
            message: message.into(),
        }
    }

    /// A poisoned instance.
    pub fn poisoned(message: impl Into<String>) -> Self {
        PluginError {
            kind: ErrorKind::Poisoned,
            message: message.into(),
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Poisoned => write!(f, "model instance poisoned: {}", self.message),
            ErrorKind::Unsupported => write!(f, "unsupported: {}", self.message),
            ErrorKind::InvalidArgument => write!(f, "invalid argument: {}", self.message),
            ErrorKind::Failed => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PluginError {}

/// One decode batch in safe form: parallel slices, one entry per row.
#[derive(Clone, Copy, Debug)]
pub struct BatchView<'a> {
    /// Token id per row.
    pub tokens: &'a [i32],
    /// Position of each row within its sequence.
    pub positions: &'a [i32],
    /// Sequence id per row.
    pub seq_ids: &'a [i32],
    /// Per row: non-zero when logits are wanted.
    pub want_logits: &'a [u8],
}

impl BatchView<'_> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of rows that want logits.
    pub fn logit_rows(&self) -> usize {
        self.want_logits.iter().filter(|&&w| w != 0).count()
    }

    /// Checks the slices agree in length.
    pub fn validate(&self) -> Result<(), PluginError> {
        let n = self.tokens.len();
        if self.positions.len() != n || self.seq_ids.len() != n || self.want_logits.len() != n {
            return Err(PluginError::invalid_argument(
                "batch slices differ in length (tokens, positions, seq_ids, want_logits)",
            ));
        }
        Ok(())
    }
}

/// Where a plugin writes logits: `rows` rows of `row_len` floats, in batch order of the rows that
/// want logits.
#[derive(Debug)]
pub struct LogitsOut<'a> {
    data: &'a mut [f32],
    row_len: usize,
}

impl<'a> LogitsOut<'a> {
    /// Wraps a buffer of whole rows.
    pub fn new(data: &'a mut [f32], row_len: usize) -> Self {
        LogitsOut { data, row_len }
    }

    /// Floats per row.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Rows the buffer can hold.
    pub fn capacity_rows(&self) -> usize {
        self.data.len().checked_div(self.row_len).unwrap_or(0)
    }

    /// The `k`-th logits row (k counts only rows that want logits).
    pub fn row_mut(&mut self, k: usize) -> &mut [f32] {
        &mut self.data[k * self.row_len..(k + 1) * self.row_len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewind_rules_allow_zero_the_current_length_and_their_own_points() {
        let snap = Rewind::Snapshots { every: 16 };
        for r in [Rewind::Anywhere, snap, Rewind::OnlyToStart] {
            assert!(r.allows(0, 40), "{r:?}");
            assert!(r.allows(40, 40), "{r:?}");
            assert!(r.allows(50, 40), "{r:?}");
            assert_eq!(r.floor(45, 40), 40, "{r:?}");
        }
        assert!(Rewind::Anywhere.allows(17, 40));
        assert!(snap.allows(32, 40) && !snap.allows(17, 40));
        assert!(!Rewind::OnlyToStart.allows(16, 40));
        assert_eq!(Rewind::Anywhere.floor(37, 40), 37);
        assert_eq!(snap.floor(37, 40), 32);
        assert_eq!(snap.floor(15, 40), 0);
        assert_eq!(Rewind::OnlyToStart.floor(37, 40), 0);
        assert_eq!(Rewind::default(), Rewind::Anywhere);
    }

    #[test]
    fn a_vision_spec_round_trips_through_json_and_an_unknown_layout_is_refused() {
        let spec = VisionSpec {
            scheme: "lfm2_vl".into(),
            layout: PixelLayout::Patches,
            patch_size: 16,
            image_token_id: 396,
            params: serde_json::json!({"min_image_tokens": 64, "max_image_tokens": 256})
                .as_object()
                .unwrap()
                .clone(),
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert!(text.contains(r#""layout":"patches""#), "{text}");
        assert_eq!(serde_json::from_str::<VisionSpec>(&text).unwrap(), spec);
        let strip: VisionSpec = serde_json::from_str(
            r#"{"scheme": "minicpmv", "layout": "patch_strip", "patch_size": 14, "image_token_id": 7}"#,
        )
        .unwrap();
        assert_eq!(strip.layout, PixelLayout::PatchStrip);
        assert!(strip.params.is_empty());
        assert!(serde_json::from_str::<VisionSpec>(
            r#"{"scheme": "x", "layout": "hwc", "patch_size": 14, "image_token_id": 7}"#
        )
        .is_err());
    }

    #[test]
    fn image_inputs_are_validated() {
        let pixels = [0.0f32; 12];
        let good = ImageInput {
            shape: &[3, 2, 2],
            pixels: &pixels,
            patch_mask: None,
            grid: Some((1, 1)),
            positions: &[4, 5],
        };
        good.validate().unwrap();
        let bad = [
            ImageInput {
                shape: &[3, 2, 3],
                ..good
            },
            ImageInput { shape: &[], ..good },
            ImageInput {
                shape: &[1, 1, 1, 3, 4],
                ..good
            },
            ImageInput {
                positions: &[],
                ..good
            },
            ImageInput {
                positions: &[3, -1],
                ..good
            },
            ImageInput {
                patch_mask: Some(&[]),
                ..good
            },
            ImageInput {
                grid: Some((0, 2)),
                ..good
            },
        ];
        for b in bad {
            assert_eq!(
                b.validate().unwrap_err().kind,
                ErrorKind::InvalidArgument,
                "{b:?}"
            );
        }
    }

    #[test]
    fn rewind_round_trips_through_the_abi_and_unknown_rules_read_as_only_to_start() {
        for r in [
            Rewind::Anywhere,
            Rewind::Snapshots { every: 8 },
            Rewind::OnlyToStart,
        ] {
            let (rule, every) = r.to_abi();
            assert_eq!(Rewind::from_abi(rule, every), r);
        }
        assert_eq!(Rewind::from_abi(abi::REWIND_SNAPSHOTS, 0), Rewind::OnlyToStart);
        assert_eq!(Rewind::from_abi(77, 4), Rewind::OnlyToStart);
    }
}
