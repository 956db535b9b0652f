//! A CPU's exclusive handle on its cache: claimed once, then used through `&mut` with no cache
//! lock on its path, the way a kernel touches per-CPU data with preemption off.
//!
//! The handle holds the cache for as long as it lives ([`Owned`]): its allocations and frees
//! of order 0 pop from and push to the CPU's pageblocks with no lock and, on a free, the one
//! compare-and-swap of the frame's state byte that also decides a race with a remote free of
//! the same frame. Remote drains of a claimed CPU become requests it honours before its next
//! operation or when it drops (see `percpu`).
#![deny(unsafe_code)]

use super::{AllocFlags, Machine, Request};
use crate::addr::{Order, Pfn};
use crate::buddy::Got;
use crate::error::{ClaimError, FreeError};
use crate::percpu::{CpuId, Owned};

/// A CPU's cache, held exclusively: get one from [`Machine::claim_cpu`]. Dropping it gives the
/// CPU back (honouring any drain request posted meanwhile).
///
/// While it lives, [`Machine::alloc_cpu`] for its CPU bypasses the cache (straight to the
/// zones), [`Machine::free_cpu`] for its CPU frees as any other CPU would (under the zone lock),
/// and [`Machine::cached_pages`], numastat and the invariant check leave its cache out.
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

    /// [`Machine::alloc_cpu`] through the held cache: a block of `order` preferring the CPU's
    /// node, from the cache for order 0. `None` when memory runs out.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc(&mut self, order: Order, flags: AllocFlags) -> Option<Pfn> {
        // A frame needing zeroing takes the walk, which clears it; `zeroed` runs the `poison`
        // debug mode's check here too.
        if order == Order::ZERO
            && !flags.contains(AllocFlags::ZERO)
            && let Some((pfn, dirty)) = self.own.pop_hot(flags.bits())
        {
            return Some(self.machine.zeroed(flags, 1, Got::one(pfn, dirty)));
        }
        if order != Order::ZERO || flags.contains(AllocFlags::ZERO) {
            self.own.ask_other();
        }
        let node = self.own.node();
        self.machine
            .walk_cached(&mut self.own, &Request::new(node, node, order, flags))
    }

    /// Fills `out` with order-0 frames through the held cache; returns how many it placed
    /// (short only when memory runs out).
    #[must_use = "dropping the frames leaks them"]
    pub fn alloc_bulk(&mut self, flags: AllocFlags, out: &mut [Pfn]) -> usize {
        for (n, slot) in out.iter_mut().enumerate() {
            match self.alloc(Order::ZERO, flags) {
                Some(pfn) => *slot = pfn,
                None => return n,
            }
        }
        out.len()
    }

    /// [`Machine::free_cpu`] through the held cache.
    ///
    /// # Errors
    /// The errors of [`Machine::free`]; the state is then unchanged.
    pub fn free(&mut self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.free_as(pfn, order, true)
    }

    /// [`CpuHandle::free`] of a block the caller cleared (see [`Machine::free_clean`]).
    ///
    /// # Errors
    /// As [`CpuHandle::free`]; the state is then unchanged.
    pub fn free_clean(&mut self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.free_as(pfn, order, false)
    }

    #[inline]
    fn free_as(&mut self, pfn: Pfn, order: Order, dirty: bool) -> Result<(), FreeError> {
        let m = self.machine;
        if order != Order::ZERO {
            return if dirty {
                m.free(pfn, order)
            } else {
                m.free_clean(pfn, order)
            };
        }
        self.own
            .free(pfn, |pfn| m.locate(pfn), dirty, false, m.poison())
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
    pub unsafe fn free_unchecked(&mut self, pfn: Pfn) -> Result<(), FreeError> {
        let m = self.machine;
        self.own
            .free(pfn, |pfn| m.locate(pfn), true, true, m.poison())
    }
}
