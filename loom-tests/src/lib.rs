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

/// Physical memory that exists only where the allocator maps it.
#[derive(Debug, Default)]
pub struct SparseMem {
    regions: Mutex<Vec<(PhysRange, Box<[u64]>)>>,
}

// SAFETY: each mapped range gets its own 8-byte-aligned buffer that lives as long as `self`,
// overlapping requests are refused, and nothing else touches the buffers.
unsafe impl PhysMemory for SparseMem {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let mut regions = self.regions.lock().ok()?;
        if regions.iter().any(|(r, _)| r.overlaps(&range)) {
            return None;
        }
        let buf = vec![0x5a5a_5a5a_5a5a_5a5au64; (range.bytes() / 8) as usize].into_boxed_slice();
        regions.push((range, buf));
        // Take the pointer only once the box has reached its final owner: moving a Box
        // asserts uniqueness and would invalidate a pointer taken before the move.
        let stored = regions.last_mut()?;
        NonNull::new(stored.1.as_mut_ptr().cast::<u8>())
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
