//! Returning blocks: single frees and all-or-nothing bulk frees.
#![deny(unsafe_code)]

use super::Machine;
use super::layout::SpanRef;
use crate::addr::{Order, Pfn};
use crate::error::{BulkFreeError, FreeError};
use crate::node::Zone;
use crate::percpu::LastSpan;

impl<'a> Machine<'a> {
    /// The zone of a span.
    pub(super) fn zone_of(&self, s: &SpanRef) -> &Zone {
        self.nodes[s.node.index()].zone(s.zone)
    }

    /// Where `pfn` lives, for a per-CPU free that missed its last span. Takes no lock.
    pub(super) fn locate(&self, pfn: Pfn) -> Option<LastSpan> {
        let s = self.layout.find(pfn)?;
        let span = self.zone_of(&s).span_of(pfn)?;
        Some(LastSpan {
            range: s.range,
            node: s.node,
            zone: s.zone,
            span,
        })
    }

    /// Frees a block allocated with `order`.
    ///
    /// # Errors
    /// A [`FreeError`] for a foreign or misaligned frame, a double free, a wrong order, or a
    /// huge-page-pool page; the state is then unchanged. Detected in O(1) from one metadata entry.
    pub fn free(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let s = self.layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        self.zone_of(&s).free(pfn, order)
    }

    /// Frees order-0 frames. Either all are freed, or none is and the error names the first
    /// offending entry (a duplicate within the slice included).
    ///
    /// # Errors
    /// A [`BulkFreeError`] with the index and the reason; the state is then unchanged.
    pub fn free_bulk(&self, pfns: &[Pfn]) -> Result<(), BulkFreeError> {
        // Claim every frame first, so a bad entry can be refused before anything changes.
        for (i, &pfn) in pfns.iter().enumerate() {
            let claimed = self
                .layout
                .find(pfn)
                .ok_or(FreeError::Foreign { pfn })
                .and_then(|s| self.zone_of(&s).claim(pfn));
            if let Err(error) = claimed {
                for &done in &pfns[..i] {
                    if let Some(s) = self.layout.find(done) {
                        self.zone_of(&s).unclaim(done);
                    }
                }
                return Err(BulkFreeError { index: i, error });
            }
        }
        // Consecutive frames of one span are freed under one lock of their zone. Claimed frames
        // belong to the machine's spans, which never go away.
        let mut i = 0;
        while i < pfns.len() {
            let Some(s) = self.layout.find(pfns[i]) else {
                i += 1;
                continue;
            };
            let zone = self.zone_of(&s);
            zone.free_each(|| {
                let pfn = *pfns.get(i).filter(|p| s.range.contains(**p))?;
                i += 1;
                Some((zone.span_of(pfn)?, pfn))
            });
        }
        Ok(())
    }
}
