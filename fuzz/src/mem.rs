//! Physical memory for fuzzing: the test kit's `SparseMem` (every range the allocator maps gets
//! a fresh page-aligned heap buffer filled with a garbage byte, overlapping maps are refused),
//! refusing any map above [`MAP_LIMIT`] as well, so that a fuzzed hot-add of terabytes is a
//! typed `MapFailed`, not an out-of-memory abort.

use numaframe_testkit::SparseMem;

/// The largest range one `map` call serves (64 MiB of metadata covers 20 GiB of frames).
pub const MAP_LIMIT: u64 = 64 << 20;

/// Memory whose fresh regions read as `fill` bytes.
pub fn sparse(fill: u8) -> SparseMem {
    SparseMem::with_map_limit(fill, MAP_LIMIT)
}
