//! Image preprocessing of the vision-language families, beside their towers: what the ABI's
//! `prepare_image` (1.5) runs in the plugin. Each family's scheme ([`minicpmv`], [`lfm2_vl`])
//! decides the sizes, the slices or tiles, the normalisation and the placeholder text its
//! Hugging Face processor produces; the pixel arithmetic (Pillow-exact resizing, crops,
//! normalisation, patch layouts) is in [`berth_kernels::image`].
//!
//! A scheme first gives a [`PreprocessedImage`] (channel-first slices and the placeholder), then
//! [`lay_out`] puts each slice in the layout the tower takes and counts its placeholder tokens.

pub mod lfm2_vl;
pub mod minicpmv;

pub use berth_kernels::image::{ChwImage, RgbImage};

use berth_kernels::image::{patch_rows, patch_strip};
use berth_plugin_api::{PixelLayout, PluginError, PreparedImage, PreparedSlice, RgbView};
use serde_json::{Map, Value};
use std::path::Path;

/// An image cut and normalised for a vision tower: its slices in the model's order and the text
/// the model's processor puts into the prompt in place of the image.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessedImage {
    /// The slices / tiles in the order the model consumes them.
    pub slices: Vec<ChwImage>,
    /// The slice grid as `(rows, cols)`; `(0, 0)` or `(1, 1)` when the image is not split.
    pub grid: (usize, usize),
    /// The placeholder text that replaces the image in the prompt.
    pub placeholder: String,
    /// How many image (feature) tokens the placeholder holds.
    pub image_tokens: usize,
}

/// A family's image preparation rule, beside its tower: what a vision-language model's
/// `prepare_image` (ABI 1.5) runs on one decoded image.
pub trait ImageScheme: Send + 'static {
    /// Prepares image number `index` of a request: the placeholder text and the tower's slices.
    fn prepare(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError>;
}

/// Copies an image handed over the ABI into an owned RGB image.
pub fn rgb_image(view: &RgbView<'_>) -> RgbImage {
    RgbImage {
        width: view.width as usize,
        height: view.height as usize,
        data: view.data.to_vec(),
    }
}

/// Puts each slice of `pre` in `layout` with `patch`-pixel patches and gives it the number of
/// placeholder tokens `tokens(patches high, patches wide)` says; the [`PixelLayout::Patches`]
/// layout pads every slice to `padded_rows` patches (at least its own). Fails when the slices'
/// tokens do not add up to the placeholder's.
pub fn lay_out(
    pre: PreprocessedImage,
    layout: PixelLayout,
    patch: usize,
    padded_rows: usize,
    tokens: impl Fn(usize, usize) -> usize,
) -> Result<PreparedImage, PluginError> {
    let mut slices = Vec::with_capacity(pre.slices.len());
    for s in &pre.slices {
        let (nh, nw) = (s.height / patch, s.width / patch);
        let (shape, pixels, patch_mask) = match layout {
            PixelLayout::Chw => (vec![3, s.height as u32, s.width as u32], s.data.clone(), None),
            PixelLayout::PatchStrip => (
                vec![3, patch as u32, (nh * nw * patch) as u32],
                patch_strip(s, patch),
                None,
            ),
            PixelLayout::Patches => {
                let t = patch_rows(s, patch, padded_rows);
                let rows = t.patches.len() / (3 * patch * patch);
                let mask: Vec<u8> = (0..rows).map(|r| u8::from(r < t.valid_patches)).collect();
                (
                    vec![rows as u32, (3 * patch * patch) as u32],
                    t.patches,
                    Some(mask),
                )
            }
        };
        slices.push(PreparedSlice {
            shape,
            pixels,
            patch_mask,
            grid: Some((nh as u32, nw as u32)),
            tokens: tokens(nh, nw) as u32,
        });
    }
    let prepared = PreparedImage {
        placeholder: pre.placeholder,
        slices,
    };
    if prepared.tokens() != pre.image_tokens {
        return Err(PluginError::failed(format!(
            "the slices need {} placeholder tokens but the placeholder holds {}",
            prepared.tokens(),
            pre.image_tokens
        )));
    }
    Ok(prepared)
}

/// A scheme setting from the vision spec's `params`, or `default` when it is absent or null.
pub fn param<T: serde::de::DeserializeOwned>(
    params: &Map<String, Value>,
    key: &str,
    default: T,
) -> Result<T, String> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("vision param '{key}': {e}")),
    }
}

/// The text of token `id` in a pack's `tokenizer.json` (an added token's content, else the
/// vocabulary entry): the image token a placeholder repeats. `None` without a tokenizer file or
/// such a token.
pub fn token_text(pack_dir: &Path, id: i32) -> Option<String> {
    let text = std::fs::read_to_string(pack_dir.join("tokenizer.json")).ok()?;
    let t: Value = serde_json::from_str(&text).ok()?;
    let id = i64::from(id);
    let added = t.get("added_tokens").and_then(Value::as_array).and_then(|a| {
        a.iter()
            .find(|x| x.get("id").and_then(Value::as_i64) == Some(id))
            .and_then(|x| x.get("content")?.as_str())
    });
    let vocab = || {
        t.get("model")?
            .get("vocab")?
            .as_object()?
            .iter()
            .find(|(_, v)| v.as_i64() == Some(id))
            .map(|(k, _)| k.as_str())
    };
    added.or_else(vocab).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lay_out_counts_tokens_and_pads_patches() {
        let pre = PreprocessedImage {
            slices: vec![ChwImage {
                height: 4,
                width: 2,
                data: vec![0.5; 24],
            }],
            grid: (1, 1),
            placeholder: "<i><i>".into(),
            image_tokens: 2,
        };
        let p = lay_out(pre.clone(), PixelLayout::Patches, 2, 3, |h, w| h * w).unwrap();
        let s = &p.slices[0];
        assert_eq!(
            (s.shape.clone(), s.grid, s.tokens),
            (vec![3, 12], Some((2, 1)), 2)
        );
        assert_eq!(s.patch_mask.as_deref(), Some(&[1u8, 1, 0][..]));
        let strip = lay_out(pre.clone(), PixelLayout::PatchStrip, 2, 0, |h, w| h * w).unwrap();
        assert_eq!(strip.slices[0].shape, vec![3, 2, 4]);
        let chw = lay_out(pre.clone(), PixelLayout::Chw, 2, 0, |h, w| h * w).unwrap();
        assert_eq!(chw.slices[0].shape, vec![3, 4, 2]);
        assert!(lay_out(pre, PixelLayout::Chw, 2, 0, |_, _| 3).is_err());
    }

    #[test]
    fn token_text_reads_added_tokens_and_the_vocabulary() {
        let dir = tempfile::tempdir().unwrap();
        let tj = serde_json::json!({"added_tokens": [{"id": 7, "content": "<image>"}],
            "model": {"vocab": {"a": 0, "<unk>": 3}}});
        std::fs::write(dir.path().join("tokenizer.json"), tj.to_string()).unwrap();
        assert_eq!(token_text(dir.path(), 7).as_deref(), Some("<image>"));
        assert_eq!(token_text(dir.path(), 3).as_deref(), Some("<unk>"));
        assert_eq!(token_text(dir.path(), 9), None);
    }
}
