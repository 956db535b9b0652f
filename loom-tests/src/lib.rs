//! Shared fixtures for the loom models in `tests/`. Build with `RUSTFLAGS="--cfg numaframe_loom"`
//! (the test command does): the core then takes its locks and atomics from loom, and each model
//! explores every interleaving of the real code, up to `LOOM_MAX_PREEMPTIONS`.
#![cfg(numaframe_loom)]

use std::ptr::NonNull;
use std::sync::Mutex;

use numaframe::{
    BootOptions, Machine, MemoryRange, NodeId, NodeInfo, PcpConfig, Pfn, PhysMemory, PhysRange,
    Topology,
};

/// Physical memory that exists only where the allocator maps it: each mapped range gets its
/// own page-aligned buffer (the promise of `PhysMemory`), filled with garbage.
#[derive(Debug, Default)]
pub struct SparseMem {
    regions: Mutex<Vec<(PhysRange, Page)>>,
}

/// A page-aligned heap buffer, freed on drop.
#[derive(Debug)]
struct Page {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: allocated in `SparseMem::map` with exactly this layout, freed once here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the buffer is owned by its `Page`; the pointer is only a handle to it.
unsafe impl Send for Page {}

// SAFETY: each mapped range gets its own 4 KiB-aligned buffer that lives as long as `self`,
// overlapping requests are refused, and nothing else touches the buffers.
unsafe impl PhysMemory for SparseMem {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let mut regions = self.regions.lock().ok()?;
        if range.is_empty() || regions.iter().any(|(r, _)| r.overlaps(&range)) {
            return None;
        }
        let bytes = usize::try_from(range.bytes()).ok()?;
        let layout = std::alloc::Layout::from_size_align(bytes, 4096).ok()?;
        // SAFETY: the layout has a non-zero size (the range is not empty).
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        // SAFETY: the buffer was just allocated with `bytes` bytes.
        unsafe { ptr.as_ptr().write_bytes(0x5a, bytes) };
        regions.push((range, Page { ptr, layout }));
        Some(ptr)
    }
}

/// The tables of a small machine: `nodes` nodes of `frames` frames each, back to back,
/// distance 10/20, all with CPUs. `memoryless` nodes get no memory.
#[derive(Debug)]
pub struct Tiny {
    /// Row-major distances.
    pub distances: Vec<u8>,
    /// Node states.
    pub infos: Vec<NodeInfo>,
    /// Memory ranges.
    pub ranges: Vec<MemoryRange>,
}

impl Tiny {
    /// The tables.
    pub fn new(nodes: usize, frames: u64, memoryless: &[usize]) -> Tiny {
        let distances = (0..nodes * nodes)
            .map(|i| if i / nodes == i % nodes { 10 } else { 20 })
            .collect();
        let infos = (0..nodes)
            .map(|i| NodeInfo {
                has_cpus: true,
                has_memory: !memoryless.contains(&i),
                ..NodeInfo::default()
            })
            .collect();
        let ranges = (0..nodes as u64)
            .filter(|i| !memoryless.contains(&(*i as usize)))
            .map(|i| MemoryRange {
                node: NodeId::new(i as usize),
                range: PhysRange::new(Pfn::new(i * frames), Pfn::new((i + 1) * frames))
                    .expect("ordered"),
            })
            .collect();
        Tiny {
            distances,
            infos,
            ranges,
        }
    }

    /// Boots it with watermarks off.
    pub fn boot<'a>(&'a self, mem: &'a SparseMem) -> Machine<'a> {
        self.boot_with_cpus(mem, &[], PcpConfig::default())
    }

    /// Boots it with watermarks off and CPUs on the given nodes.
    pub fn boot_with_cpus<'a>(
        &'a self,
        mem: &'a SparseMem,
        cpus: &[NodeId],
        pcp: PcpConfig,
    ) -> Machine<'a> {
        let topo = Topology::new(&self.distances, &self.infos).expect("valid topology");
        let opts = BootOptions {
            min_free_kbytes: Some(0),
            hotplug_slots: 2,
            cpus,
            pcp,
            ..BootOptions::default()
        };
        Machine::boot(topo, mem, &self.ranges, opts).expect("boot")
    }
}
