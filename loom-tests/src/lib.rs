//! loom models live in `tests/`; run them with `RUSTFLAGS="--cfg numaframe_loom"`.
