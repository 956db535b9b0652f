//! The zonelist walk every allocation takes: the preferred node's fallback order (or the node
//! alone with THISNODE), restricted to a filter, low watermark first, then min, then with
//! RESERVE below min.
#![deny(unsafe_code)]

use super::layout::Layout;
use super::{AllocFlags, Machine};
use crate::addr::{Order, Pfn};
use crate::buddy::NoBlock;
use crate::buddy::{Got, Hosting};
use crate::meta::{Class, Pool, Short};
use crate::node::{Level, Mark, Zone, ZoneKind, count_foreign};
use crate::percpu::CpuId;
use crate::platform::Mapped;
use crate::stats::OwnEvents;
use crate::topology::{NodeId, NodeMask};

/// One allocation request: who asks, which node it prefers, and what it may use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'f> {
    /// The node of the asking CPU (decides `local_node`/`other_node`).
    pub(crate) cpu_node: NodeId,
    /// The node whose zonelist the walk follows.
    pub(crate) preferred: NodeId,
    pub(crate) order: Order,
    pub(crate) flags: AllocFlags,
    /// Only nodes in this set (a bind policy's mask).
    pub(crate) filter: Option<&'f NodeMask>,
    /// An interleave picked `preferred` (counts `interleave_hit`).
    pub(crate) interleave: bool,
    /// The CPU whose handle asks, if one does: a failing walk does not kick it (see
    /// [`CpuKick`](crate::CpuKick)), as the handle honours its own request.
    pub(crate) handle: Option<CpuId>,
}

impl<'f> Request<'f> {
    /// A request preferring `preferred` on behalf of a CPU of `cpu_node`.
    pub(crate) fn new(
        cpu_node: NodeId,
        preferred: NodeId,
        order: Order,
        flags: AllocFlags,
    ) -> Self {
        Self {
            cpu_node,
            preferred,
            order,
            flags,
            filter: None,
            interleave: false,
            handle: None,
        }
    }

    /// The same request restricted to `filter`.
    pub(crate) fn within(self, filter: &'f NodeMask) -> Self {
        Self {
            filter: Some(filter),
            ..self
        }
    }

    /// The same request on behalf of an interleave.
    pub(crate) fn interleaved(self) -> Self {
        Self {
            interleave: true,
            ..self
        }
    }

    fn allows(&self, node: NodeId) -> bool {
        self.filter.is_none_or(|f| f.contains(node))
    }

    /// The numastat events an allocation for the request makes on `got`, the node it landed
    /// on (its zone counts them under its lock), where `counted` is the request's preferred
    /// node for numastat ([`Machine::counted`]).
    pub(crate) fn events(&self, got: NodeId, counted: NodeId) -> OwnEvents {
        OwnEvents::of(
            self.cpu_node,
            counted,
            got,
            self.interleave && got == self.preferred,
        )
    }

    /// The lifetime class the request's pageblocks serve.
    pub(crate) fn class(&self) -> Class {
        if self.flags.contains(AllocFlags::SHORT_LIVED) {
            Class::Short
        } else {
            Class::Long
        }
    }
}

/// The watermarks the passes of a walk keep, in order. A request that may use `Normal` (any
/// without DMA32) also leaves each `Dma32` zone its protection.
pub(crate) fn marks(flags: AllocFlags) -> &'static [Mark] {
    const fn passes(highest: ZoneKind) -> [Mark; 3] {
        [
            Mark::new(Level::Low, highest),
            Mark::new(Level::Min, highest),
            Mark::new(Level::Reserve, highest),
        ]
    }
    static MARKS: [[Mark; 3]; 2] = [passes(ZoneKind::Normal), passes(ZoneKind::Dma32)];
    let passes = &MARKS[usize::from(flags.contains(AllocFlags::DMA32))];
    if flags.contains(AllocFlags::RESERVE) {
        passes
    } else {
        &passes[..2]
    }
}

/// `true` if a pass keeping `mark` may use `node` for `req`: a node of its filter, or any node
/// in the pass without watermarks, as Linux's slow path drops the policy's nodemask once an
/// allocation may use the reserves ("memory policies can be ignored").
fn allowed(req: &Request<'_>, mark: Mark, node: NodeId) -> bool {
    mark.level == Level::Reserve || req.allows(node)
}

/// `true` for a walk the preferred node's hints serve: a filter, THISNODE or DMA32 changes the
/// list.
fn plain(req: &Request<'_>) -> bool {
    req.filter.is_none()
        && !req
            .flags
            .intersects(AllocFlags::THISNODE | AllocFlags::DMA32)
}

/// The zones a walk tries on each node, highest first.
pub(crate) fn zones(flags: AllocFlags) -> &'static [ZoneKind] {
    if flags.contains(AllocFlags::DMA32) {
        &[ZoneKind::Dma32]
    } else {
        &[ZoneKind::Normal, ZoneKind::Dma32]
    }
}

impl<'a> Machine<'a> {
    /// The node numastat takes as `req`'s preferred one for an allocation that landed on
    /// `got`: the node of the first zone the walk may use (in the request's filter, with
    /// memory in a zone its flags allow), as Linux's `finalise_ac()` sets the preferred zone
    /// (`first_zones_zonelist(zonelist, highest_zoneidx, nodemask)`, "used for statistics")
    /// that `zone_statistics()` compares with. Landing on `req.preferred` means it is that
    /// node (a node with memory heads its own list), so only a landing elsewhere reads the
    /// layout.
    /// `first` keeps the node found for the request's first landing elsewhere, so a walk
    /// looks for it once. A landing in the pass without watermarks (`level` is
    /// [`Level::Reserve`]) of a request with a filter takes the first node of the whole list,
    /// as Linux's slow path resets `ac->nodemask` and recomputes `ac->preferred_zoneref`
    /// once an allocation may ignore the watermarks.
    #[inline]
    pub(crate) fn counted(
        &self,
        req: &Request<'_>,
        level: Level,
        got: NodeId,
        first: &mut Option<NodeId>,
    ) -> NodeId {
        if got == req.preferred {
            got
        } else if level == Level::Reserve && req.filter.is_some() {
            self.first_usable(&Request {
                filter: None,
                ..*req
            })
        } else {
            *first.get_or_insert_with(|| self.first_usable(req))
        }
    }

    /// The first node of `req`'s list it may use (see [`Machine::counted`]).
    #[cold]
    #[inline(never)]
    pub(crate) fn first_usable(&self, req: &Request<'_>) -> NodeId {
        let usable = |node: NodeId| {
            req.allows(node)
                && self
                    .nodes
                    .get(node.index())
                    .is_some_and(|n| zones(req.flags).iter().any(|&k| n.zone(k).has_memory()))
        };
        // A node it may use that has memory heads its own list.
        if usable(req.preferred) {
            return req.preferred;
        }
        let list = self
            .layout
            .list(req.preferred, req.flags.contains(AllocFlags::THISNODE));
        (0..list.len())
            .filter_map(|i| list.get(i))
            .find(|&node| usable(node))
            .unwrap_or(req.preferred)
    }

    /// Allocates a block of `order`, preferring `node`, on behalf of a CPU of `node`.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc(&self, node: NodeId, order: Order, flags: AllocFlags) -> Option<Pfn> {
        self.walk(&Request::new(node, node, order, flags))
    }

    /// Allocates a block of `order` preferring `preferred`, on behalf of a CPU of `cpu_node`
    /// (which decides the `local_node`/`other_node` counters).
    ///
    /// Walks the preferred node's zonelist twice: keeping the low watermark, then the min
    /// watermark; [`AllocFlags::RESERVE`] may use what is left below min.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc_from(
        &self,
        cpu_node: NodeId,
        preferred: NodeId,
        order: Order,
        flags: AllocFlags,
    ) -> Option<Pfn> {
        self.walk(&Request::new(cpu_node, preferred, order, flags))
    }

    /// One block for `req` straight from the zones, counted in the node's numastat, and
    /// cleared (after the zone's lock is dropped) if the request asks for zeroed memory.
    pub(crate) fn walk(&self, req: &Request<'_>) -> Option<Pfn> {
        let zero = req.flags.contains(AllocFlags::ZERO);
        if zero && self.clearer.is_none() {
            return None;
        }
        let mut first = None;
        // The preferred node of the last try: the one that succeeded.
        let mut counted = req.preferred;
        let (got, node) = self.walk_with(req, |node, zone, mark| {
            counted = self.counted(req, mark.level, node, &mut first);
            zone.alloc(
                req.order,
                mark,
                req.class(),
                zero,
                Some(req.events(node, counted)),
            )
        })?;
        count_foreign(self.nodes, counted, node, 1);
        Some(self.zeroed(req.flags, req.order.frames(), got))
    }

    /// Grows `zone`'s metadata pool by slabs of `what` (taking their frames from the zone and
    /// mapping them with no lock held) until it is above its reserve. `true` if it is then,
    /// whoever grew it: another CPU may have grown it meanwhile, and its caller should try
    /// again rather than fail.
    pub(super) fn grow(&self, zone: &Zone, what: Short) -> bool {
        while zone.pool_low(what) {
            let frames = Pool::slab_frames(what).next_power_of_two();
            let pfn = match zone.alloc_slab(what) {
                Ok(Some(pfn)) => pfn,
                // Another CPU grew the pool meanwhile.
                Ok(None) => continue,
                // A new pool pageblock needs a section split, which needs an array first.
                Err(NoBlock::Meta(Short::Arrays)) if what != Short::Arrays => {
                    if !self.grow(zone, Short::Arrays) {
                        return !zone.pool_low(what);
                    }
                    continue;
                }
                // No split section has room for a slab: split a free one with an array of its
                // own first frames (that section can never be whole again).
                Err(_) if what == Short::Arrays => match zone.section_for_array() {
                    Hosting::Wait => {
                        crate::sync::spin_loop();
                        continue;
                    }
                    Hosting::Nothing => return !zone.pool_low(what),
                    Hosting::Section(base) => {
                        if !self.host_section(zone, base, frames) {
                            return !zone.pool_low(what);
                        }
                        continue;
                    }
                },
                Err(_) => return !zone.pool_low(what),
            };
            let Some(mapped) = Mapped::frames(self.mem, pfn, frames) else {
                // The platform cannot map it: give the frames back and stop.
                zone.unalloc_slab(what, pfn);
                return !zone.pool_low(what);
            };
            zone.add_slab(what, mapped);
        }
        true
    }

    /// Splits a free section of `zone` with an array in its own first `frames` frames.
    fn host_section(&self, zone: &Zone, base: Pfn, frames: u64) -> bool {
        match Mapped::frames(self.mem, base, frames) {
            Some(slab) => {
                zone.host_section(base, slab);
                true
            }
            None => {
                // Untouched since it was free: nothing to fill.
                let _ = zone.free(
                    base,
                    Order::MAX,
                    &self.caches,
                    true,
                    crate::platform::Poison::default(),
                );
                zone.end_growth();
                false
            }
        }
    }

    /// Runs `take` on `zone`, growing the zone's metadata pool and trying again while the zone
    /// refuses for lack of it.
    fn take_growing<T>(
        &self,
        zone: &Zone,
        mut take: impl FnMut() -> Result<T, NoBlock>,
    ) -> Option<T> {
        loop {
            match take() {
                Ok(pfn) => return Some(pfn),
                Err(NoBlock::Meta(what)) if self.grow(zone, what) => {}
                Err(_) => return None,
            }
        }
    }

    /// The walk shared by every single-block allocation; `take` tries one zone. The first pass
    /// keeps the low watermark and starts past the hinted prefix, then retries that prefix; a
    /// second keeps min, and with RESERVE a third goes below it. If everything fails while a
    /// hot-add published new memory, the walk runs again; if it fails while per-CPU caches hold
    /// frames this walk could use, they are drained and the walk runs once more, so cached
    /// frames never make an allocation fail.
    pub(crate) fn walk_with<T>(
        &self,
        req: &Request<'_>,
        mut take: impl FnMut(NodeId, &Zone, Mark) -> Result<T, NoBlock>,
    ) -> Option<(T, NodeId)> {
        if !self.topo.contains(req.preferred) {
            return None;
        }
        let mut seq = self.layout.begin();
        let mut tried = match self.first_try(req, &mut take) {
            Ok(got) => return Some(got),
            Err(tried) => tried,
        };
        if tried.is_some() && plain(req) {
            // Below the low watermark it would fail again: the walk alone tries it from now.
            self.nodes[req.preferred.index()]
                .hint(req.order)
                .first_failed(Layout::generation(seq));
        }
        let mut visited = NodeMask::EMPTY;
        loop {
            if let Some(got) = self.walk_once(req, seq, &mut take, &mut visited, tried) {
                return Some(got);
            }
            if !self.layout.changed(seq) {
                break;
            }
            seq = self.layout.begin();
            tried = None;
        }
        let kinds = zones(req.flags);
        self.caches.under_pressure(
            self.nodes,
            |node, kind| visited.contains(node) && kinds.contains(&kind),
            req.handle,
            || loop {
                // A publication during this walk may have torn the list it read: read again.
                let seq = self.layout.begin();
                let got = self.walk_once(req, seq, &mut take, &mut NodeMask::default(), None);
                if got.is_some() || !self.layout.changed(seq) {
                    return got;
                }
            },
        )
    }

    /// The first try of [`Machine::walk_once`] on its own, when no hint moves it: the first
    /// zone with memory of the list's first node, keeping the low watermark. Most allocations
    /// end there. `Err` with the kind of the zone it tried (`None` if it tried none), which
    /// the walk's first pass then passes over.
    fn first_try<T>(
        &self,
        req: &Request<'_>,
        take: &mut impl FnMut(NodeId, &Zone, Mark) -> Result<T, NoBlock>,
    ) -> Result<(T, NodeId), Option<ZoneKind>> {
        let node = self
            .layout
            .list(req.preferred, req.flags.contains(AllocFlags::THISNODE))
            .get(0)
            .ok_or(None)?;
        // As in `walk_once`: a hint serves plain walks only, and one in force starts elsewhere.
        if !req.allows(node)
            || plain(req) && !self.nodes[req.preferred.index()].hint(req.order).idle()
        {
            return Err(None);
        }
        let zone = zones(req.flags)
            .iter()
            .map(|&kind| self.nodes[node.index()].zone(kind))
            .find(|zone| zone.has_memory())
            .ok_or(None)?;
        let low = marks(req.flags)[0];
        match self.take_growing(zone, || take(node, zone, low)) {
            Some(got) => Ok((got, node)),
            None => Err(Some(zone.kind())),
        }
    }

    /// One walk over the layout published as `seq`; `visited` collects the nodes it tried.
    /// `tried` names the zone of the list's first node that [`Machine::first_try`] tried
    /// over the same layout: the first pass does not try it again.
    fn walk_once<T>(
        &self,
        req: &Request<'_>,
        seq: u64,
        take: &mut impl FnMut(NodeId, &Zone, Mark) -> Result<T, NoBlock>,
        visited: &mut NodeMask,
        mut tried: Option<ZoneKind>,
    ) -> Option<(T, NodeId)> {
        let list = self
            .layout
            .list(req.preferred, req.flags.contains(AllocFlags::THISNODE));
        let hint = plain(req).then(|| self.nodes[req.preferred.index()].hint(req.order));
        let generation = Layout::generation(seq);
        let start = hint.map_or(0, |h| h.begin(generation)).min(list.len());
        for &mark in marks(req.flags) {
            // The first pass starts past the hinted prefix, then retries that prefix; later
            // passes walk everything.
            let first = mark.level == Level::Low;
            let skip = if first { start } else { 0 };
            for i in (skip..list.len()).chain(0..skip) {
                let Some(node) = list.get(i) else {
                    continue;
                };
                if !allowed(req, mark, node) {
                    continue;
                }
                visited.insert(node);
                // A zone of this node with memory that could not serve (or that `tried` names).
                let mut passed = false;
                for &kind in zones(req.flags) {
                    let zone = self.nodes[node.index()].zone(kind);
                    // A zone without memory needs no lock to know it cannot serve.
                    if !zone.has_memory() {
                        continue;
                    }
                    if i == 0 && first && tried.take_if(|k| *k == kind).is_some() {
                        passed = true;
                        continue;
                    }
                    if let Some(pfn) = self.take_growing(zone, || take(node, zone, mark)) {
                        // A walk from entry 0 served there by a zone after the first leaves
                        // the hint as it is: a first try's mark stays while that zone is short.
                        if let (Some(h), true) = (hint, first)
                            && !(i == 0 && start == 0 && passed)
                        {
                            h.record(generation, start, i);
                        }
                        return Some((pfn, node));
                    }
                    passed = true;
                }
            }
        }
        None
    }

    /// Fills `out` with order-0 frames preferring `node`, walking its zonelist and taking each
    /// zone's lock once per pass. Returns how many frames it placed (short only when memory
    /// runs out).
    #[must_use = "the frames placed in `out` must be freed"]
    pub fn alloc_bulk(&self, node: NodeId, flags: AllocFlags, out: &mut [Pfn]) -> usize {
        self.bulk_walk(&Request::new(node, node, Order::ZERO, flags), out)
    }

    /// [`Machine::alloc_bulk`] on behalf of a CPU of `cpu_node`.
    #[must_use = "the frames placed in `out` must be freed"]
    pub fn alloc_bulk_from(
        &self,
        cpu_node: NodeId,
        node: NodeId,
        flags: AllocFlags,
        out: &mut [Pfn],
    ) -> usize {
        self.bulk_walk(&Request::new(cpu_node, node, Order::ZERO, flags), out)
    }

    /// One node bulk: the walk of [`Machine::walk`] for order-0 frames, one zone lock per zone
    /// and pass. A short bulk walks again after a hot-add and after draining the caches it
    /// could use, as the single walk does.
    pub(crate) fn bulk_walk(&self, req: &Request<'_>, out: &mut [Pfn]) -> usize {
        if !self.topo.contains(req.preferred)
            || (req.flags.contains(AllocFlags::ZERO) && self.clearer.is_none())
        {
            return 0;
        }
        let mut visited = NodeMask::EMPTY;
        let mut done = 0;
        loop {
            let seq = self.layout.begin();
            done += self.bulk_once(req, &mut out[done..], &mut visited);
            if done == out.len() || !self.layout.changed(seq) {
                break;
            }
        }
        if done < out.len() {
            let kinds = zones(req.flags);
            done += self.caches.under_pressure(
                self.nodes,
                |node, kind| visited.contains(node) && kinds.contains(&kind),
                None,
                || {
                    let mut got = 0;
                    loop {
                        // As the single walk's retry: a torn list is read again.
                        let seq = self.layout.begin();
                        got +=
                            self.bulk_once(req, &mut out[done + got..], &mut NodeMask::default());
                        if done + got == out.len() || !self.layout.changed(seq) {
                            return got;
                        }
                    }
                },
            );
        }
        done
    }

    fn bulk_once(&self, req: &Request<'_>, out: &mut [Pfn], visited: &mut NodeMask) -> usize {
        let list = self
            .layout
            .list(req.preferred, req.flags.contains(AllocFlags::THISNODE));
        let mut done = 0;
        let mut first = None;
        for &mark in marks(req.flags) {
            for node in (0..list.len()).filter_map(|i| list.get(i)) {
                if !allowed(req, mark, node) {
                    continue;
                }
                visited.insert(node);
                for &kind in zones(req.flags) {
                    if done == out.len() {
                        return done;
                    }
                    let zone = self.nodes[node.index()].zone(kind);
                    if !zone.has_memory() {
                        continue;
                    }
                    loop {
                        // The poison mode checks clean and dirty frames against different
                        // bytes: it needs them told apart.
                        let split =
                            req.flags.contains(AllocFlags::ZERO) || cfg!(feature = "poison");
                        let counted = self.counted(req, mark.level, node, &mut first);
                        let (got, dirty, why) = zone.alloc_bulk(
                            &mut out[done..],
                            mark,
                            req.class(),
                            split,
                            req.events(node, counted),
                        );
                        count_foreign(self.nodes, counted, node, got as u64);
                        // The zone's lock is dropped: clear the dirty frames it placed last (and
                        // in the poison mode check every frame first).
                        let clean = got - dirty;
                        let from = if cfg!(feature = "poison") { 0 } else { clean };
                        for (i, &pfn) in out[done..done + got].iter().enumerate().skip(from) {
                            self.zeroed(req.flags, 1, Got::one(pfn, i >= clean));
                        }
                        done += got;
                        match why {
                            Some(NoBlock::Meta(what)) if self.grow(zone, what) => {}
                            _ => break,
                        }
                    }
                }
            }
        }
        done
    }
}
