//! CPU compute kernels for Berth plugins (filled in by the real-inference work).
