//! A CPU's exclusive handle on its cache: claimed once, then used through `&mut` with no cache
//! lock on its path, the way a kernel touches per-CPU data with preemption off.
//!
//! The handle holds the cache for as long as it lives ([`Owned`]): its allocations and frees
//! of order 0 pop from and push to the CPU's pageblocks with no lock and, on a free, the one
//! compare-and-swap of the frame's state byte that also decides a race with a remote free of
//! the same frame (an allocation is a plain store of that byte). Bulks take runs off the hot
//! pageblock's stack, and free frames of the CPU's own pageblocks under their zone's lock with
//! a plain store each. Remote drains of a claimed CPU become requests it honours before its
//! next operation, in [`CpuHandle::poll`] (which the platform's [`CpuKick`](crate::CpuKick)
//! asks an idle owner to call) or when it drops (see `percpu`).
//!
//! The order-0 hot paths are `#[inline]`, so that a caller in another crate runs them without a
//! call, and call nothing themselves, so that the compiler saves no registers for them: a pop
//! from the hot slot's stack, and a free into the hot slot that leaves it at most `high` frames
//! free. Everything else (a request to honour, a rescan, the walk, a slot to give back, a free
//! outside the hot slot or one refused) goes to one out-of-line function that starts over.
#![deny(unsafe_code)]

use super::{AllocFlags, Machine, Request};
use crate::addr::{Order, Pfn};
use crate::buddy::Got;
use crate::error::{BulkFreeError, ClaimError, FreeError};
use crate::percpu::{CpuId, Owned};

/// A CPU's cache, held exclusively: get one from [`Machine::claim_cpu`]. Dropping it gives the
/// CPU back (honouring any drain request posted meanwhile).
///
/// While it lives, [`Machine::alloc_cpu`] for its CPU bypasses the cache (straight to the
/// zones), [`Machine::free_cpu`] for its CPU frees as any other CPU would (under the zone lock),
/// and [`Machine::cached_pages`] and the invariant check leave its cache out. Numastat keeps
/// the events its cache counted before the claim; those it counts meanwhile arrive when it
/// drops.
#[derive(Debug)]
pub struct CpuHandle<'m, 'a> {
    machine: &'m Machine<'a>,
    own: Owned<'m, 'a>,
}

impl<'a> Machine<'a> {
    /// Claims `cpu`'s cache: one atomic, then the cache lock, held until the handle drops
    /// (it waits only while a remote drain or a call of the locked API holds the lock).
    ///
    /// # Errors
    /// [`ClaimError::UnknownCpu`], or [`ClaimError::Claimed`] while another handle of the CPU
    /// lives; nothing changes then.
    pub fn claim_cpu(&self, cpu: CpuId) -> Result<CpuHandle<'_, 'a>, ClaimError> {
        let own = self.caches.claim(cpu, self.nodes)?;
        Ok(CpuHandle { machine: self, own })
    }
}

impl CpuHandle<'_, '_> {
    /// The claimed CPU.
    pub fn cpu(&self) -> CpuId {
        self.own.cpu()
    }

    /// Free frames in the pageblocks the held cache holds (frees of their frames from other
    /// CPUs included): what [`Machine::cached_pages`] leaves out for this CPU while the handle
    /// lives. A drain request posted meanwhile gives them back at the handle's next operation.
    pub fn cached_pages(&self) -> u64 {
        self.own.cached_pages()
    }

    /// Honours a drain request posted to this CPU now, without an allocation or a free: if a
    /// drain asked for the cache's pageblocks (memory pressure elsewhere, `drain_cpu`,
    /// `drain_all`, `set_pcp`, an offline), gives every one back to its zone, and forgets a
    /// span that went offline. `true` if a drain had asked. One plain load when nothing
    /// waits.
    ///
    /// Every operation of the handle does this first; a CPU that idles with its handle alive
    /// calls it from its idle loop, or when the platform's [`CpuKick`](crate::CpuKick) asks,
    /// so that its cached frames do not stay out of reach meanwhile.
    pub fn poll(&mut self) -> bool {
        self.own.honour()
    }

    /// [`Machine::alloc_cpu`] through the held cache: a block of `order` preferring the CPU's
    /// node, from the cache for order 0. `None` when memory runs out.
    #[must_use = "dropping the frame leaks it"]
    #[inline]
    pub fn alloc(&mut self, order: Order, flags: AllocFlags) -> Option<Pfn> {
        // A frame needing zeroing takes the walk, which clears it.
        let cached = order == Order::ZERO && !flags.contains(AllocFlags::ZERO);
        if cached && let Some((pfn, dirty)) = self.own.pop_hot_now(flags.bits()) {
            return Some(popped(self.machine, flags, pfn, dirty));
        }
        self.alloc_out_of_line(cached, order, flags)
    }

    /// [`CpuHandle::alloc`] past its hot path: a request to honour or a hot slot to rescan
    /// first (if the request is `cached`), or the walk.
    #[inline(never)]
    fn alloc_out_of_line(&mut self, cached: bool, order: Order, flags: AllocFlags) -> Option<Pfn> {
        if cached && let Some((pfn, dirty)) = self.own.pop_hot(flags.bits()) {
            return Some(popped(self.machine, flags, pfn, dirty));
        }
        self.alloc_walk(order, flags)
    }

    /// [`CpuHandle::alloc`] through the walk: the hot slot had no frame for the request, or
    /// the request does not use the cache (a block above order 0, or a zeroed frame).
    #[inline(never)]
    fn alloc_walk(&mut self, order: Order, flags: AllocFlags) -> Option<Pfn> {
        // Every operation honours a drain request posted meanwhile, whether or not it uses
        // the cache.
        self.own.honour();
        if order != Order::ZERO || flags.contains(AllocFlags::ZERO) {
            self.own.ask_other();
        }
        let node = self.own.node();
        let req = Request {
            handle: Some(self.own.cpu()),
            ..Request::new(node, node, order, flags)
        };
        let mut got = self.machine.walk_cached(&mut self.own, &req);
        // A failing walk drains every cache before its last try, this CPU's by a request
        // (it is claimed) that kicks nobody. An order-0 walk honours it there, through the
        // cache; one above order 0 never looks at the cache, so it gives the frames back
        // here and tries again: they may merge into the block it wants.
        if self.own.honour() && got.is_none() && order != Order::ZERO {
            got = self.machine.walk_cached(&mut self.own, &req);
        }
        // Whatever the walks found, no request of its own stays waiting: it would pass for one
        // this CPU was kicked for, and the next drain would not wake it.
        self.own.honour();
        got
    }

    /// Fills `out` with order-0 frames through the held cache; returns how many it placed
    /// (short only when memory runs out). Runs of frames come off the hot pageblock's stack
    /// at once; the walk refills it between runs.
    #[must_use = "dropping the frames leaks them"]
    pub fn alloc_bulk(&mut self, flags: AllocFlags, out: &mut [Pfn]) -> usize {
        // As every operation, even one with nothing to place.
        self.own.honour();
        let m = self.machine;
        let mut n = 0;
        while let Some(rest) = out.get_mut(n..).filter(|r| !r.is_empty()) {
            if !flags.contains(AllocFlags::ZERO) {
                let run = self.own.pop_run(flags.bits(), rest, |pfn, dirty| {
                    popped(m, flags, pfn, dirty)
                });
                if run > 0 {
                    n += run;
                    continue;
                }
            }
            match self.alloc_walk(Order::ZERO, flags) {
                Some(pfn) => {
                    rest[0] = pfn;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// [`Machine::free_cpu`] through the held cache.
    ///
    /// # Errors
    /// The errors of [`Machine::free`]; the state is then unchanged.
    #[inline]
    pub fn free(&mut self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.free_as(pfn, order, true, false)
    }

    /// [`CpuHandle::free`] of a block the caller cleared (see [`Machine::free_clean`]).
    ///
    /// # Errors
    /// As [`CpuHandle::free`]; the state is then unchanged.
    #[inline]
    pub fn free_clean(&mut self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.free_as(pfn, order, false, false)
    }

    /// The frees of a handle, `unchecked` only at order 0 (see [`CpuHandle::free_unchecked`]).
    #[inline]
    fn free_as(
        &mut self,
        pfn: Pfn,
        order: Order,
        dirty: bool,
        unchecked: bool,
    ) -> Result<(), FreeError> {
        if order == Order::ZERO && self.own.free_now(pfn, dirty, unchecked) {
            return Ok(());
        }
        self.free_out_of_line(pfn, order, dirty, unchecked)
    }

    /// [`CpuHandle::free_as`] past its hot path: a request to honour, a frame outside the hot
    /// slot, a refused frame, a slot to give back, or a block.
    #[inline(never)]
    fn free_out_of_line(
        &mut self,
        pfn: Pfn,
        order: Order,
        dirty: bool,
        unchecked: bool,
    ) -> Result<(), FreeError> {
        if order != Order::ZERO {
            return self.free_block(pfn, order, dirty);
        }
        let m = self.machine;
        self.own
            .free(pfn, |pfn| m.locate(pfn), dirty, unchecked, m.poison())
    }

    /// A block of order 1 or more: straight to its zone, as [`Machine::free`] frees it, after
    /// honouring a drain request posted meanwhile.
    #[inline(never)]
    fn free_block(&mut self, pfn: Pfn, order: Order, dirty: bool) -> Result<(), FreeError> {
        self.own.honour();
        if dirty {
            self.machine.free(pfn, order)
        } else {
            self.machine.free_clean(pfn, order)
        }
    }

    /// [`Machine::free_bulk`] through the held cache: order-0 frames, all freed or none.
    /// When every frame is of this CPU's own pageblocks, the bulk holds their zone's lock (the
    /// one remote frees of them take) once and frees each with a plain store of its state
    /// byte; otherwise the slice goes to [`Machine::free_bulk`].
    ///
    /// # Errors
    /// A [`BulkFreeError`] with the index of the first offending frame and the reason (a
    /// duplicate within `pfns` is [`FreeError::Duplicate`]); the state is then unchanged.
    pub fn free_bulk(&mut self, pfns: &[Pfn]) -> Result<(), BulkFreeError> {
        let m = self.machine;
        if self.own.free_bulk(pfns, m.poison())? {
            Ok(())
        } else {
            m.free_bulk(pfns)
        }
    }

    /// [`CpuHandle::free`] of an order-0 frame without the double-free check: a frame of one
    /// of this CPU's pageblocks is marked free with a plain store instead of a
    /// compare-and-swap. Any other frame takes the checked path of [`CpuHandle::free`].
    ///
    /// The unsafety is a contract only: the body is safe code, so breaking the contract can
    /// corrupt the allocator's state (the frame may be handed out twice, and an error a checked
    /// free would return is not), never the allocator's own memory.
    ///
    /// # Errors
    /// The errors of [`CpuHandle::free`], only for a frame outside this CPU's pageblocks.
    ///
    /// # Safety
    /// 1. `pfn` was handed out by an order-0 allocation of this machine (through any CPU or
    ///    API) and has not been freed since;
    /// 2. no other free of `pfn` (from any thread or API) runs before this one returns, or at
    ///    all until `pfn` is allocated again.
    #[allow(unsafe_code)]
    #[inline]
    pub unsafe fn free_unchecked(&mut self, pfn: Pfn) -> Result<(), FreeError> {
        self.free_as(pfn, Order::ZERO, true, true)
    }
}

/// A frame popped from the cache for a request without [`AllocFlags::ZERO`]. Without ZERO,
/// [`Machine::zeroed`] clears nothing and only checks the frame in the `poison` debug mode, so
/// other builds skip the call (and its frame record) on the hot path.
#[inline]
fn popped(m: &Machine<'_>, flags: AllocFlags, pfn: Pfn, dirty: bool) -> Pfn {
    if cfg!(feature = "poison") {
        m.zeroed(flags, 1, Got::one(pfn, dirty))
    } else {
        pfn
    }
}
