//! The `x86_64` crate's frame-allocator traits (feature `x86_64`).
//!
//! [`NumaFrameAllocator`] implements [`FrameAllocator`] for 4 KiB, 2 MiB and 1 GiB frames and
//! [`FrameDeallocator`] for all three, so a kernel can hand numaframe to the `x86_64` crate's
//! page-table mappers (`OffsetPageTable::map_to` takes page-table frames from it) and map huge
//! pages from NUMA-local memory:
//!
//! - 4 KiB frames are order-0 blocks, 2 MiB frames order-9 blocks and 1 GiB frames order-18
//!   blocks of the buddy allocator, placed by the allocator's [`TaskPolicy`] (or, without one,
//!   on the CPU's node and then its fallback order);
//! - with [`NumaFrameAllocator::with_huge_pools`], 2 MiB and 1 GiB frames come from the huge-page
//!   pools reserved at boot instead ([`Machine::alloc_huge`]), and go back to them.
//!
//! The traits cannot report a failed free, so [`FrameDeallocator::deallocate_frame`] keeps the
//! first [`FreeError`] for [`NumaFrameAllocator::take_error`]; the allocator's state is then
//! unchanged, as for any refused free.
//!
//! The crate builds without its `instructions` feature, so this module compiles for every
//! target numaframe does (aarch64 included): the traits and frame types are plain data.
#![deny(unsafe_code)]

use ::x86_64::PhysAddr as X86PhysAddr;
use ::x86_64::structures::paging::{
    FrameAllocator, FrameDeallocator, PageSize, PhysFrame, Size1GiB, Size2MiB, Size4KiB,
};

use crate::addr::HugeSize;
use crate::addr::{Order, Pfn, PhysAddr};
use crate::error::FreeError;
use crate::machine::{AllocFlags, Machine};
use crate::policy::TaskPolicy;
use crate::topology::NodeId;

/// A frame allocator for the `x86_64` crate over a [`Machine`], on behalf of a CPU of one node.
#[derive(Debug)]
pub struct NumaFrameAllocator<'m, 'a> {
    machine: &'m Machine<'a>,
    cpu_node: NodeId,
    policy: Option<TaskPolicy>,
    flags: AllocFlags,
    huge_pools: bool,
    error: Option<FreeError>,
}

impl<'m, 'a> NumaFrameAllocator<'m, 'a> {
    /// Frames from `cpu_node`, then its fallback order.
    ///
    /// Safe code cannot make one: [`FrameAllocator`] promises frames nobody uses, and the
    /// machine cannot tell a free by the frame's owner from anyone else's.
    ///
    /// ```compile_fail,E0133
    /// # fn f(m: &numaframe::Machine<'_>) {
    /// let _ = numaframe::NumaFrameAllocator::new(m, numaframe::NodeId::new(0));
    /// # }
    /// ```
    ///
    /// # Safety
    /// While the allocator and the frames it handed out are in use, nothing else frees a frame
    /// it took from `machine` (through [`Machine::free`] or any other call): the machine cannot
    /// tell its frames from anyone's, so it would accept such a free and hand the frame out
    /// again, through this allocator too, while a page table still lives in it (as for
    /// [`NodeHeap::new`](crate::heap::NodeHeap::new)).
    #[allow(unsafe_code)]
    pub unsafe fn new(machine: &'m Machine<'a>, cpu_node: NodeId) -> Self {
        Self {
            machine,
            cpu_node,
            policy: None,
            flags: AllocFlags::empty(),
            huge_pools: false,
            error: None,
        }
    }

    /// Places frames by `policy` (its interleave cursor advances with every frame).
    #[must_use]
    pub fn with_policy(mut self, policy: TaskPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Allocates with `flags` (for instance [`AllocFlags::THISNODE`] or
    /// [`AllocFlags::DMA32`] for frames a 32-bit device reaches).
    #[must_use]
    pub fn with_flags(mut self, flags: AllocFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Takes 2 MiB and 1 GiB frames from the huge-page pools instead of the buddy allocator.
    #[must_use]
    pub fn with_huge_pools(mut self) -> Self {
        self.huge_pools = true;
        self
    }

    /// The node of the CPU the frames are allocated for.
    pub fn cpu_node(&self) -> NodeId {
        self.cpu_node
    }

    /// The policy, with its interleave cursor.
    pub fn policy(&self) -> Option<&TaskPolicy> {
        self.policy.as_ref()
    }

    /// The first free the machine refused since the last call, if any.
    pub fn take_error(&mut self) -> Option<FreeError> {
        self.error.take()
    }

    fn alloc_order(&mut self, order: Order) -> Option<Pfn> {
        if let (true, Some(size)) = (self.huge_pools, huge_size(order)) {
            return match &mut self.policy {
                Some(p) => p.alloc_huge_with(self.machine, self.cpu_node, size, self.flags),
                None => self
                    .machine
                    .alloc_huge_with(self.cpu_node, size, self.flags),
            };
        }
        match &mut self.policy {
            Some(p) => p.alloc(self.machine, self.cpu_node, order, self.flags),
            None => self
                .machine
                .alloc_from(self.cpu_node, self.cpu_node, order, self.flags),
        }
    }

    fn free_order(&mut self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        match (self.huge_pools, huge_size(order)) {
            (true, Some(size)) => self.machine.free_huge(pfn, size),
            _ => self.machine.free(pfn, order),
        }
    }

    fn frame<S: PageSize>(&mut self, order: Order) -> Option<PhysFrame<S>> {
        let pfn = self.alloc_order(order)?;
        let frame = X86PhysAddr::try_new(pfn.addr().get())
            .ok()
            .and_then(|a| PhysFrame::from_start_address(a).ok());
        if frame.is_none() {
            // A frame at or above x86_64's 52-bit physical address (the core manages frames
            // up to 2^52 frames, beyond it): never hand out a frame the caller cannot name.
            let _ = self.free_order(pfn, order);
        }
        frame
    }

    fn give_back<S: PageSize>(&mut self, frame: PhysFrame<S>, order: Order) {
        let pfn = PhysAddr::new(frame.start_address().as_u64()).pfn();
        if let Err(e) = self.free_order(pfn, order) {
            self.error.get_or_insert(e);
        }
    }
}

fn huge_size(order: Order) -> Option<HugeSize> {
    HugeSize::ALL.into_iter().find(|s| s.order() == order)
}

/// The buddy order of an `x86_64` page size.
const fn order_of(size: u64) -> Order {
    match size {
        Size1GiB::SIZE => Order::MAX,
        Size2MiB::SIZE => Order::HUGE_2M,
        _ => Order::ZERO,
    }
}

macro_rules! frame_traits {
    ($($size:ty),*) => {$(
        // SAFETY: every frame comes from the machine's allocator, which hands out each block
        // once until it is freed, and nothing else frees the frames this allocator took (the
        // contract of `NumaFrameAllocator::new`): frames are unique and unused. A frame's
        // block has exactly the page size's order, so the frame covers only memory handed to
        // the caller.
        #[allow(unsafe_code)]
        unsafe impl FrameAllocator<$size> for NumaFrameAllocator<'_, '_> {
            fn allocate_frame(&mut self) -> Option<PhysFrame<$size>> {
                self.frame(order_of(<$size>::SIZE))
            }
        }

        impl FrameDeallocator<$size> for NumaFrameAllocator<'_, '_> {
            /// Frees the frame; a refused free (not allocated here, wrong size) changes
            /// nothing and is kept for [`NumaFrameAllocator::take_error`].
            #[allow(unsafe_code)]
            unsafe fn deallocate_frame(&mut self, frame: PhysFrame<$size>) {
                self.give_back(frame, order_of(<$size>::SIZE));
            }
        }
    )*};
}

frame_traits!(Size4KiB, Size2MiB, Size1GiB);
