//! Test plugins that speak the Berth C ABI at versions other than the host's, written by hand
//! (no `export_plugin!`, no SDK traits) the way a C author would. Each build enables exactly one
//! cargo feature and yields one library:
//!
//! - `newer`: claims ABI 1.6, from the future; its entry table, vtable and model info each carry
//!   one trailing field the host does not know, after the 1.5 ones, and their headers give the
//!   larger sizes. Into host-allocated structs it writes no more than the host's `struct_size`.
//!   Its model info fills the 1.2 fields (it rewinds to snapshots every [`SNAPSHOT_EVERY`]
//!   positions), the 1.3 ones (it takes images, [`VISION_JSON`] and `CAP_VISION`, through an
//!   `encode_images` that accepts them and the 1.5 `prepare_image`) and the 1.4 ones: it embeds text ([`EMBEDDING_JSON`],
//!   with a key no host knows, and `CAP_EMBEDDING`) through an `embed` that writes
//!   [`toy_embedding`] of each whole sequence.
//! - `v1_3`: claims ABI 1.3; it states images like `newer`, but has no 1.5 `prepare_image`, so
//!   the host loads it as a text-only model; its vtable ends before `embed` and its model info
//!   before `embedding_json`, yet it sets `CAP_EMBEDDING`: the host must report no embeddings. It rewinds to snapshots like `newer`.
//! - `v1_2`: claims ABI 1.2; its vtable ends before `encode_images` and its model info before
//!   `vision_json`, yet it sets `CAP_VISION`: the host must report no image capability. It
//!   rewinds to snapshots like `newer`.
//! - `v1_1`: claims ABI 1.1; its model info ends before the 1.2 `rewind` fields, so the host
//!   must read its rewind rule as "anywhere".
//! - `older`: claims ABI 1.0; its vtable ends before `seq_fork`, so the host must treat fork as
//!   unsupported (and its model info, like 1.1's, has no rewind fields).
//!
//! Every variant before 1.4 (`v1_3`, `v1_2`, `v1_1`, `older`) has no embeddings.
//! - `v2`: claims ABI 2.0 and exports `berth_plugin_entry_v2` instead of `berth_plugin_entry_v1`.
//! - `nosymbol`: claims ABI 1.1 in its manifest but exports no entry symbol.
//!
//! Every variant exports `berth_plugin_manifest`. Those with an entry serve family `abi-test`
//! (probe score 10) with a trivial model: vocabulary 16, context 64, stop token 0, and a logits
//! row holding 1.0 at token `(position + 1) % 16` for each row that wants logits.
//! `tests/plugins/build-abi-variants OUTDIR` builds all seven.

#[cfg(not(any(
    feature = "newer",
    feature = "v1_3",
    feature = "v1_2",
    feature = "v1_1",
    feature = "older",
    feature = "v2",
    feature = "nosymbol"
)))]
compile_error!("enable exactly one of the features: newer, v1_3, v1_2, v1_1, older, v2, nosymbol");
const _: () = assert!(
    cfg!(feature = "newer") as u8
        + cfg!(feature = "v1_3") as u8
        + cfg!(feature = "v1_2") as u8
        + cfg!(feature = "v1_1") as u8
        + cfg!(feature = "older") as u8
        + cfg!(feature = "v2") as u8
        + cfg!(feature = "nosymbol") as u8
        == 1,
    "enable exactly one of the features: newer, v1_3, v1_2, v1_1, older, v2, nosymbol"
);

#[cfg(not(feature = "nosymbol"))]
mod entry;
#[cfg(not(feature = "nosymbol"))]
pub use entry::*;

/// The manifest JSON of a variant, NUL-terminated, as a `&'static str` literal.
macro_rules! manifest_json {
    ($variant:literal, $major:literal, $minor:literal) => {
        concat!(
            "{\"name\": \"abi-",
            $variant,
            "\", \"version\": \"0.1.0\", \"abi_major\": ",
            $major,
            ", \"abi_minor\": ",
            $minor,
            ", \"panic\": \"unwind\", \"families\": [\"abi-test\"], ",
            "\"architectures\": [\"abi-test\"], \"weight_formats\": [\"none\"]}\0"
        )
    };
}

/// The variant's manifest, NUL-terminated.
#[cfg(feature = "newer")]
pub const MANIFEST: &str = manifest_json!("newer", 1, 6);
/// The variant's manifest, NUL-terminated.
#[cfg(feature = "v1_3")]
pub const MANIFEST: &str = manifest_json!("v1_3", 1, 3);
/// The variant's manifest, NUL-terminated.
#[cfg(feature = "v1_2")]
pub const MANIFEST: &str = manifest_json!("v1_2", 1, 2);
/// The variant's manifest, NUL-terminated.
#[cfg(feature = "v1_1")]
pub const MANIFEST: &str = manifest_json!("v1_1", 1, 1);
/// The variant's manifest, NUL-terminated.
#[cfg(feature = "older")]
pub const MANIFEST: &str = manifest_json!("older", 1, 0);
/// The variant's manifest, NUL-terminated.
#[cfg(feature = "v2")]
pub const MANIFEST: &str = manifest_json!("v2", 2, 0);
/// The variant's manifest, NUL-terminated.
#[cfg(feature = "nosymbol")]
pub const MANIFEST: &str = manifest_json!("nosymbol", 1, 1);

/// The ABI major version this variant claims.
#[cfg(not(feature = "v2"))]
pub const ABI_MAJOR: u16 = 1;
/// The ABI major version this variant claims.
#[cfg(feature = "v2")]
pub const ABI_MAJOR: u16 = 2;

/// The ABI minor version this variant claims.
#[cfg(feature = "newer")]
pub const ABI_MINOR: u16 = 6;
/// The ABI minor version this variant claims.
#[cfg(feature = "v1_3")]
pub const ABI_MINOR: u16 = 3;
/// The ABI minor version this variant claims.
#[cfg(feature = "v1_2")]
pub const ABI_MINOR: u16 = 2;
/// The ABI minor version this variant claims.
#[cfg(feature = "v1_1")]
pub const ABI_MINOR: u16 = 1;
/// The ABI minor version this variant claims.
#[cfg(feature = "older")]
pub const ABI_MINOR: u16 = 0;
/// The ABI minor version this variant claims.
#[cfg(feature = "v2")]
pub const ABI_MINOR: u16 = 0;
/// The ABI minor version this variant claims.
#[cfg(feature = "nosymbol")]
pub const ABI_MINOR: u16 = 1;

/// Version-independent manifest symbol: static NUL-terminated JSON.
#[no_mangle]
pub extern "C" fn berth_plugin_manifest() -> *const std::ffi::c_char {
    MANIFEST.as_ptr().cast()
}

#[cfg(test)]
mod manifest_tests {
    use super::*;

    #[test]
    fn the_manifest_is_json_naming_the_variant_and_its_abi() {
        let json = MANIFEST.strip_suffix('\0').expect("NUL-terminated");
        assert!(!json.contains('\0'));
        let m: berth_plugin_api::PluginManifest = serde_json::from_str(json).unwrap();
        assert!(m.name.starts_with("abi-"));
        assert_eq!((m.abi_major, m.abi_minor), (ABI_MAJOR, ABI_MINOR));
        assert_eq!(m.panic, "unwind");
        assert_eq!(m.families, vec!["abi-test"]);
        assert_eq!(m.weight_formats, vec!["none"]);
    }
}
