#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs, missing_debug_implementations)]
//! numaframe: a `no_std` NUMA page-frame allocator.

pub mod addr;
pub mod error;
pub mod hugetlb;
pub mod interleave;
pub mod topology;
pub mod zonelist;

pub use addr::{MAX_ORDER, Order, PAGE_SIZE, Pfn, PhysAddr, PhysRange};
pub use error::*;
pub use topology::{MAX_NODES, NodeId, NodeInfo, NodeMask, Topology};
