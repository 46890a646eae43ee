//! Fuzzes the GGUF reader (`berth_formats::GgufFile`) on arbitrary bytes: opening must return
//! an error or a file whose tables are consistent with its bytes, never panic; every metadata
//! value and every tensor is then read through the public accessors.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use berth_formats::{file_type_name, quant_mix, GgufFile, GgufValue};
use libfuzzer_sys::fuzz_target;

/// The reader maps files, so each input goes through one scratch file per fuzzing process.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| std::env::temp_dir().join(format!("berth-fuzz-gguf-{}.gguf", std::process::id())))
}

fn touch(value: &GgufValue) -> usize {
    let _ = (value.as_u64(), value.as_i64(), value.as_f32(), value.as_bool());
    let mut n = value.summary().len() + value.type_name().len() + value.as_str().map_or(0, str::len);
    for item in value.as_array().unwrap_or(&[]) {
        n += touch(item);
    }
    n
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    std::fs::write(path, data).expect("writing the scratch file");
    let Ok(file) = GgufFile::open(path) else {
        return;
    };
    assert_eq!(file.bytes(), data);
    assert!(file.alignment.is_power_of_two());
    let _ = format!("{file:?}");
    for (key, value) in file.metadata() {
        touch(value);
        assert!(file.get(key).is_some());
        let _ = (
            file.get_str(key),
            file.get_u64(key),
            file.get_f32(key),
            file.get_bool(key),
        );
        let _ = (file.get_str_array(key), file.get_u64_array(key));
    }
    let _ = file.architecture();
    if let Some(ft) = file.get_u64("general.file_type") {
        let _ = file_type_name(ft as u32);
    }
    for t in file.tensors() {
        assert!(file.tensor(&t.name).is_some());
        assert!(
            t.offset >= file.data_offset,
            "tensor {} before the data section",
            t.name
        );
        assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes, "tensor {}", t.name);
        let _ = (t.n_elements(), t.ggml_type.name(), t.ggml_type.id());
        let _ = (t.ggml_type.block_size(), t.ggml_type.type_size());
    }
    let _ = file.parameter_count();
    let _ = quant_mix(&file);
});
