//! The ABI 1.5 image preparation within one process: a family exported through the SDK's entry
//! table, driven by the host client (`ModelInstance::prepare_image`), whose answers come back
//! through the host's sink callbacks; the client checks and copies what the plugin hands it.

use berth_plugin_api::abi;
use berth_plugin_api::sdk::{self, Family, Model};
use berth_plugin_api::{
    BatchView, ErrorKind, LoadConfig, LogitsOut, ModelDescription, ModelInstance, PixelLayout, Plugin,
    PluginError, PluginManifest, PreparedImage, PreparedSlice, RgbView, VisionSpec,
};
use std::sync::OnceLock;

/// A model that prepares an image as one `[3, h, w]` slice of its bytes, `index + 1`
/// placeholder tokens `<i>`; load option `"mode"` makes it misbehave: `"bad_slice"` hands back a
/// slice whose shape does not hold its pixels, `"panic"` panics, `"no_vision"` states no spec.
struct Toy {
    mode: String,
}

impl Model for Toy {
    fn describe(&self) -> ModelDescription {
        ModelDescription {
            vocab_size: 8,
            context_length: 32,
            max_sequences: 1,
            ..Default::default()
        }
    }

    fn decode(&mut self, _batch: &BatchView<'_>, _logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        Err(PluginError::unsupported("decode"))
    }

    fn force_token(&mut self, _seq: i32, _token: i32) -> Result<(), PluginError> {
        Ok(())
    }

    fn seq_truncate(&mut self, _seq: i32, _len: u32) -> Result<(), PluginError> {
        Ok(())
    }

    fn vision(&self) -> Option<VisionSpec> {
        (self.mode != "no_vision").then(|| VisionSpec {
            scheme: String::new(),
            layout: PixelLayout::Chw,
            patch_size: 1,
            image_token_id: 5,
            params: Default::default(),
        })
    }

    fn encode_images(
        &mut self,
        _seq: i32,
        _images: &[berth_plugin_api::ImageInput<'_>],
    ) -> Result<(), PluginError> {
        Ok(())
    }

    fn prepare_image(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        if image.width > 4 {
            return Err(PluginError::invalid_argument("wider than 4 pixels"));
        }
        if self.mode == "panic" {
            panic!("prepare_image panics");
        }
        let (w, h) = (image.width, image.height);
        let pixels: Vec<f32> = image.data.iter().map(|&b| f32::from(b)).collect();
        let shape = if self.mode == "bad_slice" {
            vec![3, h, w + 1]
        } else {
            vec![3, h, w]
        };
        Ok(PreparedImage {
            placeholder: "<i>".repeat(index as usize + 1),
            slices: vec![PreparedSlice {
                shape,
                pixels,
                patch_mask: Some(vec![1, 0]),
                grid: Some((h, w)),
                tokens: index + 1,
            }],
        })
    }
}

/// The family exporting [`Toy`].
struct ToyFamily;

impl Family for ToyFamily {
    type Model = Toy;

    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "prepare-toy".into(),
            version: "0.1.0".into(),
            families: vec!["prepare-toy".into()],
            ..Default::default()
        }
    }

    fn probe(_model_config: &serde_json::Value) -> u32 {
        1
    }

    fn create(config: &LoadConfig) -> Result<Toy, PluginError> {
        let mode = config.options.get("mode").and_then(serde_json::Value::as_str);
        Ok(Toy {
            mode: mode.unwrap_or("").to_string(),
        })
    }
}

/// A model created through the host client, with load option `mode`.
fn instance(mode: &str) -> ModelInstance {
    static TABLE: OnceLock<sdk::StaticEntry> = OnceLock::new();
    let table = TABLE
        .get_or_init(|| sdk::StaticEntry(sdk::build_entry_table::<ToyFamily>(true)))
        .0;
    // SAFETY: the table is leaked static data of this process.
    let plugin = unsafe { Plugin::from_entry(table) }.expect("the SDK's table is accepted");
    let config = LoadConfig {
        family: "prepare-toy".into(),
        options: serde_json::json!({ "mode": mode }).as_object().cloned().unwrap(),
        ..Default::default()
    };
    plugin
        .create(&serde_json::to_string(&config).unwrap())
        .expect("the toy loads")
}

const RGB: RgbView<'static> = RgbView {
    width: 2,
    height: 1,
    data: &[1, 2, 3, 4, 5, 6],
};

#[test]
fn a_prepared_image_comes_back_through_the_sink() {
    let mut m = instance("");
    assert!(m.supports_images());
    assert_ne!(m.description().capabilities & abi::CAP_VISION, 0);
    let p = m.prepare_image(&RGB, 2).unwrap();
    assert_eq!(p.placeholder, "<i><i><i>");
    assert_eq!(p.tokens(), 3);
    let s = &p.slices[0];
    assert_eq!((s.shape.clone(), s.grid), (vec![3, 1, 2], Some((1, 2))));
    assert_eq!(s.pixels, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(s.patch_mask.as_deref(), Some(&[1u8, 0][..]));
}

#[test]
fn an_image_the_model_cannot_take_is_an_invalid_argument() {
    let mut m = instance("");
    let wide = RgbView {
        width: 5,
        height: 1,
        data: &[0; 15],
    };
    let e = m.prepare_image(&wide, 0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("wider than 4"), "{e}");
    // The client refuses bytes that do not match the size before calling the plugin.
    let short = RgbView { data: &[0; 5], ..RGB };
    assert_eq!(
        m.prepare_image(&short, 0).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
    // The instance keeps serving.
    m.prepare_image(&RGB, 0).unwrap();
}

#[test]
fn a_malformed_slice_is_refused_and_a_panic_poisons() {
    let mut m = instance("bad_slice");
    let e = m.prepare_image(&RGB, 0).unwrap_err();
    assert!(e.message.contains("slice 0"), "{e}");
    let mut m = instance("panic");
    let e = m.prepare_image(&RGB, 0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Poisoned, "{e}");
    assert!(m.poisoned().is_some());
}

#[test]
fn a_model_without_a_vision_spec_prepares_nothing() {
    let mut m = instance("no_vision");
    assert!(!m.supports_images());
    assert_eq!(m.prepare_image(&RGB, 0).unwrap_err().kind, ErrorKind::Unsupported);
}
