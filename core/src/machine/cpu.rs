//! The per-CPU entry points: allocations and frees through a CPU's cache, drains and tuning.
//! The caches themselves are [`Caches`](crate::percpu::Caches); this is where the walk uses
//! them.
#![deny(unsafe_code)]

use super::walk::zones;
use super::{AllocFlags, Machine, Request};
use crate::addr::{Order, Pfn};
use crate::buddy::Got;
use crate::error::FreeError;
use crate::node::ZoneKind;
use crate::percpu::{Asker, CacheAccess, CpuId, PcpConfig, Shared, Want};
use crate::topology::NodeId;

impl<'a> Machine<'a> {
    /// The CPU registered at boot with index `index`.
    pub fn cpu(&self, index: usize) -> Option<CpuId> {
        self.caches.cpu(index)
    }

    /// Number of CPUs registered at boot.
    pub fn cpu_count(&self) -> usize {
        self.caches.len()
    }

    /// The node of a CPU.
    pub fn cpu_node(&self, cpu: CpuId) -> Option<NodeId> {
        self.caches.node_of(cpu)
    }

    /// Replaces the cache tuning (clamped, see [`PcpConfig::clamped`]) and drains every cache:
    /// when it returns, every cache no [`CpuHandle`](crate::CpuHandle) holds follows the new
    /// tuning (with [`PcpConfig::OFF`], none holds a frame, and none will). A claimed CPU gets a
    /// request instead (and a kick if its cache holds a pageblock, see
    /// [`CpuKick`](crate::CpuKick)): it gives its pageblocks back and follows the new tuning
    /// from its handle's next operation, poll or drop, whichever comes first.
    pub fn set_pcp(&self, config: PcpConfig) {
        self.caches.set_tuning(config, self.nodes);
    }

    /// The cache tuning in force.
    pub fn pcp(&self) -> PcpConfig {
        self.caches.tuning()
    }

    /// Frames held in per-CPU caches (allocated as far as their zones know), leaving out the
    /// caches [`CpuHandle`](crate::CpuHandle)s hold.
    pub fn cached_pages(&self) -> u64 {
        self.caches.cached_pages()
    }

    /// Allocates a block of `order` preferring the CPU's node (the local policy), through the
    /// CPU's cache for order 0. `None` for an unknown CPU or when memory runs out.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc_cpu(&self, cpu: CpuId, order: Order, flags: AllocFlags) -> Option<Pfn> {
        let node = self.cpu_node(cpu)?;
        self.walk_cpu(cpu, &Request::new(node, node, order, flags))
    }

    /// The walk of [`Machine::walk`] for a CPU: order-0 requests go through the CPU's cache,
    /// others straight to the zones. `req.cpu_node` is replaced by the CPU's own node.
    pub(crate) fn walk_cpu(&self, cpu: CpuId, req: &Request<'_>) -> Option<Pfn> {
        let req = Request {
            cpu_node: self.cpu_node(cpu)?,
            ..*req
        };
        let mut cache = Shared {
            caches: &self.caches,
            cpu,
        };
        self.walk_cached(&mut cache, &req)
    }

    /// [`Machine::walk_cpu`] through `cache`, with `req.cpu_node` already the CPU's node.
    pub(crate) fn walk_cached(
        &self,
        cache: &mut impl CacheAccess,
        req: &Request<'_>,
    ) -> Option<Pfn> {
        if req.order != Order::ZERO {
            return self.walk(req);
        }
        let zero = req.flags.contains(AllocFlags::ZERO);
        if zero && self.clearer.is_none() {
            return None;
        }
        // Fast path: the first zone with memory of the preferred node has cached frames. The
        // walk would start there, so the layout is not read. (A zone loses its spans only to
        // offlining, which first takes their pageblocks back from every cache, so a stale "has
        // memory" only makes the pop find nothing.) With caching off it is skipped: the walk's
        // take pops a cached frame first anyway. A frame from there lands on the preferred
        // node, which is then also numastat's preferred node (`Machine::counted`).
        if !self.caches.off()
            && self.topo.contains(req.preferred)
            && req.filter.is_none_or(|f| f.contains(req.preferred))
        {
            let node = &self.nodes[req.preferred.index()];
            let asker = Asker {
                preferred: req.preferred,
                interleave: req.interleave,
            };
            if let Some(zone) = zones(req.flags)
                .iter()
                .map(|k| node.zone(*k))
                .find(|z| z.has_memory())
                && let Some((pfn, dirty)) = cache.pop(req.preferred, zone, req.class(), asker)
            {
                return Some(self.zeroed(req.flags, 1, Got::one(pfn, dirty)));
            }
        }
        // The walk may land elsewhere: numastat's preferred node is the first node of the list
        // the request may use.
        let counted = self.first_usable(req);
        let asker = Asker {
            preferred: counted,
            interleave: req.interleave && counted == req.preferred,
        };
        self.walk_with(req, |node, zone, mark| {
            let want = Want {
                node: &self.nodes[node.index()],
                kind: zone.kind(),
                mark,
                class: req.class(),
                asker,
            };
            cache.take(&want, self.nodes, zero)
        })
        .map(|(got, _)| self.zeroed(req.flags, 1, got))
    }

    /// Frees a block from a CPU: an order-0 frame of one of the pageblocks the CPU's cache
    /// holds is freed there without a zone lock; any other frame (every frame while caching is
    /// off or a handle holds the CPU) and every larger block go back under their zone's lock.
    ///
    /// # Errors
    /// [`FreeError::UnknownCpu`], or the errors of [`Machine::free`]; the state is then unchanged.
    pub fn free_cpu(&self, cpu: CpuId, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.free_cpu_as(cpu, pfn, order, true)
    }

    /// [`Machine::free_cpu`] of a block the caller cleared (see [`Machine::free_clean`]).
    ///
    /// # Errors
    /// As [`Machine::free_cpu`]; the state is then unchanged.
    pub fn free_cpu_clean(&self, cpu: CpuId, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.free_cpu_as(cpu, pfn, order, false)
    }

    fn free_cpu_as(
        &self,
        cpu: CpuId,
        pfn: Pfn,
        order: Order,
        dirty: bool,
    ) -> Result<(), FreeError> {
        if self.cpu_node(cpu).is_none() {
            return Err(FreeError::UnknownCpu {
                cpu: cpu.index() as u32,
            });
        }
        // With caching off, the zone's free does what the cache's would (a frame of a
        // pageblock a cache still holds goes to that cache's state), without the cache lock.
        if order != Order::ZERO || self.caches.off() {
            return self.free_uncached(pfn, order, dirty);
        }
        self.caches.free(
            cpu,
            pfn,
            self.nodes,
            |pfn| self.locate(pfn),
            dirty,
            self.poison(),
        )
    }

    /// [`Machine::free_cpu_as`] of a block no cache takes: kept out of line, so that the
    /// zone's free path inlined here does not cost the cached path its registers.
    #[inline(never)]
    fn free_uncached(&self, pfn: Pfn, order: Order, dirty: bool) -> Result<(), FreeError> {
        if dirty {
            self.free(pfn, order)
        } else {
            self.free_clean(pfn, order)
        }
    }

    /// Gives every frame in `cpu`'s cache back to its zone (CPU hotplug, or a remote drain).
    /// When a [`CpuHandle`](crate::CpuHandle) holds the cache, it posts a request instead (and
    /// kicks the CPU if its cache holds a pageblock, see [`CpuKick`](crate::CpuKick)), which the
    /// handle honours at its next operation, its [`poll`](crate::CpuHandle::poll) or when it
    /// drops.
    pub fn drain_cpu(&self, cpu: CpuId) {
        self.caches.drain_cpu(cpu, self.nodes, |_, _| true);
    }

    /// Drains every CPU's cache, then merges each zone's spare pageblock (the wholly free one
    /// it keeps split for the next small allocation) back into the buddy: afterwards free
    /// memory is as merged as it can be, but for the pageblocks of caches that
    /// [`CpuHandle`](crate::CpuHandle)s hold, which come back at each handle's next operation or
    /// drop (see [`Machine::drain_cpu`]).
    pub fn drain_all(&self) {
        for i in 0..self.caches.len() {
            if let Some(cpu) = self.caches.cpu(i) {
                self.drain_cpu(cpu);
            }
        }
        for node in self.nodes {
            for kind in ZoneKind::ALL {
                node.zone(kind).release_spares();
            }
        }
    }
}
