//! Mock machines for unit tests.
extern crate std;

use core::ptr::NonNull;
use std::boxed::Box;
use std::sync::Mutex as StdMutex;
use std::vec::Vec;

use crate::addr::{Pfn, PhysRange};
use crate::machine::{BootOptions, Machine, MemoryRange};
use crate::platform::PhysMemory;
use crate::topology::{NodeId, NodeInfo, Topology};

/// Physical memory that exists only where the allocator maps it: each mapped range gets a
/// fresh buffer, filled with garbage so that lazy metadata must never trust it.
#[derive(Debug, Default)]
pub(crate) struct SparseMem {
    regions: StdMutex<Vec<(PhysRange, Box<[u64]>)>>,
}

// SAFETY: every mapped range gets its own page-aligned-enough (8-byte; the allocator needs 8)
// buffer that lives as long as `self`, is never handed out twice, and is touched by nothing else.
unsafe impl PhysMemory for SparseMem {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let mut regions = self.regions.lock().ok()?;
        if regions.iter().any(|(r, _)| r.overlaps(&range)) {
            return None;
        }
        let words = (range.bytes() / 8) as usize;
        let mut buf = std::vec![0xa5a5_a5a5_a5a5_a5a5u64; words].into_boxed_slice();
        let ptr = NonNull::new(buf.as_mut_ptr().cast::<u8>());
        regions.push((range, buf));
        ptr
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
        let distances = (0..n * n)
            .map(|i| if i / n == i % n { 10 } else { 20 })
            .collect();
        let infos = (0..n)
            .map(|_| NodeInfo {
                has_cpus: true,
                has_memory: true,
                ..NodeInfo::default()
            })
            .collect();
        let ranges = (0..n as u64)
            .map(|i| MemoryRange {
                node: NodeId::new(i as usize),
                range: PhysRange::new(Pfn(base + i * frames), Pfn(base + (i + 1) * frames))
                    .unwrap(),
            })
            .collect();
        Spec {
            distances,
            infos,
            ranges,
        }
    }

    pub(crate) fn boot<'a>(&'a self, mem: &'a SparseMem) -> Machine<'a> {
        self.boot_with_cpus(mem, &[])
    }

    /// Boots with the given CPU → node table and watermarks off.
    pub(crate) fn boot_with_cpus<'a>(&'a self, mem: &'a SparseMem, cpus: &[NodeId]) -> Machine<'a> {
        let topo = Topology::new(&self.distances, &self.infos).unwrap();
        let opts = BootOptions {
            min_free_kbytes: Some(0),
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
            for &(nodes, frames, base) in &[
                (1usize, 1024u64, 0u64),
                (2, 1000, 0),
                (3, 700, 3),
                (4, 4096, 1 << 20),
                (2, 600, (1 << 20) - 300),
            ] {
                let spec = $crate::test_util::Spec::uniform(nodes, frames, base);
                let mem = $crate::test_util::SparseMem::default();
                let $m = spec.boot(&mem);
                $body
            }
        }
    };
}
pub(crate) use for_many_machines;
