//! The SMP workload's only calls into numaframe's per-CPU API: the locked calls (`Machine::cpu`,
//! `alloc_cpu`, `free_cpu`, `drain_cpu`, `drain_all`) behind a [`Cpu`] that one CPU uses
//! through `&mut`, and a claimed [`CpuHandle`] behind a [`Handle`], with the [`Kicks`] that
//! wake a CPU idling while it holds one. Kept in one small module so that a change of that API
//! touches nothing else.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use numaframe::{AllocFlags, CpuHandle, CpuId, CpuKick, FreeError, Machine, NodeId, Order, Pfn};

use crate::boot::MAX_CPUS;

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

/// A CPU's claimed cache: no lock on its operations while it lives. Its CPU answers the
/// [`Kicks`] meant for it with [`Handle::poll`].
#[derive(Debug)]
pub struct Handle<'m, 'a>(CpuHandle<'m, 'a>);

impl<'m, 'a> Handle<'m, 'a> {
    /// Claims the cache of the CPU registered at boot with `index`; `None` if the machine has
    /// no such CPU or another handle holds it.
    pub fn claim(machine: &'m Machine<'a>, index: usize) -> Option<Self> {
        let id = machine.cpu(index)?;
        machine.claim_cpu(id).ok().map(Handle)
    }

    /// An order-0 frame from the CPU's node, through the claimed cache.
    pub fn alloc(&mut self) -> Option<Pfn> {
        self.0.alloc(Order::ZERO, AllocFlags::empty())
    }

    /// Fills `out` with order-0 frames through the claimed cache; returns how many it placed.
    pub fn alloc_bulk(&mut self, out: &mut [Pfn]) -> usize {
        self.0.alloc_bulk(AllocFlags::empty(), out)
    }

    /// Frees an order-0 frame from this CPU, whichever CPU allocated it.
    ///
    /// # Errors
    /// The machine's [`FreeError`]; nothing changes then.
    pub fn free(&mut self, pfn: Pfn) -> Result<(), FreeError> {
        self.0.free(pfn, Order::ZERO)
    }

    /// Gives the cache back if a drain asked for it; `true` if one had.
    pub fn poll(&mut self) -> bool {
        self.0.poll()
    }

    /// Free frames the claimed cache holds.
    pub fn cached_pages(&self) -> u64 {
        self.0.cached_pages()
    }
}

/// The unikernel's [`CpuKick`]: a kick marks a poll due for the CPU and wakes the CPUs waiting
/// for an event (`wake`: aarch64's `sev`); an idle CPU checks its mark before each wait
/// (`wait`: `wfe`, which a `sev` since the check ends at once).
pub struct Kicks {
    due: [AtomicBool; MAX_CPUS],
    sent: AtomicU64,
    wake: fn(),
    wait: fn(),
}

impl Kicks {
    /// Kicks that call `wake` after marking a CPU, and that [`Kicks::wait`] waits with `wait`.
    pub const fn new(wake: fn(), wait: fn()) -> Self {
        Kicks {
            due: [const { AtomicBool::new(false) }; MAX_CPUS],
            sent: AtomicU64::new(0),
            wake,
            wait,
        }
    }

    /// `true` once for each kick of the CPU with `index` (several before a call count once).
    pub fn take(&self, index: usize) -> bool {
        // Acquire: pairs with the kick's Release, after the drain posted its request.
        self.due
            .get(index)
            .is_some_and(|d| d.swap(false, Ordering::Acquire))
    }

    /// Kicks sent so far.
    pub fn sent(&self) -> u64 {
        // Relaxed: a count, read after the CPUs met at a barrier.
        self.sent.load(Ordering::Relaxed)
    }

    /// Waits a while for a kick, a [`Kicks::wake_all`], or nothing (callers check again).
    pub fn wait(&self) {
        (self.wait)();
    }

    /// Wakes every CPU waiting in [`Kicks::wait`].
    pub fn wake_all(&self) {
        (self.wake)();
    }
}

impl core::fmt::Debug for Kicks {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Kicks")
            .field("sent", &self.sent())
            .finish_non_exhaustive()
    }
}

impl CpuKick for Kicks {
    fn kick(&self, cpu: CpuId) {
        if let Some(d) = self.due.get(cpu.index()) {
            // Release: the request the drain posted before this is seen by the CPU's poll.
            d.store(true, Ordering::Release);
        }
        // Relaxed: a count.
        self.sent.fetch_add(1, Ordering::Relaxed);
        (self.wake)();
    }
}

/// Order-0 frames through one CPU's cache, whichever way the CPU reaches it.
pub trait Order0 {
    /// An order-0 frame from the CPU's node.
    fn alloc0(&mut self) -> Option<Pfn>;

    /// Frees an order-0 frame from this CPU, whichever CPU allocated it.
    ///
    /// # Errors
    /// The machine's [`FreeError`]; nothing changes then.
    fn free0(&mut self, pfn: Pfn) -> Result<(), FreeError>;
}

impl Order0 for Cpu<'_, '_> {
    fn alloc0(&mut self) -> Option<Pfn> {
        self.alloc(Order::ZERO)
    }

    fn free0(&mut self, pfn: Pfn) -> Result<(), FreeError> {
        self.free(pfn, Order::ZERO)
    }
}

impl Order0 for Handle<'_, '_> {
    fn alloc0(&mut self) -> Option<Pfn> {
        self.alloc()
    }

    fn free0(&mut self, pfn: Pfn) -> Result<(), FreeError> {
        self.free(pfn)
    }
}

/// Drains the cache of the CPU with `index` from whichever CPU calls it (a remote drain).
pub fn drain_remote(machine: &Machine<'_>, index: usize) {
    if let Some(id) = machine.cpu(index) {
        machine.drain_cpu(id);
    }
}

/// Drains every CPU's cache: a CPU whose cache a handle holds is asked to (and kicked if it
/// holds a pageblock).
pub fn drain_all(machine: &Machine<'_>) {
    machine.drain_all();
}
