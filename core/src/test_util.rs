//! Mock machines for unit tests, built on the numaframe-free half of the test kit
//! (`numaframe-testkit-base`): the core's tests cannot link the kit itself, whose `numaframe` would
//! be another crate than the one under test.
extern crate std;

use std::vec;
use std::vec::Vec;

use numaframe_testkit_base::{RawMemory, back_to_back, uniform_distances};

use crate::addr::{Pfn, PhysRange};
use crate::machine::{BootOptions, Machine, MemoryRange};
use crate::topology::{NodeId, NodeInfo, Topology};

/// Node `i`: the tests' shorthand.
pub(crate) fn n(i: usize) -> NodeId {
    NodeId::new(i)
}

/// Physical memory that exists only where the allocator maps it: each mapped range gets a
/// fresh page-aligned buffer, filled with garbage so that lazy metadata must never trust it.
#[derive(Debug)]
pub(crate) struct SparseMem(RawMemory);

numaframe_testkit_base::impl_phys_memory!(crate, SparseMem, 0);

impl Default for SparseMem {
    fn default() -> Self {
        SparseMem(RawMemory::new(0xa5))
    }
}

/// A machine description owning its tables.
pub(crate) struct Spec {
    pub(crate) distances: Vec<u8>,
    pub(crate) infos: Vec<NodeInfo>,
    pub(crate) ranges: Vec<MemoryRange>,
}

impl Spec {
    /// `n` nodes of `frames` frames each, back to back from `base`, distance 10/20, all with CPUs.
    pub(crate) fn uniform(n: usize, frames: u64, base: u64) -> Spec {
        let info = NodeInfo {
            has_cpus: true,
            has_memory: true,
            ..NodeInfo::default()
        };
        let ranges = back_to_back(&vec![frames; n], base)
            .into_iter()
            .map(|s| MemoryRange {
                node: NodeId::new(s.node),
                range: PhysRange::new(Pfn::new(s.start), Pfn::new(s.end)).unwrap(),
            })
            .collect();
        Spec {
            distances: uniform_distances(n),
            infos: vec![info; n],
            ranges,
        }
    }

    pub(crate) fn boot<'a>(&'a self, mem: &'a SparseMem) -> Machine<'a> {
        self.boot_with_cpus(mem, &[])
    }

    /// Boots with the given CPU → node table, watermarks and `Dma32`'s protection off.
    pub(crate) fn boot_with_cpus<'a>(&'a self, mem: &'a SparseMem, cpus: &[NodeId]) -> Machine<'a> {
        let topo = Topology::new(&self.distances, &self.infos).unwrap();
        let opts = BootOptions {
            min_free_kbytes: Some(0),
            lowmem_reserve_ratio: 0,
            cpus,
            ..BootOptions::default()
        };
        Machine::boot(topo, mem, &self.ranges, opts).unwrap()
    }
}

/// Runs a test body over several machine shapes (talc's `for_many_talc_configurations!`):
/// node counts, node sizes that are and are not powers of two, and unaligned bases.
macro_rules! for_many_machines {
    ($name:ident, |$m:ident| $body:block) => {
        #[test]
        fn $name() {
            // Miri runs the first shape only: it interprets ~5000x slower.
            let shapes = &[
                (1usize, 1024u64, 0u64),
                (2, 1000, 0),
                (3, 700, 3),
                (4, 4096, 1 << 20),
                (2, 600, (1 << 20) - 300),
            ];
            let shapes = if cfg!(miri) {
                &shapes[..1]
            } else {
                &shapes[..]
            };
            for &(nodes, frames, base) in shapes {
                let spec = $crate::test_util::Spec::uniform(nodes, frames, base);
                let mem = $crate::test_util::SparseMem::default();
                let $m = spec.boot(&mem);
                $body
            }
        }
    };
}
pub(crate) use for_many_machines;
