//! Typed errors, one small `Copy` enum per operation. They carry the offending value and never a
//! string, so they work without a heap.
#![deny(unsafe_code)]

use core::fmt;

use crate::addr::{Order, Pfn};
use crate::topology::NodeId;

macro_rules! impl_error {
    ($ty:ty, $self:ident, $f:ident, $body:expr) => {
        impl fmt::Display for $ty {
            fn fmt(&$self, $f: &mut fmt::Formatter<'_>) -> fmt::Result {
                $body
            }
        }
        impl core::error::Error for $ty {}
    };
}

/// Booting a machine or hot-adding memory failed; nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum BootError {
    /// A memory range names a node outside the topology.
    UnknownNode {
        /// The node.
        node: NodeId,
    },
    /// Memory was given for a node the topology says has none, or none for one that has.
    MemoryStateMismatch {
        /// The node.
        node: NodeId,
    },
    /// Two memory ranges overlap, or a hot-added range overlaps present memory.
    Overlap {
        /// First frame of the offending range.
        start: Pfn,
    },
    /// A range is empty, ends past 2^52 frames, holds 2^36 frames (256 TiB) or more, or is too
    /// small to hold its own metadata and a frame to manage.
    BadRange {
        /// First frame of the offending range.
        start: Pfn,
    },
    /// More memory ranges than the fixed tables hold: the span index (the boot's ranges and
    /// `hotplug_slots`), or a zone's [`MAX_SPANS_PER_ZONE`](crate::MAX_SPANS_PER_ZONE) spans.
    TooManyRanges,
    /// The platform could not map a metadata region.
    MapFailed {
        /// First frame of the region.
        start: Pfn,
    },
    /// No node has room for the machine-wide tables.
    NoBootMemory,
    /// A node's own tables (its zones and fallback order), or the cache of a CPU on it, need
    /// `frames` frames, and no node with memory has that many left for them.
    NoRoomForTables {
        /// The node (the CPU's node, for a CPU's cache).
        node: NodeId,
        /// The frames the tables need.
        frames: u64,
    },
}

impl_error!(
    BootError,
    self,
    f,
    match *self {
        BootError::UnknownNode { node } =>
            write!(f, "memory for node {node}, which is not in the topology"),
        BootError::MemoryStateMismatch { node } =>
            write!(f, "node {node}: memory ranges disagree with has_memory"),
        BootError::Overlap { start } => write!(f, "memory range at pfn {start} overlaps another"),
        BootError::BadRange { start } => write!(
            f,
            "memory range at pfn {start} is empty, too small for its metadata, ends past 2^52 frames or spans 2^36 frames or more"
        ),
        BootError::TooManyRanges => write!(f, "too many memory ranges"),
        BootError::MapFailed { start } =>
            write!(f, "platform could not map metadata at pfn {start}"),
        BootError::NoBootMemory => write!(f, "no node has room for the allocator's tables"),
        BootError::NoRoomForTables { node, frames } => write!(
            f,
            "no node with memory has {frames} frames left for the tables of node {node}"
        ),
    }
);

/// A free was rejected; the allocator's state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum FreeError {
    /// The frame is not memory this allocator owns.
    Foreign {
        /// The frame.
        pfn: Pfn,
    },
    /// The frame is not aligned to the order given.
    Misaligned {
        /// The frame.
        pfn: Pfn,
        /// The order given.
        order: Order,
    },
    /// The block is already free.
    DoubleFree {
        /// The frame.
        pfn: Pfn,
    },
    /// The frame does not start an allocated block (it lies inside one, or was never handed out).
    NotAllocated {
        /// The frame.
        pfn: Pfn,
    },
    /// The block was allocated with another order.
    WrongOrder {
        /// The frame.
        pfn: Pfn,
        /// The order given.
        given: Order,
        /// The order it was allocated with.
        allocated: Order,
    },
    /// The block belongs to a huge-page pool: free it with `free_huge`.
    HugePage {
        /// The frame.
        pfn: Pfn,
    },
    /// The frame appears twice in one bulk free.
    Duplicate {
        /// The frame.
        pfn: Pfn,
    },
    /// The CPU was not registered at boot.
    UnknownCpu {
        /// The CPU index.
        cpu: u32,
    },
}

impl_error!(
    FreeError,
    self,
    f,
    match *self {
        FreeError::Foreign { pfn } => write!(f, "pfn {pfn} is not owned by this allocator"),
        FreeError::Misaligned { pfn, order } =>
            write!(f, "pfn {pfn} is not aligned to order {order}"),
        FreeError::DoubleFree { pfn } => write!(f, "pfn {pfn} is already free"),
        FreeError::NotAllocated { pfn } => write!(f, "pfn {pfn} does not start an allocated block"),
        FreeError::WrongOrder {
            pfn,
            given,
            allocated,
        } => {
            write!(
                f,
                "pfn {pfn} freed with order {given} but allocated with order {allocated}"
            )
        }
        FreeError::HugePage { pfn } => write!(f, "pfn {pfn} is a pool huge page; use free_huge"),
        FreeError::Duplicate { pfn } => write!(f, "pfn {pfn} appears twice in one bulk free"),
        FreeError::UnknownCpu { cpu } => write!(f, "cpu {cpu} was not registered at boot"),
    }
);

/// A free inside a bulk free failed; `index` names the offending slot. Nothing was freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BulkFreeError {
    /// Index of the offending frame in the slice.
    pub index: usize,
    /// Why it was rejected.
    pub error: FreeError,
}

impl_error!(
    BulkFreeError,
    self,
    f,
    write!(f, "entry {}: {}", self.index, self.error)
);

/// Claiming a CPU's cache ([`Machine::claim_cpu`](crate::Machine::claim_cpu)) failed; nothing
/// was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ClaimError {
    /// No CPU with this index was registered at boot.
    UnknownCpu {
        /// The CPU index.
        cpu: u32,
    },
    /// A live handle already holds this CPU's cache.
    Claimed {
        /// The CPU index.
        cpu: u32,
    },
}

impl_error!(
    ClaimError,
    self,
    f,
    match self {
        ClaimError::UnknownCpu { cpu } => write!(f, "cpu {cpu} was not registered at boot"),
        ClaimError::Claimed { cpu } => write!(f, "cpu {cpu} is already claimed by a live handle"),
    }
);

/// A memory policy or interleave weight was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum PolicyError {
    /// The policy's node mask is empty (or holds no node of the machine).
    EmptyMask,
    /// A node outside the machine.
    UnknownNode {
        /// The node.
        node: NodeId,
    },
    /// An interleave weight of 0.
    ZeroWeight {
        /// The node whose weight is 0.
        node: NodeId,
    },
    /// More weights than [`MAX_NODES`](crate::MAX_NODES) (a shorter table weighs the nodes
    /// past its end 1).
    WeightCount {
        /// Entries given.
        given: usize,
        /// `MAX_NODES`, the most a table holds.
        nodes: usize,
    },
    /// Automatic weights need a bandwidth for every node of the set.
    MissingBandwidth {
        /// The node without one.
        node: NodeId,
    },
}

impl_error!(
    PolicyError,
    self,
    f,
    match *self {
        PolicyError::EmptyMask => write!(f, "policy node mask is empty"),
        PolicyError::UnknownNode { node } => write!(f, "node {node} is not in the machine"),
        PolicyError::ZeroWeight { node } =>
            write!(f, "weight of node {node} is 0; weights are 1..=255"),
        PolicyError::WeightCount { given, nodes } =>
            write!(f, "{given} weights given for {nodes} nodes"),
        PolicyError::MissingBandwidth { node } =>
            write!(f, "node {node} has no bandwidth for auto weights"),
    }
);

/// `check_invariants()` found the allocator's state inconsistent. This is a bug in numaframe
/// (or memory corruption), never a caller mistake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum InvariantError {
    /// A free-list entry does not carry the free tag of its list's order.
    BadFreeTag {
        /// The block.
        pfn: Pfn,
        /// The list's order.
        order: Order,
    },
    /// A free-list link is inconsistent (prev/next disagree or leave the zone).
    BrokenLink {
        /// The block.
        pfn: Pfn,
    },
    /// A free block and its buddy are both free at the same order (they should have merged).
    Unmerged {
        /// The block.
        pfn: Pfn,
    },
    /// A counter disagrees with the lists.
    Counter {
        /// Node of the zone.
        node: NodeId,
    },
    /// A pageblock's header disagrees with its planes or its place (bucket, spare, CPU).
    Pageblock {
        /// The pageblock's first frame.
        pfn: Pfn,
    },
    /// A zone's count of dirty free frames disagrees with its headers and planes.
    Dirty {
        /// Node of the zone.
        node: NodeId,
        /// The zone's count.
        counted: u64,
        /// What the headers and planes mark dirty.
        marked: u64,
    },
    /// A zone's count of reported free frames disagrees with the marks on its free blocks.
    Reported {
        /// Node of the zone.
        node: NodeId,
        /// The zone's count.
        counted: u64,
        /// What the marks on its free blocks add up to.
        marked: u64,
    },
    /// A section's count of free pageblocks disagrees with its lists or its bucket.
    Section {
        /// The section's first frame (in its span).
        pfn: Pfn,
    },
}

impl_error!(
    InvariantError,
    self,
    f,
    match *self {
        InvariantError::BadFreeTag { pfn, order } =>
            write!(f, "free list {order} holds pfn {pfn} without its free tag"),
        InvariantError::BrokenLink { pfn } =>
            write!(f, "free-list links around pfn {pfn} are broken"),
        InvariantError::Unmerged { pfn } => write!(f, "pfn {pfn} and its buddy are both free"),
        InvariantError::Dirty {
            node,
            counted,
            marked,
        } => write!(
            f,
            "node {node} counts {counted} dirty free frames, its metadata marks {marked}"
        ),
        InvariantError::Reported {
            node,
            counted,
            marked,
        } => write!(
            f,
            "node {node} counts {counted} reported free frames, its free blocks' marks {marked}"
        ),
        InvariantError::Counter { node } =>
            write!(f, "counters of node {node} disagree with its lists"),
        InvariantError::Pageblock { pfn } => write!(
            f,
            "pageblock at pfn {pfn} disagrees with its planes or its place"
        ),
        InvariantError::Section { pfn } => write!(
            f,
            "section at pfn {pfn} disagrees with its free lists or its bucket"
        ),
    }
);

/// [`Machine::report`](crate::Machine::report) was called wrongly; nothing was reported or
/// changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ReportError {
    /// The node is not in the machine.
    UnknownNode {
        /// The node.
        node: NodeId,
    },
    /// Reporting works on whole pageblocks: the order must be at least 9 (2 MiB).
    BadOrder {
        /// The order asked for.
        order: Order,
    },
    /// A batch holds 1 to [`REPORT_CAPACITY`](crate::machine::REPORT_CAPACITY) blocks.
    BadCapacity {
        /// The capacity asked for.
        capacity: usize,
    },
}

impl_error!(
    ReportError,
    self,
    f,
    match *self {
        ReportError::UnknownNode { node } => write!(f, "node {node} is not in the machine"),
        ReportError::BadOrder { order } => write!(
            f,
            "cannot report blocks of order {order}: the least is 9 (2 MiB)"
        ),
        ReportError::BadCapacity { capacity } => write!(
            f,
            "a report batch holds 1 to {} blocks, not {capacity}",
            crate::machine::REPORT_CAPACITY
        ),
    }
);

/// [`Machine::offline`](crate::Machine::offline) (or
/// [`Machine::unisolate`](crate::Machine::unisolate)) refused. For bad input (`Empty`,
/// `Foreign`, `Partial`, `Tables`) nothing changed; for `Busy` and `NoMetadata` the range is
/// usable as before, or stays isolated if the caller asked for that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum OfflineError {
    /// The range is empty.
    Empty,
    /// A frame of the range is not memory of the machine (the first such frame).
    Foreign {
        /// The frame.
        pfn: Pfn,
    },
    /// The range cuts a memory range of the machine: offlining works on whole spans (each zone
    /// part of a range given to boot or `hot_add`, with the metadata carved from its end).
    Partial {
        /// The boundary of the range that lies inside a span.
        pfn: Pfn,
    },
    /// The span that starts here is bound to tables carved at boot: it holds some (the
    /// machine-wide tables, a node's or a CPU's, or another span's metadata region), or its own
    /// region lies among its node's tables (a node's largest span below 4 GiB). It never goes
    /// offline.
    Tables {
        /// The span's first frame.
        start: Pfn,
    },
    /// Frames of the range are in use: handed out, in a huge page, cached by a CPU that a
    /// [`CpuHandle`](crate::CpuHandle) holds (it gives them back at its next operation, its
    /// [`poll`](crate::CpuHandle::poll), which a [`CpuKick`](crate::CpuKick) asks for, or when
    /// it drops), or held for a moment by a scrub, a report or a metadata growth.
    Busy {
        /// Pageblocks (2 MiB) of the range with a frame in use.
        busy: u64,
        /// The first frame in use.
        pfn: Pfn,
    },
    /// Other memory's metadata lying in the range must move out first, and the node's other
    /// memory cannot spare a slab for it. Metadata already moved stays moved, with any pool
    /// growth that took it (see [`Machine::offline`](crate::Machine::offline)).
    NoMetadata {
        /// The node.
        node: NodeId,
    },
    /// [`Machine::unisolate`](crate::Machine::unisolate) of a range that is not isolated.
    NotIsolated {
        /// The first frame of the range.
        pfn: Pfn,
    },
}

impl_error!(
    OfflineError,
    self,
    f,
    match *self {
        OfflineError::Empty => write!(f, "the range to take offline is empty"),
        OfflineError::Foreign { pfn } => write!(f, "pfn {pfn} is not memory of the machine"),
        OfflineError::Partial { pfn } => write!(
            f,
            "pfn {pfn} cuts a memory range: only whole ranges go offline"
        ),
        OfflineError::Tables { start } => write!(
            f,
            "the memory range at pfn {start} holds the machine's tables and stays online"
        ),
        OfflineError::Busy { busy, pfn } => write!(
            f,
            "{busy} pageblocks of the range are in use, the first frame at pfn {pfn}"
        ),
        OfflineError::NoMetadata { node } => write!(
            f,
            "node {node} has no memory left to move the range's metadata to"
        ),
        OfflineError::NotIsolated { pfn } => {
            write!(f, "the range at pfn {pfn} is not isolated")
        }
    }
);
