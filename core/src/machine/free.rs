//! Returning blocks: single frees and all-or-nothing bulk frees.
#![deny(unsafe_code)]

use super::Machine;
use super::layout::SpanRef;
use crate::addr::{Order, Pfn};
use crate::error::{BulkFreeError, FreeError};
use crate::node::{Zone, ZoneFamily, ZoneSet, zone_index};
use crate::percpu::LastSpan;
use crate::sync::MULTI_MAX;

impl<'a> Machine<'a> {
    /// The zone of a span.
    pub(super) fn zone_of(&self, s: &SpanRef) -> &Zone {
        self.nodes[s.node.index()].zone(s.zone)
    }

    /// Where `pfn` lives, for a per-CPU free that missed its last span. Takes no lock.
    pub(super) fn locate(&self, pfn: Pfn) -> Option<LastSpan> {
        let s = self.layout.find(pfn)?;
        Some(LastSpan {
            range: s.range,
            node: s.node,
            zone: s.zone,
        })
    }

    /// Frees a block allocated with `order`.
    ///
    /// # Errors
    /// A [`FreeError`] for a foreign or misaligned frame, a double free, a wrong order, or a
    /// huge-page-pool page; the state is then unchanged. Detected in O(1): from the block's
    /// pageblock header, and below 2 MiB a bounded scan of its pageblock's planes.
    pub fn free(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let s = self.layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        self.zone_of(&s)
            .free(pfn, order, &self.caches, true, self.poison())
    }

    /// [`Machine::free`] of a block the caller cleared: every byte of it reads as zero (and a
    /// reader bypassing the caches sees that too). Its frames go back clean, so a zeroed
    /// allocation can take them without clearing them again. The allocator cannot check the
    /// promise: a block freed clean that is not is handed out as zeroed.
    ///
    /// # Errors
    /// As [`Machine::free`]; the state is then unchanged.
    pub fn free_clean(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let s = self.layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        self.zone_of(&s)
            .free(pfn, order, &self.caches, false, self.poison())
    }

    /// Frees order-0 frames. Either all are freed, or none is and the error names the first
    /// offending entry (a duplicate within the slice included).
    ///
    /// It holds the lock of every zone the frames belong to at once (taken in ascending
    /// (node, zone) order, each once), so nothing can change the frames between its checks and
    /// its frees.
    ///
    /// # Errors
    /// A [`BulkFreeError`] with the index and the reason; the state is then unchanged.
    pub fn free_bulk(&self, pfns: &[Pfn]) -> Result<(), BulkFreeError> {
        let mut wanted = [0u64; MULTI_MAX / 64];
        for (i, &pfn) in pfns.iter().enumerate() {
            let s = self.layout.find(pfn).ok_or(BulkFreeError {
                index: i,
                error: FreeError::Foreign { pfn },
            })?;
            let z = zone_index(s.node, s.zone);
            wanted[z / 64] |= 1 << (z % 64);
        }
        let family = ZoneFamily(self.nodes);
        let mut set = ZoneSet::new(&family);
        for (w, &bits) in wanted.iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                set.lock(w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
        // The zone of a frame found above (a span that went offline since is found nowhere,
        // and its frames are refused as foreign).
        let zone = |pfn: Pfn| {
            self.layout
                .find(pfn)
                .map_or(usize::MAX, |s| zone_index(s.node, s.zone))
        };
        for (i, &pfn) in pfns.iter().enumerate() {
            if let Err(e) = set.take(zone(pfn), pfn, &self.caches) {
                let error = match e {
                    FreeError::DoubleFree { .. } if pfns[..i].contains(&pfn) => {
                        FreeError::Duplicate { pfn }
                    }
                    e => e,
                };
                for &done in &pfns[..i] {
                    set.undo(zone(done), done, &self.caches);
                }
                return Err(BulkFreeError { index: i, error });
            }
        }
        // Every frame is claimed and none is free to anyone else yet (lent ones are claimed,
        // the others wait under their zone's lock): the `poison` debug mode fills them now,
        // after all the checks and before any can be taken again.
        let poison = self.poison();
        if poison.on() {
            for &pfn in pfns {
                poison.fill(pfn, 1);
            }
        }
        for &pfn in pfns {
            set.finish(zone(pfn), pfn, &self.caches);
        }
        Ok(())
    }
}
