//! Giving metadata memory back: the pool slabs that merges left wholly free, unmapped and
//! returned to free memory.
#![deny(unsafe_code)]

use core::ptr::NonNull;

use super::Machine;
use crate::addr::PhysRange;
use crate::node::{Zone, ZoneKind};

/// Retired slabs one round hands to the platform between two holds of the zone's lock.
const BATCH: usize = 16;

impl Machine<'_> {
    /// Gives back the metadata memory the zones no longer need: the slabs of their metadata
    /// pools that frees and merges left wholly free (beyond what each pool keeps for its next
    /// growth), and with them every pool pageblock no slab uses any more. Each slab is unmapped
    /// through [`PhysMemory::unmap`](crate::PhysMemory::unmap) (with no lock held) before its
    /// frames are free again. Returns the bytes of metadata given back.
    ///
    /// The platform calls it when it likes: after tearing a guest down, or when memory runs
    /// short (an allocation never calls it: its cost is a few lock holds per zone and a walk of
    /// each zone's pool pageblocks).
    pub fn trim_metadata(&self) -> u64 {
        let before = self.metadata_bytes();
        for node in self.nodes {
            for kind in ZoneKind::ALL {
                self.trim_zone(node.zone(kind));
            }
        }
        before.saturating_sub(self.metadata_bytes())
    }

    fn trim_zone(&self, zone: &Zone) {
        let mut batch: [Option<(PhysRange, NonNull<u8>)>; BATCH] = [None; BATCH];
        loop {
            let n = zone.retire_metadata(&mut batch);
            if n == 0 {
                return;
            }
            for (range, ptr) in batch[..n].iter().flatten() {
                self.mem.unmap(*range, *ptr);
            }
            zone.release_metadata(batch[..n].iter().flatten().map(|(r, _)| *r));
        }
    }
}
