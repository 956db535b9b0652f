//! numaframe's test kit: what the test crates (`tests/`, the hosted shim's tests, the fuzz
//! harnesses, benchmarks) share, so that none of them carries its own copy.
//!
//! - [`Rng`]: the one seeded generator;
//! - [`SparseMem`]: the one mock `PhysMemory`, heap buffers that exist only where the allocator
//!   maps them, at any address (the hosted shim's `SimMemory` is the simulated platform instead:
//!   mmap-backed arenas laid out once, zero-filled, cheap for terabytes);
//! - [`Spec`]: machine tables that own their data, with builders and a boot;
//! - [`Snap`]: the allocator state a refused call must leave as it was;
//! - [`FallbackStorage`]: heap storage for the core's fallback build, for tests that call it
//!   directly;
//! - [`TempDir`] and [`samples`]: files for the readers and the command line.
//!
//! The parts that name no numaframe type live in `numaframe-testkit-base`, so that the core's own
//! unit tests, which cannot link this crate, share them too; its generator and distance table
//! are re-exported here, and its raw memory is what [`SparseMem`] (and the core's mock) hold.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs, missing_debug_implementations)]

mod fallback;
mod fs;
mod machine;
mod memory;
pub mod samples;
mod snap;

pub use fallback::{FallbackParts, FallbackStorage, node_states};
pub use fs::TempDir;
pub use machine::{Spec, memory_range, node_info, node_infos};
pub use memory::SparseMem;
pub use numaframe_testkit_base::{Rng, uniform_distances};
pub use snap::{Snap, ZoneSnap};
