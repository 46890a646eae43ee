//! MiniCPM-V preprocessing: an overview image resized to about `scale_resolution²`
//! pixels plus, for large images, a grid of slices of the same size; bicubic resize,
//! `(x/255 - mean)/std`; and the `<image>…</image><slice>…</slice>` placeholder layout of the
//! model's processor.
//!
//! Two token layouts share the slicing: MiniCPM-V 4.6 merges patches, so a slice's token count
//! follows its size and sizes round to whole merged blocks; MiniCPM-V 4.0 / 4.5 resample every
//! slice (and the overview) to a fixed `query_num` tokens, and sizes round to whole patches.
//!
//! The slices go to the tower as NaViT strips ([`PixelLayout::PatchStrip`]).

use super::{lay_out, param, rgb_image, ImageScheme, PreprocessedImage, RgbImage};
use berth_kernels::image::resample::{resize, Arithmetic, Filter};
use berth_kernels::image::{crop, normalize};
use berth_plugin_api::{PixelLayout, PluginError, PreparedImage, RgbView};
use serde_json::{Map, Value};

/// How many image tokens one merged patch area yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownsampleMode {
    /// Two 2×2 merges: one token per 4×4 patches.
    X16,
    /// One 2×2 merge: one token per 2×2 patches.
    X4,
}

impl DownsampleMode {
    /// Side of the patch block that becomes one token.
    fn merge_factor(self) -> usize {
        match self {
            Self::X16 => 4,
            Self::X4 => 2,
        }
    }
}

/// The image processor settings (`preprocessor_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct MiniCpmVParams {
    /// Most slices an image is cut into.
    pub max_slice_nums: usize,
    /// Side of the square whose area a slice (and the overview) is resized to.
    pub scale_resolution: usize,
    /// The vision encoder's patch size.
    pub patch_size: usize,
    /// Whether large images are sliced at all.
    pub slice_mode: bool,
    /// Token downsampling of the resampler / merger.
    pub downsample_mode: DownsampleMode,
    /// Whether `<image_id>N</image_id>` precedes each image.
    pub use_image_id: bool,
    /// Per-channel mean.
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation.
    pub image_std: [f32; 3],
    /// Whose resize arithmetic to match (the PIL or the torchvision image processor).
    pub arithmetic: Arithmetic,
    /// MiniCPM-V 4.0 / 4.5: the fixed image tokens per slice and overview (the resampler's
    /// `query_num`); `None` for 4.6, whose count follows `downsample_mode`.
    pub query_num: Option<usize>,
}

impl MiniCpmVParams {
    /// Image tokens a slice (or the overview) of `nh × nw` patches takes.
    pub fn slice_tokens(&self, nh: usize, nw: usize) -> usize {
        match self.query_num {
            Some(q) => q,
            None => nh * nw / self.downsample_mode.merge_factor().pow(2),
        }
    }

    /// Side in pixels that slice and overview sizes are rounded to: a patch when the token
    /// count is fixed, else a whole merged block of patches.
    fn size_unit(&self) -> usize {
        match self.query_num {
            Some(_) => self.patch_size,
            None => self.patch_size * self.downsample_mode.merge_factor(),
        }
    }
}

impl Default for MiniCpmVParams {
    fn default() -> Self {
        Self {
            max_slice_nums: 9,
            scale_resolution: 448,
            patch_size: 14,
            slice_mode: true,
            downsample_mode: DownsampleMode::X16,
            use_image_id: true,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            arithmetic: Arithmetic::Pillow,
            query_num: None,
        }
    }
}

/// The tokenizer's marker strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiniCpmVTokens {
    /// The token repeated once per image feature.
    pub image: String,
    /// Opens the overview image.
    pub image_start: String,
    /// Closes the overview image.
    pub image_end: String,
    /// Opens a slice.
    pub slice_start: String,
    /// Closes a slice.
    pub slice_end: String,
    /// Opens the image id.
    pub image_id_start: String,
    /// Closes the image id.
    pub image_id_end: String,
}

impl Default for MiniCpmVTokens {
    fn default() -> Self {
        Self {
            image: "<unk>".into(),
            image_start: "<image>".into(),
            image_end: "</image>".into(),
            slice_start: "<slice>".into(),
            slice_end: "</slice>".into(),
            image_id_start: "<image_id>".into(),
            image_id_end: "</image_id>".into(),
        }
    }
}

/// Python's `round` (half to even).
fn py_round(x: f64) -> i64 {
    x.round_ties_even() as i64
}

/// A multiple of `divisor` near `length`, at least `divisor`.
fn ensure_divide(length: f64, divisor: usize) -> usize {
    (py_round(length / divisor as f64) * divisor as i64).max(divisor as i64) as usize
}

/// The `(height, width)` of an overview or slice: about `scale_resolution²` pixels with the
/// same aspect ratio when larger (or always, with `allow_upscale`), rounded to whole tokens.
fn best_resize(height: f64, width: f64, p: &MiniCpmVParams, allow_upscale: bool) -> (usize, usize) {
    let (mut h, mut w) = (height, width);
    let s = p.scale_resolution as f64;
    if h * w > s * s || allow_upscale {
        let aspect = w / h;
        h = (s / aspect.sqrt()).trunc();
        w = (h * aspect).trunc();
    }
    let unit = p.size_unit();
    (ensure_divide(h, unit), ensure_divide(w, unit))
}

/// The size the whole image is resized to before it is cut into `grid` slices.
fn refine_size(height: usize, width: usize, grid: (usize, usize), p: &MiniCpmVParams) -> (usize, usize) {
    let (rows, cols) = grid;
    let rw = ensure_divide(width as f64, cols);
    let rh = ensure_divide(height as f64, rows);
    let (bh, bw) = best_resize(rh as f64 / rows as f64, rw as f64 / cols as f64, p, true);
    (bh * rows, bw * cols)
}

/// The `(rows, cols)` slice grid for an image, or `None` when it is not sliced.
pub fn slice_grid(height: usize, width: usize, p: &MiniCpmVParams) -> Option<(usize, usize)> {
    if !p.slice_mode {
        return None;
    }
    let log_ratio = (width as f64 / height as f64).ln();
    let ratio = (width * height) as f64 / (p.scale_resolution * p.scale_resolution) as f64;
    let multiple = (ratio.ceil() as usize).min(p.max_slice_nums);
    if multiple <= 1 {
        return None;
    }
    let mut best = (1, 1);
    let mut min_error = f64::INFINITY;
    for n in [multiple - 1, multiple, multiple + 1] {
        if n == 1 || n > p.max_slice_nums {
            continue;
        }
        for rows in (1..=n).filter(|r| n % r == 0) {
            let cols = n / rows;
            let error = (log_ratio - (cols as f64 / rows as f64).ln()).abs();
            if error < min_error || (error == min_error && rows > best.0) {
                best = (rows, cols);
                min_error = error;
            }
        }
    }
    Some(best)
}

/// Preprocesses one decoded image; `image_index` is its position among the prompt's images
/// (the `<image_id>` number).
pub fn preprocess(
    img: &RgbImage,
    p: &MiniCpmVParams,
    tokens: &MiniCpmVTokens,
    image_index: usize,
) -> PreprocessedImage {
    let (h, w) = (img.height, img.width);
    let grid = slice_grid(h, w, p);
    let (sh, sw) = best_resize(h as f64, w as f64, p, grid.is_none());
    let source = resize(img, sw, sh, Filter::Bicubic, p.arithmetic);
    let mut slices = vec![normalize(&source, p.image_mean, p.image_std)];
    if let Some((rows, cols)) = grid {
        let (rh, rw) = refine_size(h, w, (rows, cols), p);
        let refined = resize(img, rw, rh, Filter::Bicubic, p.arithmetic);
        let (ph, pw) = (rh / rows, rw / cols);
        for r in 0..rows {
            for c in 0..cols {
                let tile = crop(&refined, c * pw, r * ph, pw, ph);
                slices.push(normalize(&tile, p.image_mean, p.image_std));
            }
        }
    }
    let counts: Vec<usize> = slices
        .iter()
        .map(|s| p.slice_tokens(s.height / p.patch_size, s.width / p.patch_size))
        .collect();
    let mut text = String::new();
    if p.use_image_id {
        text.push_str(&format!(
            "{}{image_index}{}",
            tokens.image_id_start, tokens.image_id_end
        ));
    }
    text.push_str(&tokens.image_start);
    text.push_str(&tokens.image.repeat(counts[0]));
    text.push_str(&tokens.image_end);
    if let Some((rows, cols)) = grid {
        for r in 0..rows {
            if r > 0 {
                text.push('\n');
            }
            for c in 0..cols {
                text.push_str(&tokens.slice_start);
                text.push_str(&tokens.image.repeat(counts[1 + r * cols + c]));
                text.push_str(&tokens.slice_end);
            }
        }
    }
    PreprocessedImage {
        grid: grid.unwrap_or((0, 0)),
        image_tokens: counts.iter().sum(),
        slices,
        placeholder: text,
    }
}

/// A model's MiniCPM-V preprocessing: the processor settings and the marker strings.
#[derive(Debug, Clone, PartialEq)]
pub struct MiniCpmVScheme {
    /// The image processor settings.
    pub params: MiniCpmVParams,
    /// The tokenizer's marker strings.
    pub tokens: MiniCpmVTokens,
}

impl MiniCpmVScheme {
    /// The scheme from a vision spec's `params` (the names of `preprocessor_config.json`;
    /// MiniCPM-V's defaults for what they leave out), the tower's patch size and the text of
    /// the image token.
    pub fn from_params(
        params: &Map<String, Value>,
        patch_size: usize,
        image_token: String,
    ) -> Result<Self, String> {
        let p = params;
        let d = MiniCpmVParams::default();
        let mode = match param(p, "downsample_mode", "16x".to_string())?.as_str() {
            "16x" => DownsampleMode::X16,
            "4x" => DownsampleMode::X4,
            m => return Err(format!("vision param 'downsample_mode': unknown '{m}'")),
        };
        let arithmetic = match param(p, "arithmetic", "pillow".to_string())?.as_str() {
            "pillow" => Arithmetic::Pillow,
            "torch" => Arithmetic::TorchU8,
            a => return Err(format!("vision param 'arithmetic': unknown '{a}'")),
        };
        let params = MiniCpmVParams {
            max_slice_nums: param(p, "max_slice_nums", d.max_slice_nums)?,
            scale_resolution: param(p, "scale_resolution", d.scale_resolution)?,
            patch_size,
            slice_mode: param(p, "slice_mode", d.slice_mode)?,
            downsample_mode: mode,
            use_image_id: param(p, "use_image_id", d.use_image_id)?,
            image_mean: param(p, "image_mean", d.image_mean)?,
            image_std: param(p, "image_std", d.image_std)?,
            arithmetic,
            query_num: param(p, "query_num", d.query_num)?,
        };
        if params.query_num == Some(0) {
            return Err("vision param 'query_num' must be positive".into());
        }
        if params.patch_size == 0 || params.scale_resolution == 0 {
            return Err("vision params out of range".into());
        }
        Ok(MiniCpmVScheme {
            params,
            tokens: MiniCpmVTokens {
                image: image_token,
                ..Default::default()
            },
        })
    }
}

/// MiniCPM-V numbers each image of a request in its placeholder (`<image_id>`).
impl ImageScheme for MiniCpmVScheme {
    fn prepare(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        prepare(self, &rgb_image(image), index)
    }
}

/// Prepares one image for a MiniCPM-V tower: its slices as NaViT strips, each with its
/// placeholder tokens, and the placeholder text; `index` is the `<image_id>` number.
pub fn prepare(scheme: &MiniCpmVScheme, img: &RgbImage, index: u32) -> Result<PreparedImage, PluginError> {
    let p = &scheme.params;
    let pre = preprocess(img, p, &scheme.tokens, index as usize);
    lay_out(pre, PixelLayout::PatchStrip, p.patch_size, 0, |nh, nw| {
        p.slice_tokens(nh, nw)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_images_are_not_sliced() {
        let p = MiniCpmVParams::default();
        assert_eq!(slice_grid(448, 448, &p), None);
        assert_eq!(slice_grid(5, 3, &p), None);
    }

    #[test]
    fn grid_follows_the_aspect_ratio() {
        let p = MiniCpmVParams::default();
        // 1344 x 448 is three squares side by side.
        assert_eq!(slice_grid(448, 1344, &p), Some((1, 3)));
        assert_eq!(slice_grid(1344, 448, &p), Some((3, 1)));
    }

    #[test]
    fn ensure_divide_rounds_half_to_even() {
        assert_eq!(ensure_divide(2.5 * 56.0, 56), 112);
        assert_eq!(ensure_divide(3.5 * 56.0, 56), 224);
        assert_eq!(ensure_divide(3.0, 56), 56);
    }

    /// MiniCPM-V 4.0 / 4.5 settings: 64 tokens per slice.
    fn v4_params() -> MiniCpmVParams {
        MiniCpmVParams {
            query_num: Some(64),
            ..MiniCpmVParams::default()
        }
    }

    fn gray(width: usize, height: usize) -> RgbImage {
        RgbImage {
            width,
            height,
            data: vec![128; width * height * 3],
        }
    }

    #[test]
    fn v4_unsliced_image_is_one_overview_of_query_num_tokens() {
        let p = v4_params();
        let out = preprocess(&gray(300, 200), &p, &MiniCpmVTokens::default(), 2);
        let unk = "<unk>".repeat(64);
        assert_eq!(
            out.placeholder,
            format!("<image_id>2</image_id><image>{unk}</image>")
        );
        assert_eq!(out.image_tokens, 64);
        assert_eq!(out.slices.len(), 1);
        // Upscaled to about 448² and rounded to whole 14-pixel patches (4.6 rounds to 56).
        let s = &out.slices[0];
        assert_eq!((s.width % 14, s.height % 14), (0, 0));
        assert_eq!((s.width, s.height), (546, 364));
    }

    #[test]
    fn v4_sliced_image_joins_rows_with_newlines() {
        let p = v4_params();
        // 896 x 896: four times 448², a 2 x 2 grid.
        let out = preprocess(&gray(896, 896), &p, &MiniCpmVTokens::default(), 0);
        assert_eq!(out.grid, (2, 2));
        let unk = "<unk>".repeat(64);
        let slice = format!("<slice>{unk}</slice>");
        let want = format!("<image_id>0</image_id><image>{unk}</image>{slice}{slice}\n{slice}{slice}");
        assert_eq!(out.placeholder, want);
        // (ncols * nrows + 1) * query_num
        assert_eq!(out.image_tokens, (2 * 2 + 1) * 64);
        assert_eq!(out.placeholder.matches("<unk>").count(), out.image_tokens);
        assert_eq!(out.slices.len(), 5);
        for s in &out.slices {
            assert_eq!((s.width % 14, s.height % 14), (0, 0));
        }
    }

    #[test]
    fn v4_token_count_is_fixed_per_slice_without_image_id() {
        let p = MiniCpmVParams {
            use_image_id: false,
            ..v4_params()
        };
        // 1344 x 448: one row of three slices.
        let out = preprocess(&gray(1344, 448), &p, &MiniCpmVTokens::default(), 0);
        assert_eq!(out.grid, (1, 3));
        assert_eq!(out.image_tokens, (3 + 1) * 64);
        assert!(out.placeholder.starts_with("<image><unk>"));
        assert!(!out.placeholder.contains('\n'));
        assert_eq!(out.placeholder.matches("<slice>").count(), 3);
        assert_eq!(p.slice_tokens(7, 100), 64);
        // 4.6 keeps its merge-derived count.
        assert_eq!(MiniCpmVParams::default().slice_tokens(8, 12), 6);
    }

    #[test]
    fn the_scheme_reads_its_params_and_prepares_strips() {
        let params = serde_json::json!({"query_num": 64, "use_image_id": false});
        let scheme = MiniCpmVScheme::from_params(params.as_object().unwrap(), 14, "<unk>".into()).unwrap();
        assert_eq!(scheme.params.query_num, Some(64));
        let out = prepare(&scheme, &gray(300, 200), 3).unwrap();
        assert_eq!(out.slices.len(), 1);
        let s = &out.slices[0];
        // 546 x 364 -> 39 x 26 patches of 14, side by side in one strip.
        assert_eq!(s.shape, vec![3, 14, 39 * 26 * 14]);
        assert_eq!((s.grid, s.tokens), (Some((26, 39)), 64));
        assert!(out.placeholder.starts_with("<image><unk>"));
        let bad = serde_json::json!({"downsample_mode": "9x"});
        assert!(MiniCpmVScheme::from_params(bad.as_object().unwrap(), 14, "<unk>".into()).is_err());
    }
}
