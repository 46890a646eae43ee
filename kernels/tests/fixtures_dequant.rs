//! Checks the scalar dequantizers against gguf's reference decoder on real model rows.

use berth_kernels::quant::WeightType;
use std::path::Path;

#[test]
fn dequantize_matches_gguf_reference() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let manifest = std::fs::read_to_string(dir.join("manifest.txt")).unwrap();
    let mut cases = 0;
    for line in manifest.lines().filter(|l| !l.trim().is_empty()) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let name = parts[0];
        let wtype = WeightType::from_ggml_id(parts[1].parse().unwrap()).unwrap();
        let n: usize = parts[2].parse().unwrap();
        let raw = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
        let expected: Vec<f32> = std::fs::read(dir.join(format!("{name}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(raw.len(), wtype.row_bytes(n), "{name}");
        let mut got = vec![0.0f32; n];
        wtype.dequantize_row(&raw, &mut got);
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            let tol = 1e-6 * e.abs().max(1e-3);
            assert!((g - e).abs() <= tol, "{name}[{i}]: got {g}, expected {e}");
        }
        cases += 1;
    }
    assert!(cases >= 8);
}
