//! numaframe through a claimed CPU handle (`Machine::claim_cpu`): the per-CPU caches with no
//! lock on their path, and the unchecked free twin.
#![deny(unsafe_code)]

use numaframe::{AllocFlags, CpuHandle, Machine, Order, Pfn};

use super::Frames;

/// A CPU's handle as [`Frames`]: `CpuHandle::alloc` / `free` (or `free_unchecked`), and
/// `CpuHandle::alloc_bulk` / `free_bulk` for bulks.
#[derive(Debug)]
pub struct NumaHandle<'m, 'a> {
    handle: CpuHandle<'m, 'a>,
    unchecked: bool,
}

impl<'m, 'a> NumaHandle<'m, 'a> {
    /// Claims CPU `index` of `machine`.
    ///
    /// # Panics
    /// If the machine has no such CPU, or another handle holds it.
    pub fn claim(machine: &'m Machine<'a>, index: usize) -> Self {
        let cpu = machine.cpu(index).expect("a CPU registered at boot");
        NumaHandle {
            handle: machine.claim_cpu(cpu).expect("an unclaimed CPU"),
            unchecked: false,
        }
    }

    /// The same, freeing order-0 frames with `CpuHandle::free_unchecked`.
    ///
    /// # Safety
    /// Every order-0 frame given to [`Frames::free`] (or `free_bulk`) is one this adapter
    /// allocated and has not been given back since, and nothing else frees it.
    #[allow(unsafe_code)]
    pub unsafe fn unchecked(self) -> Self {
        NumaHandle {
            unchecked: true,
            ..self
        }
    }
}

impl Frames for NumaHandle<'_, '_> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.handle
            .alloc(Order::new(order), AllocFlags::empty())
            .map(Pfn::get)
    }
    fn free(&mut self, frame: u64, order: u8) {
        let (pfn, order) = (Pfn::new(frame), Order::new(order));
        if self.unchecked && order == Order::ZERO {
            #[allow(unsafe_code)]
            // SAFETY: an unchecked adapter is built only by `unchecked`, whose caller
            // guarantees that `frame` is an order-0 frame this adapter handed out and that this
            // is its one free.
            unsafe {
                self.handle.free_unchecked(pfn)
            }
        } else {
            self.handle.free(pfn, order)
        }
        .expect("numaframe refused a frame it handed out");
    }
    fn alloc_bulk(&mut self, out: &mut [Pfn]) -> usize {
        self.handle.alloc_bulk(AllocFlags::empty(), out)
    }
    fn free_bulk(&mut self, frames: &[Pfn]) {
        self.handle
            .free_bulk(frames)
            .expect("numaframe refused frames it handed out");
    }
}
