//! The scalar row kernels: the definitions the SIMD ones are tested against.

use super::{gelu_tanh, gelu_tanh_f16, silu, RopeRows, Table};

/// The portable row kernels.
pub(super) const TABLE: Table = Table {
    name: "scalar",
    scale_mul,
    axpy,
    add,
    scale,
    round_f16,
    geglu_f16,
    rope,
    gated_fast: gated,
    softmax_fast: super::softmax,
};

pub(super) fn scale_mul(out: &mut [f32], x: &[f32], w: Option<&[f32]>, s: f32, off: f32) {
    match w {
        Some(w) => {
            for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
                *o = v * s * (wi + off);
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * s;
            }
        }
    }
}

pub(super) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(v, &u)| *v += a * u);
}

pub(super) fn add(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

pub(super) fn scale(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

pub(super) fn round_f16(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = super::round_f16(*v));
}

pub(super) fn geglu_f16(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(v, &g)| *v = gelu_tanh_f16(*v) * g);
}

pub(super) fn gated(a: &mut [f32], b: Option<&[f32]>, gelu: bool) {
    let act = if gelu { gelu_tanh } else { silu };
    match b {
        Some(b) => a.iter_mut().zip(b).for_each(|(v, &g)| *v = act(*v) * g),
        None => a.iter_mut().for_each(|v| *v = act(*v)),
    }
}

pub(super) fn rope(x: &mut [f32], r: &RopeRows) {
    for head in x.chunks_exact_mut(r.head_dim) {
        for (j, (&c, &s)) in r.cos.iter().zip(r.sin).enumerate() {
            rotate(head, r, j, c, s);
        }
    }
}

/// [`rope`] with the angles read straight from `cs` (more pairs than the SIMD path stages).
pub(super) fn rope_pairs(x: &mut [f32], r: &RopeRows, cs: &[(f32, f32)]) {
    for head in x.chunks_exact_mut(r.head_dim) {
        for (j, &(c, s)) in cs.iter().enumerate() {
            rotate(head, r, j, c, s);
        }
    }
}

/// Rotates pair `j` of one head.
#[inline]
pub(super) fn rotate(head: &mut [f32], r: &RopeRows, j: usize, c: f32, s: f32) {
    let (a, b) = if r.neox {
        (j, j + r.half)
    } else {
        (2 * j, 2 * j + 1)
    };
    let (x0, x1) = (head[a], head[b]);
    if r.fused {
        // As GCC contracts ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos`.
        head[a] = x0.mul_add(c, -(x1 * s));
        head[b] = x0.mul_add(s, x1 * c);
    } else {
        head[a] = x0 * c - x1 * s;
        head[b] = x1 * c + x0 * s;
    }
}
