//! Free-page reporting: handing free memory back to a host (Linux's `page_reporting`,
//! virtio-balloon's free page reporting), at 2 MiB or more, never 4 KiB.
#![deny(unsafe_code)]

use super::Machine;
use crate::addr::{Order, PhysRange};
use crate::error::ReportError;
use crate::node::ZoneKind;
use crate::platform::InstallHook;
use crate::topology::NodeId;

/// The most blocks one batch of [`Machine::report`] holds (Linux's `PAGE_REPORTING_CAPACITY`).
/// The batch lives on the reporting CPU's stack.
pub const REPORT_CAPACITY: usize = 32;

/// What one [`Machine::report`] call handed over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Reported {
    /// Blocks the host took.
    pub blocks: u64,
    /// Their frames.
    pub frames: u64,
    /// Batches the callback took.
    pub batches: u64,
    /// The callback refused a batch, and the report stopped there.
    pub refused: bool,
}

impl<'a> Machine<'a> {
    /// The machine, trusting the host to give memory reported through [`Machine::report`] back
    /// zeroed: a reported block then counts clean, so a zeroed allocation does not clear it
    /// again. Only for a host that promises it: Linux's `MADV_DONTNEED` on private anonymous
    /// memory does; virtio-balloon's free page reporting does not (the device may keep a
    /// page's contents and still take the report). Without it a reported block keeps the dirty
    /// state it had, and a zeroed allocation clears it.
    #[must_use]
    pub fn with_zeroing_host(self) -> Self {
        for n in self.nodes {
            for kind in ZoneKind::ALL {
                n.zone(kind).set_reports_zeroed(true);
            }
        }
        self
    }

    /// The machine, running `hook` before memory taken back through [`Machine::report`] is
    /// used again (see [`InstallHook`] for exactly when). Without one, reported memory is
    /// handed out as it is, which suits a host that fills it again on first touch (Linux's
    /// `MADV_DONTNEED`, virtio-balloon's free page reporting).
    #[must_use]
    pub fn with_install(self, hook: &'static dyn InstallHook) -> Self {
        for n in self.nodes {
            for kind in ZoneKind::ALL {
                n.zone(kind).set_install(Some(hook));
            }
        }
        self
    }

    /// Reports the free memory of `node` to the host: hands `f` batches of at most `capacity`
    /// free blocks of at least `order` that were not reported since they last became free,
    /// and marks the blocks of every batch `f` takes (returns `true` for) as reported.
    ///
    /// `f` runs with no lock held, so it may be slow (a hypercall, `madvise`). Meanwhile the
    /// blocks of its batch are off the free lists, as Linux's reporting isolates them: no
    /// allocation takes them, and the zone's free count leaves them out until they come back
    /// (an allocation may fall back to another zone meanwhile). A block is taken only while the
    /// zone keeps its min watermark free. The blocks come back merged with their free buddies;
    /// a merged block is reported only if both halves were, so a block freed next to reported
    /// memory is reported again as a whole with it.
    ///
    /// A reported block is clean if the host gives its memory back zeroed
    /// ([`Machine::with_zeroing_host`]), and keeps its dirty state otherwise. Allocating from it
    /// clears the mark and runs the
    /// install hook ([`Machine::with_install`]); the parts of a reported block that stay free
    /// when a smaller block is cut from it stay reported. A batch `f` refuses comes back as it
    /// was, unreported, and the call stops there. Each zone of the node is walked once, Normal
    /// then Dma32; memory freed behind the walk waits for the next call. Per-CPU caches and
    /// huge-page pools are not reported (their memory is not free in the zones).
    ///
    /// # Errors
    /// [`ReportError::UnknownNode`] for a node outside the machine,
    /// [`ReportError::BadOrder`] for an order below 9 (2 MiB), and
    /// [`ReportError::BadCapacity`] for a capacity of 0 or above [`REPORT_CAPACITY`]; nothing
    /// is reported then.
    pub fn report(
        &self,
        node: NodeId,
        order: Order,
        capacity: usize,
        mut f: impl FnMut(&[PhysRange]) -> bool,
    ) -> Result<Reported, ReportError> {
        let n = self.node(node).ok_or(ReportError::UnknownNode { node })?;
        if order < Order::HUGE_2M {
            return Err(ReportError::BadOrder { order });
        }
        if capacity == 0 || capacity > REPORT_CAPACITY {
            return Err(ReportError::BadCapacity { capacity });
        }
        let mut batch = [PhysRange::default(); REPORT_CAPACITY];
        let mut done = Reported::default();
        for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
            let zone = n.zone(kind);
            let mut from = 0;
            loop {
                let (taken, next) = zone.report_take(order, from, &mut batch[..capacity]);
                if taken == 0 {
                    break;
                }
                let blocks = &batch[..taken];
                let ok = f(blocks);
                zone.report_put(blocks, ok);
                if !ok {
                    done.refused = true;
                    return Ok(done);
                }
                done.blocks += taken as u64;
                done.frames += blocks.iter().map(PhysRange::frames).sum::<u64>();
                done.batches += 1;
                from = next;
            }
        }
        Ok(done)
    }
}
