#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs, missing_debug_implementations)]
//! numaframe: a `no_std` NUMA page-frame allocator for hypervisors and unikernels.
//!
//! It owns physical memory node by node: each node's zones (`Dma32` below 4 GiB, `Normal`
//! above) are buddy allocators of orders 0..=18 behind spinlocks, with their per-frame metadata
//! outside the frames. Allocations walk fallback orders built exactly as Linux's
//! `build_zonelists()` builds them; memory policies (including weighted interleave with a
//! one-pass bulk path), huge-page pools and per-CPU caches sit on top. The core has no heap, no
//! threads and no clock: the platform lends it memory through [`PhysMemory`].
//!
//! # Example
//!
//! Boot a two-node machine whose metadata lives in a static arena, allocate and free.
//!
//! ```
//! use core::ptr::NonNull;
//! use numaframe::{AllocFlags, BootOptions, Machine, MemoryRange, NodeId, NodeInfo, Order};
//! use numaframe::{PhysMemory, PhysRange, Pfn, Topology};
//!
//! /// Physical memory identity-mapped onto a static arena: frame `n` is arena page `n`.
//! struct Arena(*mut u8);
//! // SAFETY: the pointer is only offset, never dereferenced, by `map`, which any thread may call.
//! unsafe impl Sync for Arena {}
//! // SAFETY: the arena is 4 KiB aligned, lives forever, and the allocator maps each range of it
//! // at most once (the frames it hands out are never touched through `map`).
//! unsafe impl PhysMemory for Arena {
//!     fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
//!         (range.end().get() <= FRAMES).then(|| {
//!             // SAFETY: the range lies inside the arena.
//!             NonNull::new(unsafe { self.0.add(range.start().addr().get() as usize) }).unwrap()
//!         })
//!     }
//! }
//! const FRAMES: u64 = 2 * 256;
//! #[repr(align(4096))]
//! struct Pages([u8; FRAMES as usize * 4096]);
//! static mut MEMORY: Pages = Pages([0; FRAMES as usize * 4096]);
//!
//! let distances = [10, 20, 20, 10];
//! let node = NodeInfo { has_cpus: true, has_memory: true, ..NodeInfo::default() };
//! let nodes = [node, node];
//! let topology = Topology::new(&distances, &nodes)?;
//! let ranges = [
//!     MemoryRange { node: NodeId::new(0), range: PhysRange::new(Pfn::new(0), Pfn::new(256)).unwrap() },
//!     MemoryRange { node: NodeId::new(1), range: PhysRange::new(Pfn::new(256), Pfn::new(512)).unwrap() },
//! ];
//! let arena = Arena(&raw mut MEMORY as *mut u8);
//! let machine = Machine::boot(topology, &arena, &ranges, BootOptions::default())?;
//!
//! let frame = machine.alloc(NodeId::new(1), Order::ZERO, AllocFlags::empty()).unwrap();
//! assert_eq!(machine.node_of(frame), Some(NodeId::new(1)));
//! machine.free(frame, Order::ZERO)?;
//! assert!(machine.free(frame, Order::ZERO).is_err(), "double frees are refused");
//! machine.check_invariants()?;
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```

pub mod addr;
mod bitmap;
mod buddy;
pub mod error;
#[cfg(feature = "fdt")]
pub mod fdt;
pub mod heap;
pub mod hugetlb;
pub mod interleave;
pub mod machine;
mod meta;
pub mod node;
pub mod percpu;
pub mod platform;
pub mod policy;
pub mod stats;
mod sync;
pub mod topology;
#[cfg(feature = "x86_64")]
pub mod x86;
pub mod zonelist;

#[cfg(test)]
mod test_util;

#[cfg(feature = "fdt")]
pub use self::fdt::{FdtError, FdtTopology};
pub use addr::{HugeSize, MAX_ORDER, Order, PAGE_SIZE, Pfn, PhysAddr, PhysRange};
pub use buddy::{PageblockCounts, PageblockInfo, PageblockKind};
pub use error::*;
pub use heap::{FrameMap, NodeHeap, NumaHeap};
pub use machine::{
    AllocFlags, BootOptions, CpuHandle, Machine, MemoryRange, OfflineOptions, REPORT_CAPACITY,
    Reported, TablePlace,
};
#[cfg(feature = "poison")]
pub use machine::{POISON_BYTE, WriteAfterFree};
pub use meta::Class;
pub use meta::MAX_SPANS_PER_ZONE;
pub use node::{HugeCounts, Node, Nodes, UnusableIndex, Watermarks, Zone, ZoneCounters, ZoneKind};
pub use percpu::{CpuId, CpuKick, PcpConfig};
pub use platform::{FrameClearer, InstallHook, PhysMemory};
pub use stats::NumaStat;
pub use topology::{MAX_NODES, NodeId, NodeInfo, NodeMask, Topology, TopologyError};
#[cfg(feature = "x86_64")]
pub use x86::NumaFrameAllocator;
