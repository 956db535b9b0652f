//! The half of numaframe's test kit that names no numaframe type.
//!
//! The core's own unit tests cannot link a crate that depends on `numaframe`: that crate's
//! `numaframe` would be another crate than the one under test, with other types. So what they
//! share with the other test crates lives here, in plain numbers, and `numaframe-testkit`
//! re-exports it beside the parts that do name numaframe types:
//! - [`Rng`], the one seeded generator of every test;
//! - [`RawMemory`], page-aligned heap buffers that a mock `PhysMemory` hands out, and
//!   [`impl_phys_memory!`], which writes that `unsafe impl` in the calling crate (with the trait
//!   path of that crate's `numaframe`);
//! - the shapes of the machine tables that mocks boot ([`uniform_distances`], [`back_to_back`]).
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs, missing_debug_implementations)]

mod memory;
mod rng;
mod tables;

pub use memory::{PAGE_ALIGN, RawMemory};
pub use rng::Rng;
pub use tables::{Span, back_to_back, uniform_distances};
