//! The SMP workload's only calls into numaframe's per-CPU API (`Machine::cpu`, `alloc_cpu`,
//! `free_cpu`, `drain_cpu`, `drain_all`), behind a handle that one CPU claims and uses through
//! `&mut`. Kept in one small module so that a change of that API touches nothing else.

use numaframe::{AllocFlags, CpuId, FreeError, Machine, NodeId, Order, Pfn};

/// One CPU's use of the machine's per-CPU caches, held by the code running on that CPU.
#[derive(Debug)]
pub struct Cpu<'m, 'a> {
    machine: &'m Machine<'a>,
    id: CpuId,
}

impl<'m, 'a> Cpu<'m, 'a> {
    /// The CPU registered at boot with `index`, or `None` if the machine has no such CPU.
    pub fn claim(machine: &'m Machine<'a>, index: usize) -> Option<Self> {
        machine.cpu(index).map(|id| Cpu { machine, id })
    }

    /// The node the machine registered the CPU on.
    pub fn node(&self) -> Option<NodeId> {
        self.machine.cpu_node(self.id)
    }

    /// A block of `order` from the CPU's node (order 0 through its cache).
    pub fn alloc(&mut self, order: Order) -> Option<Pfn> {
        self.machine.alloc_cpu(self.id, order, AllocFlags::empty())
    }

    /// Frees a block from this CPU (order 0 into its cache), whichever CPU allocated it.
    ///
    /// # Errors
    /// The machine's [`FreeError`]; nothing changes then.
    pub fn free(&mut self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.machine.free_cpu(self.id, pfn, order)
    }
}

/// Drains the cache of the CPU with `index` from whichever CPU calls it (a remote drain).
pub fn drain_remote(machine: &Machine<'_>, index: usize) {
    if let Some(id) = machine.cpu(index) {
        machine.drain_cpu(id);
    }
}

/// Drains every CPU's cache.
pub fn drain_all(machine: &Machine<'_>) {
    machine.drain_all();
}
