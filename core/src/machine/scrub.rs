//! Clearing frames: zeroed allocations, background scrubbing, and the dirty counters.
//!
//! Every clear goes through the platform's [`FrameClearer`](crate::FrameClearer) and runs with
//! no allocator lock held: the zone says under its lock which part of a block may be dirty,
//! and the clear happens once the lock is dropped, before the block reaches its caller.
#![deny(unsafe_code)]

use super::{AllocFlags, Machine};
use crate::addr::{Pfn, PhysRange};
use crate::buddy::Got;

impl<'a> Machine<'a> {
    /// Clears `frames` frames from `pfn` through the platform (nothing without a clearer).
    pub(super) fn clear_frames(&self, pfn: Pfn, frames: u64) {
        if let (Some(c), Some(range)) = (
            self.clearer,
            PhysRange::new(pfn, Pfn::new(pfn.get() + frames)),
        ) {
            c.clear(range);
        }
    }

    /// The block of `got`, its dirty part cleared if `flags` ask for zeroed memory.
    pub(super) fn zeroed(&self, flags: AllocFlags, got: Got) -> Pfn {
        if flags.contains(AllocFlags::ZERO)
            && let Some(r) = got.dirty
        {
            self.clear_frames(r.start(), r.frames());
        }
        got.pfn
    }
}
