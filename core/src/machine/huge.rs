//! The huge-page pools: boot-time reservation, run-time allocation along the zonelist, and
//! returns.
#![deny(unsafe_code)]

use super::{Machine, Request};
use crate::addr::{HugeSize, Pfn};
use crate::buddy::NoBlock;
use crate::error::FreeError;
use crate::node::{HugeCounts, Level, ZoneKind, count_foreign};
use crate::topology::NodeId;

impl<'a> Machine<'a> {
    /// Reserves up to `count` huge pages of `size` on `node` alone (boot-time reservation),
    /// from its highest zone first, keeping each zone's min watermark (and `Dma32`'s
    /// protection); each zone's lock is taken once. Returns how many it reserved.
    pub fn reserve_huge(&self, node: NodeId, size: HugeSize, count: u64) -> u64 {
        let Some(n) = self.nodes.get(node.index()) else {
            return 0;
        };
        let mut got = 0;
        for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
            let zone = n.zone(kind);
            loop {
                let (moved, why) = zone.pool_grow(size.order(), count - got);
                got += moved;
                match why {
                    Some(NoBlock::Meta(what)) if got < count && self.grow(zone, what) => {}
                    _ => break,
                }
            }
        }
        got
    }

    /// Gives up to `count` free huge pages of `size` on `node` back to the buddy (shrinking
    /// the pool, like writing a smaller `nr_hugepages`). Returns how many it released.
    pub fn release_huge(&self, node: NodeId, size: HugeSize, count: u64) -> u64 {
        let Some(n) = self.nodes.get(node.index()) else {
            return 0;
        };
        let mut done = 0;
        for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
            done += n.zone(kind).pool_shrink(size.order(), count - done);
        }
        done
    }

    /// Takes a huge page of `size` from the pools for `req` (its order is ignored), walking the
    /// preferred node's zonelist (restricted to the request's filter) the way Linux dequeues
    /// huge pages.
    pub(crate) fn walk_pools(&self, req: &Request<'_>, size: HugeSize) -> Option<Pfn> {
        if !self.topo.contains(req.preferred)
            || (req.flags.contains(super::AllocFlags::ZERO) && self.clearer.is_none())
        {
            return None;
        }
        let mut first = None;
        loop {
            let seq = self.layout.begin();
            let list = self.layout.list(req.preferred, false);
            for node in (0..list.len()).filter_map(|i| list.get(i)) {
                if req.filter.is_some_and(|f| !f.contains(node))
                    || (req.flags.contains(super::AllocFlags::THISNODE) && node != req.preferred)
                {
                    continue;
                }
                for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
                    if req.flags.contains(super::AllocFlags::DMA32) && kind != ZoneKind::Dma32 {
                        continue;
                    }
                    let zone = self.nodes[node.index()].zone(kind);
                    // The pools keep no watermark, and their walk no pass without one.
                    let counted = self.counted(req, Level::Min, node, &mut first);
                    if let Some(got) = zone.pool_take(size.order(), req.events(node, counted)) {
                        count_foreign(self.nodes, counted, node, 1);
                        return Some(self.zeroed(req.flags, size.order().frames(), got));
                    }
                }
            }
            if !self.layout.changed(seq) {
                return None;
            }
        }
    }

    /// Takes a huge page of `size` from the pools, preferring `node`, on behalf of a CPU of
    /// `node`. `None` when every pool on its zonelist is empty.
    #[must_use = "dropping the page leaks it"]
    pub fn alloc_huge(&self, node: NodeId, size: HugeSize) -> Option<Pfn> {
        self.alloc_huge_with(node, size, super::AllocFlags::empty())
    }

    /// [`Machine::alloc_huge`] with `flags`: [`AllocFlags::ZERO`](super::AllocFlags::ZERO)
    /// returns a page that reads as zero (a page given back to its pool is dirty, and is
    /// cleared with no lock held); [`AllocFlags::THISNODE`](super::AllocFlags::THISNODE) keeps
    /// the walk to `node` (Linux's `dequeue_hugetlb_folio_nodemask` walks the `__GFP_THISNODE`
    /// zonelist) and [`AllocFlags::DMA32`](super::AllocFlags::DMA32) to the pools of `Dma32`
    /// zones (a page a 32-bit device reaches); the other flags do not apply to the pools.
    #[must_use = "dropping the page leaks it"]
    pub fn alloc_huge_with(
        &self,
        node: NodeId,
        size: HugeSize,
        flags: super::AllocFlags,
    ) -> Option<Pfn> {
        self.walk_pools(&Request::new(node, node, size.order(), flags), size)
    }

    /// Returns a huge page to its pool.
    ///
    /// # Errors
    /// A [`FreeError`] if `pfn` is not a huge page of `size` handed out from a pool (a small
    /// block, a page already in its pool, a foreign frame); the state is then unchanged.
    pub fn free_huge(&self, pfn: Pfn, size: HugeSize) -> Result<(), FreeError> {
        let s = self.layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        self.zone_of(&s).pool_put(pfn, size.order(), self.poison())
    }

    /// The page counts of `node`'s pool of `size`.
    pub fn huge_counts(&self, node: NodeId, size: HugeSize) -> HugeCounts {
        self.nodes
            .get(node.index())
            .map_or(HugeCounts::default(), |n| {
                ZoneKind::ALL.iter().fold(HugeCounts::default(), |c, k| {
                    let z = n.zone(*k).pool_counts(size.order());
                    HugeCounts {
                        total: c.total + z.total,
                        free: c.free + z.free,
                    }
                })
            })
    }
}
