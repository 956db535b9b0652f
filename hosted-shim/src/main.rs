//! The `numaframe` command (placeholder, being written).
fn main() {}
