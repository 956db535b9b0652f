//! Mock machines for unit tests.
extern crate std;

use core::ptr::NonNull;
use std::alloc::{Layout, alloc, dealloc};
use std::sync::Mutex as StdMutex;
use std::vec::Vec;

use crate::addr::{Pfn, PhysRange};
use crate::machine::{BootOptions, Machine, MemoryRange};
use crate::platform::PhysMemory;
use crate::topology::{NodeId, NodeInfo, Topology};

/// Physical memory that exists only where the allocator maps it: each mapped range gets a
/// fresh page-aligned buffer, filled with garbage so that lazy metadata must never trust it.
#[derive(Debug, Default)]
pub(crate) struct SparseMem {
    regions: StdMutex<Vec<(PhysRange, NonNull<u8>, Layout)>>,
}

// SAFETY: every mapped range gets its own 4 KiB-aligned buffer that lives as long as `self`, is
// never handed out twice, and is touched by nothing else; the raw pointers are only handles.
unsafe impl PhysMemory for SparseMem {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let mut regions = self.regions.lock().ok()?;
        if range.is_empty() || regions.iter().any(|(r, _, _)| r.overlaps(&range)) {
            return None;
        }
        let layout = Layout::from_size_align(usize::try_from(range.bytes()).ok()?, 4096).ok()?;
        // SAFETY: the layout has a non-zero size (the range is not empty).
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        // SAFETY: the buffer was just allocated with `layout.size()` bytes.
        unsafe { ptr.as_ptr().write_bytes(0xa5, layout.size()) };
        regions.push((range, ptr, layout));
        Some(ptr)
    }
}

impl Drop for SparseMem {
    fn drop(&mut self) {
        for (_, ptr, layout) in self
            .regions
            .get_mut()
            .map(core::mem::take)
            .unwrap_or_default()
        {
            // SAFETY: allocated in `map` with exactly this layout, freed once here; the machine
            // borrowing this memory is gone (it borrows `self`).
            unsafe { dealloc(ptr.as_ptr(), layout) };
        }
    }
}

// SAFETY: the buffers are owned by this value and only reached through the pointers `map`
// returned; the list of them is behind a mutex.
unsafe impl Send for SparseMem {}
// SAFETY: as above.
unsafe impl Sync for SparseMem {}

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
                range: PhysRange::new(
                    Pfn::new(base + i * frames),
                    Pfn::new(base + (i + 1) * frames),
                )
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
            // Miri runs the first two shapes only: it interprets ~5000x slower.
            let shapes = &[
                (1usize, 1024u64, 0u64),
                (2, 1000, 0),
                (3, 700, 3),
                (4, 4096, 1 << 20),
                (2, 600, (1 << 20) - 300),
            ];
            let shapes = if cfg!(miri) {
                &shapes[..2]
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
