#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs, missing_debug_implementations)]
//! numaframe: a `no_std` NUMA page-frame allocator for hypervisors and unikernels.

pub mod addr;
mod buddy;
pub mod error;
pub mod hugetlb;
pub mod interleave;
pub mod machine;
mod meta;
pub mod node;
pub mod percpu;
pub mod platform;
pub mod policy;
pub mod stats;
pub mod sync;
pub mod topology;
pub mod zonelist;

#[cfg(test)]
mod test_util;

pub use addr::{MAX_ORDER, Order, PAGE_SIZE, Pfn, PhysAddr, PhysRange};
pub use error::*;
pub use machine::{AllocFlags, BootOptions, Machine, MemoryRange};
pub use meta::MAX_SPANS_PER_ZONE;
pub use node::{Node, Watermarks, Zone, ZoneKind};
pub use percpu::{CpuId, PcpConfig};
pub use platform::PhysMemory;
pub use stats::NumaStat;
pub use topology::{MAX_NODES, NodeId, NodeInfo, NodeMask, Topology};
