//! A booted machine: its nodes, the layout that hot-add rewrites, the per-CPU caches, and the
//! allocation and free paths over them.
//!
//! The machine's work is split by job: [`boot`](Machine::boot) lays memory out, `layout` holds
//! the tables allocations read without a lock, `hotplug` adds memory at run time, `walk` is the
//! zonelist walk every allocation takes, `free` returns blocks, `huge` serves the huge-page
//! pools, `cpu` is the per-CPU entry points, and `check` the invariant walk.
#![deny(unsafe_code)]

mod boot;
mod check;
mod cpu;
mod free;
mod handle;
mod hotplug;
mod huge;
mod layout;
mod offline;
#[cfg(feature = "poison")]
mod poison;
mod report;
mod scrub;
mod trim;
mod walk;

use bitflags::bitflags;

use crate::addr::PhysRange;
use crate::interleave::Weights;
use crate::node::{Node, Nodes};
use crate::percpu::{Caches, CpuId, CpuKick, PcpConfig};
use crate::platform::{FrameClearer, PhysMemory, Poison};
use crate::stats::NumaStat;
use crate::sync::RwLock;
use crate::topology::{NodeId, NodeMask, Topology};
use crate::zonelist::FallbackOptions;

pub use self::handle::CpuHandle;
use self::layout::Layout;
pub use self::offline::OfflineOptions;
#[cfg(feature = "poison")]
pub use self::poison::{POISON_BYTE, WriteAfterFree};
pub use self::report::{REPORT_CAPACITY, Reported};
pub(crate) use self::walk::Request;

bitflags! {
    /// How an allocation may be satisfied (Linux's GFP and ALLOC flags that matter here).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct AllocFlags: u32 {
        /// Only the preferred node, no fallback (`__GFP_THISNODE`).
        const THISNODE = 1 << 0;
        /// Only the `Dma32` zone (`GFP_DMA32`).
        const DMA32 = 1 << 1;
        /// May dip below the min watermark (`ALLOC_NO_WATERMARKS` for emergency reserves).
        const RESERVE = 1 << 2;
        /// The block will be given back soon (I/O buffers): it comes from pageblocks that serve
        /// short-lived allocations, so that long-lived ones (page tables, the VMM's own
        /// structures: the default) stay packed together.
        const SHORT_LIVED = 1 << 3;
        /// The frames returned read as zero (`__GFP_ZERO`). Clean frames are preferred; dirty
        /// ones are cleared through the machine's [`FrameClearer`] after every lock is
        /// dropped. Without a clearer (see [`Machine::with_clearer`]) such a request fails.
        /// Without this flag nothing is cleared, and a frame may hold its last owner's data.
        const ZERO = 1 << 4;
    }
}

/// Boot settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootOptions<'c> {
    /// The node of each CPU, by CPU index: each gets a page cache ([`crate::percpu`]).
    pub cpus: &'c [NodeId],
    /// Page-cache tuning.
    pub pcp: PcpConfig,
    /// How fallback orders are built.
    pub fallback: FallbackOptions,
    /// Memory kept free below the min watermark, machine-wide, in KiB; `None` takes Linux's
    /// default (`sqrt(16 · total KiB)`, 128 KiB ..= 256 MiB). `Some(0)` sets the min watermark
    /// to 0; as in Linux, low and high still keep 0.1% and 0.2% of each zone.
    pub min_free_kbytes: Option<u64>,
    /// Linux's `vm.lowmem_reserve_ratio` for `Dma32`: an allocation that may also use `Normal`
    /// leaves `Dma32` the managed pages of its node's `Normal` zone over this ratio beyond the
    /// watermark (see [`Watermarks::protection`](crate::Watermarks::protection)), for the
    /// devices that can only reach memory below 4 GiB. Linux's default is 256; 0 turns the
    /// protection off.
    pub lowmem_reserve_ratio: u32,
    /// Memory ranges that hot-add may add after boot.
    pub hotplug_slots: usize,
    /// The platform promises that the memory it hands over at boot reads as zero (a
    /// hypervisor that cleared it, a freshly powered machine whose firmware zeroed it): it
    /// starts clean instead of dirty. Hot-added memory is always dirty.
    pub zeroed: bool,
}

impl Default for BootOptions<'_> {
    fn default() -> Self {
        Self {
            cpus: &[],
            pcp: PcpConfig::default(),
            fallback: FallbackOptions::default(),
            min_free_kbytes: None,
            lowmem_reserve_ratio: 256,
            hotplug_slots: 16,
            zeroed: false,
        }
    }
}

/// A range of physical memory on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRange {
    /// The node the memory belongs to.
    pub node: NodeId,
    /// The frames.
    pub range: PhysRange,
}

/// Where boot carved one set of the allocator's tables: see [`Machine::boot`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TablePlace {
    /// The node whose memory holds them.
    pub host: NodeId,
    /// Their frames, whole: no zone manages them, and a free of one is
    /// [`FreeError::Foreign`](crate::FreeError::Foreign).
    pub frames: PhysRange,
}

/// A booted NUMA machine: the allocator.
pub struct Machine<'a> {
    topo: Topology<'a>,
    /// How the machine reaches the frames it takes for its own metadata.
    mem: &'a dyn PhysMemory,
    /// Each in its own node's memory (a memoryless node's in its nearest node's).
    nodes: Nodes<'a>,
    layout: Layout<'a>,
    weights: RwLock<Weights>,
    min_free_kbytes: Option<u64>,
    /// [`BootOptions::lowmem_reserve_ratio`].
    lowmem_reserve_ratio: u32,
    caches: Caches<'a>,
    /// Where boot carved the tables.
    tables: self::boot::Tables<'a>,
    /// How the machine clears frames, if the platform gave it a way.
    clearer: Option<&'a dyn FrameClearer>,
    /// The writes after free the `poison` debug mode found.
    #[cfg(feature = "poison")]
    poison: self::poison::PoisonLog,
}

impl core::fmt::Debug for Machine<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Machine")
            .field("topo", &self.topo)
            .field("nodes", &self.nodes)
            .field("layout", &self.layout)
            .field("caches", &self.caches)
            .finish_non_exhaustive()
    }
}

impl<'a> Machine<'a> {
    /// The machine, clearing frames through `clearer` from now on: for
    /// [`AllocFlags::ZERO`] and for [`Machine::scrub`].
    ///
    /// In the `poison` debug mode it also fills every free frame counted as dirty with the
    /// pattern through `clearer` (boot memory not declared zeroed joined its zones before the
    /// machine had a clearer to fill it with), after giving every CPU's cached pageblocks back
    /// to their zones.
    #[must_use]
    pub fn with_clearer(mut self, clearer: &'a dyn FrameClearer) -> Self {
        self.clearer = Some(clearer);
        #[cfg(feature = "poison")]
        self.poison_free_memory();
        self
    }

    /// The machine, waking a claimed CPU through `kick` when a drain request is posted to it
    /// while its cache holds a pageblock (see [`CpuKick`]); without it, such a CPU gives its
    /// cached pageblocks back at its handle's next operation or drop.
    #[must_use]
    pub fn with_kick(mut self, kick: &'a dyn CpuKick) -> Self {
        self.caches.set_kick(kick);
        self
    }

    /// How frees fill frames freed dirty in the `poison` debug mode (nothing in other builds).
    pub(crate) fn poison(&self) -> Poison<'a> {
        Poison::new(self.clearer)
    }

    /// The topology the machine was booted with.
    pub fn topology(&self) -> &Topology<'a> {
        &self.topo
    }

    /// A node's memory; `None` for a node outside the machine.
    pub fn node(&self, node: NodeId) -> Option<&Node> {
        self.nodes.get(node.index())
    }

    /// All nodes, by id.
    pub fn nodes(&self) -> Nodes<'_> {
        self.nodes
    }

    /// Where `node`'s own tables live (its [`Node`]: zones, numastat, zonelist hints; and its
    /// fallback order, staged and published): in its own memory, or, for a node without memory
    /// or without room, in the first node of its fallback order if that had room (Linux's
    /// `numa_mem_id`), else in the nearest node's that had room. `None` for a node outside the
    /// machine.
    pub fn node_tables(&self, node: NodeId) -> Option<TablePlace> {
        self.tables.nodes.get(node.index()).map(|t| t.own)
    }

    /// Where `cpu`'s tables live (its cache, the state arrays of the pageblocks it holds, its
    /// numastat lines): in its node's memory, or the nearest node's as for
    /// [`Machine::node_tables`]. `None` for a CPU not registered at boot.
    pub fn cpu_tables(&self, cpu: CpuId) -> Option<TablePlace> {
        self.tables.cpus.get(cpu.index()).copied()
    }

    /// Where the machine-wide tables live: the span index, every node's fallback length, the
    /// references to every node's and CPU's tables and these places. They come off the end of
    /// the first memory range (in the order given to [`Machine::boot`]) with room for them.
    pub fn machine_tables(&self) -> TablePlace {
        self.tables.machine
    }

    /// Nodes that currently have memory.
    pub fn memory_nodes(&self) -> NodeMask {
        self.layout.memory_nodes()
    }

    /// A count that changes whenever a hot-add or an offline publishes a new layout.
    pub(crate) fn layout_count(&self) -> u64 {
        self.layout.begin()
    }

    /// `mask` ∩ the nodes with memory, or `mask` itself if that is empty (an interleave's
    /// policy nodes, as Linux's `mpol_set_nodemask` builds them). Reads the layout's whole
    /// memory mask only when a node of `mask` has no memory.
    pub(crate) fn with_memory(&self, mask: NodeMask) -> NodeMask {
        if self.layout.all_have_memory(&mask) {
            return mask;
        }
        let w = mask.and(&self.layout.memory_nodes());
        if w.is_empty() { mask } else { w }
    }

    /// `true` if a request with `flags` fails before it takes anything: [`AllocFlags::ZERO`]
    /// on a machine without a clearer.
    pub(crate) fn refuses(&self, flags: AllocFlags) -> bool {
        flags.contains(AllocFlags::ZERO) && self.clearer.is_none()
    }

    /// Copies the fallback order of `node` into `out`; returns how many entries it wrote.
    pub fn fallback_order(&self, node: NodeId, out: &mut [NodeId]) -> usize {
        self.layout.copy_order(node, out)
    }

    /// Calls `f` with the boot-log line of each node, ascending
    /// (`Fallback order for Node 3: 3 2 1 0`).
    pub fn for_each_fallback_line(&self, mut f: impl FnMut(&dyn core::fmt::Display)) {
        let staged = self.layout.stage();
        for node in self.topo.node_ids() {
            f(&staged.display(node));
        }
    }

    /// The node owning `pfn`.
    pub fn node_of(&self, pfn: crate::addr::Pfn) -> Option<NodeId> {
        self.layout.find(pfn).map(|s| s.node)
    }

    /// numastat counters of `node`.
    pub fn numastat(&self, node: NodeId) -> Option<NumaStat> {
        let n = self.node(node)?;
        let mut s = n.stats().snapshot();
        for kind in crate::node::ZoneKind::ALL {
            s.add_counts(&n.zone(kind).events().0);
        }
        self.caches.events(node, &mut s);
        Some(s)
    }

    /// Bytes of the allocator's own memory: the tables carved at boot (machine-wide, per node,
    /// per CPU), and every zone's metadata (see
    /// [`Zone::metadata_bytes`](crate::Zone::metadata_bytes)).
    pub fn metadata_bytes(&self) -> u64 {
        self.tables.frames() * crate::addr::PAGE_SIZE
            + self
                .nodes
                .iter()
                .flat_map(|n| crate::node::ZoneKind::ALL.map(|k| n.zone(k).metadata_bytes()))
                .sum::<u64>()
    }

    /// Replaces the weighted-interleave weight table, atomically with respect to running
    /// allocations: each allocation sees the old table or the new one, never a mix.
    pub fn set_weights(&self, weights: Weights) {
        *self.weights.write() = weights;
    }

    /// A copy of the weighted-interleave weight table.
    pub fn weights(&self) -> Weights {
        self.weights.read().clone()
    }

    /// Runs `f` with the weight table held (shared) so it cannot change meanwhile.
    pub(crate) fn with_weights<R>(&self, f: impl FnOnce(&Weights) -> R) -> R {
        f(&self.weights.read())
    }
}

#[cfg(test)]
mod cpu_tests;
#[cfg(test)]
mod handle_tests;
#[cfg(test)]
mod tests;
