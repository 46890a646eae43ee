//! Keeps `include/berth_plugin.h` (the C ABI for plugin authors in other languages) in sync with
//! `src/abi.rs`, and checks that a C compiler accepts it with the layout the Rust side freezes.

use berth_plugin_api::abi;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

const BLESS_HINT: &str = "run BERTH_BLESS=1 cargo test -p berth-plugin-api --test c_header";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn header_path() -> PathBuf {
    crate_dir().join("include").join("berth_plugin.h")
}

/// The header as cbindgen generates it from `src/abi.rs` now.
fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src").join("abi.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut bytes = Vec::new();
    bindings.write(&mut bytes);
    String::from_utf8(bytes).expect("header is UTF-8")
}

#[test]
fn committed_header_matches_abi_rs() {
    let fresh = generate();
    let path = header_path();
    if std::env::var_os("BERTH_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != fresh {
        let first_diff = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(fresh.lines().count()));
        panic!(
            "{} is out of date with src/abi.rs (first difference at line {}); {BLESS_HINT}",
            path.display(),
            first_diff + 1
        );
    }
}

#[test]
fn header_declares_the_constants_structs_and_function_types() {
    let h = generate();
    for needle in [
        "#define BERTH_ABI_MAJOR 1",
        "#define BERTH_ABI_MINOR 5",
        "#define BERTH_REWIND_SNAPSHOTS 1",
        "#define BERTH_FLAG_PANIC_UNWIND 1",
        "#define BERTH_STATUS_UNSUPPORTED 3",
        "#define BERTH_CAP_VISION (1 << 2)",
        "#define BERTH_CAP_EMBEDDING (1 << 3)",
        "typedef struct BerthHeader {",
        "typedef struct BerthEntryTable {",
        "typedef struct BerthModelVtable {",
        "typedef struct BerthModelInfo {",
        "typedef struct BerthBatch {",
        "typedef struct BerthLogits {",
        "typedef struct BerthImageInput {",
        "typedef int32_t BerthStatus;",
        "typedef const struct BerthEntryTable *(*BerthEntryFn)(void);",
        "typedef const char *(*BerthManifestFn)(void);",
        "BERTH_MODEL_VTABLE_SIZE_V1_0",
        "BERTH_MODEL_INFO_SIZE_V1_1",
        "uint32_t rewind_every;",
        "BERTH_MODEL_VTABLE_SIZE_V1_2",
        "BERTH_MODEL_INFO_SIZE_V1_2",
        "struct BerthStrRef vision_json;",
        "uint32_t shape[4];",
        "BerthStatus (*encode_images)(void *handle, int32_t seq, const struct BerthImageInput *const *images, uint32_t n_images, struct BerthErrorBuf *err);",
        "BERTH_MODEL_VTABLE_SIZE_V1_3",
        "BERTH_MODEL_INFO_SIZE_V1_3",
        "struct BerthStrRef embedding_json;",
        "BerthStatus (*embed)(void *handle, const struct BerthBatch *batch, struct BerthLogits *out, struct BerthErrorBuf *err);",
        "BERTH_MODEL_VTABLE_SIZE_V1_4",
        "typedef struct BerthRgbImage {",
        "typedef struct BerthPreparedSlice {",
        "typedef struct BerthImageSink {",
        "BerthStatus (*prepare_image)(void *handle, const struct BerthRgbImage *image, uint32_t index, const struct BerthImageSink *sink, struct BerthErrorBuf *err);",
        "BerthStatus (*add_slice)(void *context, const struct BerthPreparedSlice *slice);",
    ] {
        assert!(
            h.contains(needle),
            "header lacks `{needle}`; {BLESS_HINT} after fixing cbindgen.toml"
        );
    }
    // Written by hand in cbindgen.toml: they must agree with src/abi.rs.
    for (name, value) in [
        ("BERTH_ENTRY_SYMBOL", abi::ENTRY_SYMBOL),
        ("BERTH_MANIFEST_SYMBOL", abi::MANIFEST_SYMBOL),
    ] {
        let line = format!("#define {name} \"{value}\"");
        assert!(
            h.contains(&line),
            "header lacks `{line}`: fix after_includes in cbindgen.toml"
        );
    }
}

/// Whether a C compiler named `cc` can be run.
fn have_cc() -> bool {
    Command::new("cc").arg("--version").output().is_ok()
}

#[test]
fn a_c_compiler_accepts_the_header_with_the_frozen_layout() {
    if !have_cc() {
        berth_formats::test_skip::skip_unless_ci("no `cc` on PATH");
        return;
    }
    let dir = std::env::temp_dir().join(format!("berth-c-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("plugin.c");
    let sizes = [
        ("BerthHeader", size_of::<abi::Header>()),
        ("BerthStrRef", size_of::<abi::StrRef>()),
        ("BerthErrorBuf", size_of::<abi::ErrorBuf>()),
        ("BerthEntryTable", size_of::<abi::EntryTable>()),
        ("BerthInstance", size_of::<abi::Instance>()),
        ("BerthModelVtable", size_of::<abi::ModelVtable>()),
        ("BerthModelInfo", size_of::<abi::ModelInfo>()),
        ("BerthBatch", size_of::<abi::Batch>()),
        ("BerthLogits", size_of::<abi::Logits>()),
        ("BerthImageInput", size_of::<abi::ImageInput>()),
        ("BerthRgbImage", size_of::<abi::RgbImage>()),
        ("BerthPreparedSlice", size_of::<abi::PreparedSlice>()),
        ("BerthImageSink", size_of::<abi::ImageSink>()),
    ];
    let mut c = String::from("#include \"berth_plugin.h\"\n\n");
    c.push_str("const BerthEntryTable *berth_plugin_entry_v1(void);\n");
    c.push_str("const char *berth_plugin_manifest(void);\n");
    c.push_str("static BerthEntryFn entry_fn = berth_plugin_entry_v1;\n");
    c.push_str("static BerthManifestFn manifest_fn = berth_plugin_manifest;\n");
    for (name, size) in sizes {
        c.push_str(&format!(
            "_Static_assert(sizeof({name}) == {size}, \"size of {name}\");\n"
        ));
    }
    c.push_str(&format!(
        "_Static_assert(BERTH_MODEL_VTABLE_SIZE_V1_0 == {}, \"1.0 vtable size\");\n",
        abi::MODEL_VTABLE_SIZE_V1_0
    ));
    c.push_str(&format!(
        "_Static_assert(BERTH_MODEL_INFO_SIZE_V1_1 == {}, \"1.1 model info size\");\n",
        abi::MODEL_INFO_SIZE_V1_1
    ));
    c.push_str(&format!(
        "_Static_assert(BERTH_MODEL_VTABLE_SIZE_V1_2 == {}, \"1.2 vtable size\");\n",
        abi::MODEL_VTABLE_SIZE_V1_2
    ));
    c.push_str(&format!(
        "_Static_assert(BERTH_MODEL_INFO_SIZE_V1_2 == {}, \"1.2 model info size\");\n",
        abi::MODEL_INFO_SIZE_V1_2
    ));
    c.push_str(&format!(
        "_Static_assert(BERTH_MODEL_VTABLE_SIZE_V1_3 == {}, \"1.3 vtable size\");\n",
        abi::MODEL_VTABLE_SIZE_V1_3
    ));
    c.push_str(&format!(
        "_Static_assert(BERTH_MODEL_INFO_SIZE_V1_3 == {}, \"1.3 model info size\");\n",
        abi::MODEL_INFO_SIZE_V1_3
    ));
    c.push_str(&format!(
        "_Static_assert(BERTH_MODEL_VTABLE_SIZE_V1_4 == {}, \"1.4 vtable size\");\n",
        abi::MODEL_VTABLE_SIZE_V1_4
    ));
    for (name, value) in [
        ("BERTH_ABI_MINOR", u64::from(abi::ABI_MINOR)),
        ("BERTH_CAP_VISION", abi::CAP_VISION),
        ("BERTH_CAP_EMBEDDING", abi::CAP_EMBEDDING),
    ] {
        c.push_str(&format!("_Static_assert({name} == {value}, \"{name}\");\n"));
    }
    for (field, offset) in [
        ("positions", std::mem::offset_of!(abi::ImageInput, positions)),
        ("grid_rows", std::mem::offset_of!(abi::ImageInput, grid_rows)),
        ("pixels", std::mem::offset_of!(abi::ImageInput, pixels)),
    ] {
        c.push_str(&format!(
            "_Static_assert(offsetof(BerthImageInput, {field}) == {offset}, \"image input {field}\");\n"
        ));
    }
    let vtable = [
        ("encode_images", offset_of!(abi::ModelVtable, encode_images)),
        ("embed", offset_of!(abi::ModelVtable, embed)),
        ("prepare_image", offset_of!(abi::ModelVtable, prepare_image)),
    ];
    let info = [
        ("vision_json", offset_of!(abi::ModelInfo, vision_json)),
        ("embedding_json", offset_of!(abi::ModelInfo, embedding_json)),
    ];
    for (strukt, fields) in [("BerthModelVtable", &vtable[..]), ("BerthModelInfo", &info[..])] {
        for (field, offset) in fields {
            c.push_str(&format!(
                "_Static_assert(offsetof({strukt}, {field}) == {offset}, \"{strukt}.{field}\");\n"
            ));
        }
    }
    c.push_str("int use_them(void) { return entry_fn != 0 && manifest_fn != 0; }\n");
    std::fs::write(&source, c).unwrap();
    let include = header_path();
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
        .arg(include.parent().unwrap())
        .arg(&source)
        .output()
        .expect("cc runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "cc rejected {} with berth_plugin.h:\n{}",
        Path::new("plugin.c").display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
