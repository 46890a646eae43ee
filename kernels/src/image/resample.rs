//! Antialiased separable resampling of 8-bit RGB images, bit-exact with the two resizers the
//! Hugging Face image processors use: Pillow's `Image.resize` (fixed-point weights with 22
//! fractional bits) and torch's uint8 antialias path used by torchvision (weights scaled to
//! fit 16 bits). Both run a horizontal pass into an 8-bit buffer, then a vertical pass.

use super::RgbImage;

/// The interpolation filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Triangle filter, support 1 (PIL `BILINEAR`).
    Bilinear,
    /// Cubic convolution with a = -0.5, support 2 (PIL `BICUBIC`).
    Bicubic,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Self::Bilinear => 1.0,
            Self::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Self::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Self::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// Whose integer arithmetic to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arithmetic {
    /// Pillow: weights with 22 fractional bits.
    Pillow,
    /// torch's uint8 antialias kernel (torchvision `resize` on uint8 tensors): the largest
    /// number of fractional bits (at most 22) that keeps every weight within an `i16`.
    TorchU8,
}

/// Per output pixel: first input index and its integer weights.
struct Coeffs {
    starts: Vec<usize>,
    weights: Vec<Vec<i32>>,
    bits: u32,
}

fn coeffs(in_size: usize, out_size: usize, filter: Filter, arith: Arithmetic) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let inv = 1.0 / filterscale;
    let mut starts = Vec::with_capacity(out_size);
    let mut float_weights = Vec::with_capacity(out_size);
    let mut w_max = 0f64;
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // `as i64` truncates toward zero, as the C casts do.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let mut ws: Vec<f64> = (xmin..xmax)
            .map(|x| filter.weight((x as f64 - center + 0.5) * inv))
            .collect();
        let total: f64 = ws.iter().sum();
        if total != 0.0 {
            for w in &mut ws {
                *w /= total;
            }
        }
        for &w in &ws {
            w_max = w_max.max(w);
        }
        starts.push(xmin);
        float_weights.push(ws);
    }
    let bits = match arith {
        Arithmetic::Pillow => 22,
        Arithmetic::TorchU8 => {
            let mut bits = 0u32;
            while bits < 22 {
                let next = (0.5 + w_max * f64::from(1u32 << (bits + 1))) as i64;
                if next >= 1 << 15 {
                    break;
                }
                bits += 1;
            }
            bits
        }
    };
    let one = f64::from(1u32 << bits);
    let weights = float_weights
        .into_iter()
        .map(|ws| {
            ws.into_iter()
                .map(|w| {
                    if w < 0.0 {
                        (-0.5 + w * one) as i32
                    } else {
                        (0.5 + w * one) as i32
                    }
                })
                .collect()
        })
        .collect();
    Coeffs {
        starts,
        weights,
        bits,
    }
}

fn clip8(acc: i32, bits: u32) -> u8 {
    (acc >> bits).clamp(0, 255) as u8
}

/// Resizes an RGB image to `width`×`height` with an antialiased filter.
pub fn resize(img: &RgbImage, width: usize, height: usize, filter: Filter, arith: Arithmetic) -> RgbImage {
    assert!(width > 0 && height > 0, "resize to an empty image");
    let mut cur = img.clone();
    if width != cur.width {
        let c = coeffs(cur.width, width, filter, arith);
        let half = if c.bits == 0 { 0 } else { 1 << (c.bits - 1) };
        let mut out = vec![0u8; width * cur.height * 3];
        for y in 0..cur.height {
            let row = &cur.data[y * cur.width * 3..(y + 1) * cur.width * 3];
            for x in 0..width {
                let (start, ws) = (c.starts[x], &c.weights[x]);
                for ch in 0..3 {
                    let mut acc = half;
                    for (k, &w) in ws.iter().enumerate() {
                        acc += i32::from(row[(start + k) * 3 + ch]) * w;
                    }
                    out[(y * width + x) * 3 + ch] = clip8(acc, c.bits);
                }
            }
        }
        cur = RgbImage {
            width,
            height: cur.height,
            data: out,
        };
    }
    if height != cur.height {
        let c = coeffs(cur.height, height, filter, arith);
        let half = if c.bits == 0 { 0 } else { 1 << (c.bits - 1) };
        let stride = cur.width * 3;
        let mut out = vec![0u8; height * stride];
        for y in 0..height {
            let (start, ws) = (c.starts[y], &c.weights[y]);
            for i in 0..stride {
                let mut acc = half;
                for (k, &w) in ws.iter().enumerate() {
                    acc += i32::from(cur.data[(start + k) * stride + i]) * w;
                }
                out[y * stride + i] = clip8(acc, c.bits);
            }
        }
        cur = RgbImage {
            width: cur.width,
            height,
            data: out,
        };
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(w: usize, h: usize) -> RgbImage {
        let data = (0..w * h * 3).map(|i| ((i * 37) % 256) as u8).collect();
        RgbImage {
            width: w,
            height: h,
            data,
        }
    }

    #[test]
    fn same_size_is_identity() {
        let img = gradient(7, 5);
        for f in [Filter::Bilinear, Filter::Bicubic] {
            for a in [Arithmetic::Pillow, Arithmetic::TorchU8] {
                assert_eq!(resize(&img, 7, 5, f, a), img);
            }
        }
    }

    #[test]
    fn constant_image_stays_constant() {
        let img = RgbImage {
            width: 13,
            height: 9,
            data: vec![200; 13 * 9 * 3],
        };
        for f in [Filter::Bilinear, Filter::Bicubic] {
            for a in [Arithmetic::Pillow, Arithmetic::TorchU8] {
                let out = resize(&img, 31, 4, f, a);
                assert!(out.data.iter().all(|&v| v == 200), "{f:?} {a:?}");
            }
        }
    }

    #[test]
    fn halving_bilinear_averages_pairs() {
        // Downscaling by 2 with the triangle filter stretched to support 2: weights 1/4, 3/4,
        // 3/4, 1/4 over four inputs (normalised), i.e. (a + 3b + 3c + d) / 8.
        let img = RgbImage {
            width: 4,
            height: 1,
            data: [0u8, 80, 160, 240].iter().flat_map(|&v| [v; 3]).collect(),
        };
        let out = resize(&img, 2, 1, Filter::Bilinear, Arithmetic::Pillow);
        // x=0: inputs 0,1,2 with weights 3/4,3/4,1/4 normalised by 7/4 -> (0*3+80*3+160)/7.
        assert_eq!(out.data[0], ((80.0 * 3.0 + 160.0) / 7.0f64).round() as u8);
        // x=1: inputs 1,2,3 with weights 1/4,3/4,3/4 -> (80+160*3+240*3)/7.
        assert_eq!(out.data[3], ((80.0 + 480.0 + 720.0) / 7.0f64).round() as u8);
    }
}
