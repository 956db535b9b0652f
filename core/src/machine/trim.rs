//! Giving metadata memory back: the pool slabs that merges left wholly free, unmapped and
//! returned to free memory, and the pool packed into fewer pool pageblocks so that more of
//! them empty.
#![deny(unsafe_code)]

use core::ptr::NonNull;

use super::Machine;
use crate::addr::PhysRange;
use crate::meta::Pool;
use crate::node::{Zone, ZoneKind};
use crate::platform::Mapped;

/// Retired slabs one round hands to the platform between two holds of the zone's lock.
const BATCH: usize = 16;

impl Machine<'_> {
    /// Gives back the metadata memory the zones no longer need: the slabs of their metadata
    /// pools that frees and merges left wholly free (beyond what each pool keeps for its next
    /// growth), and with them every pool pageblock no slab uses any more. It packs each pool
    /// first: the planes and arrays still in use in the emptiest pool pageblock move into the
    /// others (into slabs carved and mapped there if no free one has room), pageblock after
    /// pageblock, while the others have room for them. Each slab is unmapped (or mapped)
    /// through [`PhysMemory`](crate::PhysMemory) with no lock held. Returns the bytes of
    /// metadata given back.
    ///
    /// The platform calls it when it likes: after tearing a guest down, or when memory runs
    /// short (an allocation never calls it: it holds each zone's lock for rounds of a walk of
    /// the pool pageblocks, the pool's slabs in use and the zone's sections).
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
        // A first move into the room the pool has; after it, as after every round, a round
        // that retires nothing means what still holds the emptiest pool pageblock found no
        // room, and `room_to_empty` makes some.
        zone.release_metadata(core::iter::empty());
        loop {
            let n = zone.retire_metadata(&mut batch);
            if n == 0 {
                if !self.room_to_empty(zone) {
                    return;
                }
                continue;
            }
            for (range, ptr) in batch[..n].iter().flatten() {
                self.mem.unmap(*range, *ptr);
            }
            zone.release_metadata(batch[..n].iter().flatten().map(|(r, _)| *r));
        }
    }

    /// Maps a slab [`Zone::slab_to_empty`] carves, with no lock held, and adds it for what
    /// keeps the zone's emptiest pool pageblock to move into; `false` if no slab is needed or
    /// none can be had.
    fn room_to_empty(&self, zone: &Zone) -> bool {
        let Some((what, pfn)) = zone.slab_to_empty() else {
            return false;
        };
        let frames = Pool::slab_frames(what).next_power_of_two();
        match Mapped::frames(self.mem, pfn, frames) {
            Some(slab) => {
                zone.add_slab_to_empty(what, slab);
                true
            }
            None => {
                zone.unalloc_slab(what, pfn);
                false
            }
        }
    }
}
