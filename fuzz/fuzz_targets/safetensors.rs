//! Fuzzes the safetensors reader (`berth_formats::SafetensorsFile`) on arbitrary bytes: opening
//! must return an error or a file whose tensors lie inside it, never panic; every tensor and
//! metadata entry is then read through the public accessors.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use berth_formats::SafetensorsFile;
use libfuzzer_sys::fuzz_target;

/// The reader maps files, so each input goes through one scratch file per fuzzing process.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!(
            "berth-fuzz-safetensors-{}.safetensors",
            std::process::id()
        ))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    std::fs::write(path, data).expect("writing the scratch file");
    let Ok(file) = SafetensorsFile::open(path) else {
        return;
    };
    assert_eq!(file.bytes(), data);
    let _ = format!("{file:?}");
    for t in file.tensors() {
        assert!(
            t.data_offsets.0 >= file.data_offset,
            "tensor {} inside the header",
            t.name
        );
        let bytes = file.tensor_data(&t.name).expect("a listed tensor has data");
        assert_eq!(bytes.len() as u64, t.n_bytes(), "tensor {}", t.name);
        if let Some(size) = t.dtype.size() {
            assert_eq!(t.n_elements() * size, t.n_bytes(), "tensor {}", t.name);
        }
        let _ = (t.n_elements(), t.dtype.name());
    }
    for (key, value) in file.metadata() {
        let _ = (key.len(), value.len());
    }
    let _ = file.parameter_count();
});
