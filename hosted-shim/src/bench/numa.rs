//! numaframe as the scenarios drive it: adapters to [`Frames`] for its per-CPU, node and
//! policy APIs, and the one-node simulated machine ([`OneNode`]) they run on.
#![deny(unsafe_code)]

use std::io;

use numaframe::policy::TaskPolicy;
use numaframe::{
    AllocFlags, BootOptions, CpuId, Machine, MemoryRange, NodeId, Order, PAGE_SIZE, PcpConfig, Pfn,
    PhysAddr, PhysRange,
};

use super::{Frames, NODE_BASE};
use crate::sim::SimMemory;
use crate::spec::{MachineSpec, NodeSpec};

/// numaframe through one CPU: `alloc_cpu` / `free_cpu` (the per-CPU caches for order 0, when
/// they are on), and the node bulk API of the CPU's node for bulks.
#[derive(Debug)]
pub struct NumaCpu<'m, 'a> {
    machine: &'m Machine<'a>,
    cpu: CpuId,
    node: NodeId,
}

impl<'m, 'a> NumaCpu<'m, 'a> {
    /// CPU `index` of `machine`.
    ///
    /// # Panics
    /// If the machine has no such CPU.
    pub fn new(machine: &'m Machine<'a>, index: usize) -> Self {
        let cpu = machine.cpu(index).expect("a CPU registered at boot");
        let node = machine.cpu_node(cpu).expect("a CPU has a node");
        NumaCpu { machine, cpu, node }
    }
}

impl Frames for NumaCpu<'_, '_> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.machine
            .alloc_cpu(self.cpu, Order::new(order), AllocFlags::empty())
            .map(Pfn::get)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.machine
            .free_cpu(self.cpu, Pfn::new(frame), Order::new(order))
            .expect("numaframe refused a frame it handed out");
    }
    fn alloc_bulk(&mut self, out: &mut [Pfn]) -> usize {
        self.machine.alloc_bulk(self.node, AllocFlags::empty(), out)
    }
    fn free_bulk(&mut self, frames: &[Pfn]) {
        self.machine
            .free_bulk(frames)
            .expect("numaframe refused frames it handed out");
    }
}

/// numaframe through the node API (`alloc` / `free`, no CPU cache): the zonelist walk.
#[derive(Debug)]
pub struct NumaNode<'m, 'a> {
    machine: &'m Machine<'a>,
    node: NodeId,
    flags: AllocFlags,
    /// Frees go through `Machine::free_clean`.
    clean: bool,
}

impl<'m, 'a> NumaNode<'m, 'a> {
    /// Allocations from `node` with `flags`, frees through `Machine::free`.
    pub fn new(machine: &'m Machine<'a>, node: NodeId, flags: AllocFlags) -> Self {
        NumaNode {
            machine,
            node,
            flags,
            clean: false,
        }
    }

    /// The same, freeing through `Machine::free_clean`: the frames come back clean (the
    /// bench never writes them).
    pub fn freeing_clean(self) -> Self {
        NumaNode {
            clean: true,
            ..self
        }
    }
}

impl Frames for NumaNode<'_, '_> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.machine
            .alloc(self.node, Order::new(order), self.flags)
            .map(Pfn::get)
    }
    fn free(&mut self, frame: u64, order: u8) {
        let (pfn, order) = (Pfn::new(frame), Order::new(order));
        if self.clean {
            self.machine.free_clean(pfn, order)
        } else {
            self.machine.free(pfn, order)
        }
        .expect("numaframe refused a frame it handed out");
    }
    fn alloc_short_lived(&mut self) -> Option<u64> {
        self.machine
            .alloc(
                self.node,
                Order::new(0),
                self.flags | AllocFlags::SHORT_LIVED,
            )
            .map(Pfn::get)
    }
    fn pageblock_free(&self, f: &mut dyn FnMut(u64, u16)) {
        let Some(node) = self.machine.nodes().get(self.node.index()) else {
            return;
        };
        for kind in numaframe::ZoneKind::ALL {
            node.zone(kind)
                .for_each_pageblock(|pb| f(pb.pfn.get(), pb.free));
        }
    }
}

/// numaframe through a task's memory policy (`TaskPolicy::alloc`, then `Machine::free`).
#[derive(Debug)]
pub struct NumaPolicy<'m, 'a> {
    machine: &'m Machine<'a>,
    policy: TaskPolicy,
    cpu_node: NodeId,
}

impl<'m, 'a> NumaPolicy<'m, 'a> {
    /// Allocations through `policy` by a task on `cpu_node`.
    pub fn new(machine: &'m Machine<'a>, policy: TaskPolicy, cpu_node: NodeId) -> Self {
        NumaPolicy {
            machine,
            policy,
            cpu_node,
        }
    }
}

impl Frames for NumaPolicy<'_, '_> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.policy
            .alloc(
                self.machine,
                self.cpu_node,
                Order::new(order),
                AllocFlags::empty(),
            )
            .map(Pfn::get)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.machine
            .free(Pfn::new(frame), Order::new(order))
            .expect("numaframe refused a frame it handed out");
    }
}

/// CPUs of a [`OneNode`]: one per thread of the widest threaded scenario.
pub const CPUS: usize = 4;

/// A one-node simulated machine for numaframe: `frames` usable frames (plus room for the
/// metadata) at [`NODE_BASE`], with [`CPUS`] CPUs.
#[derive(Debug)]
pub struct OneNode {
    spec: MachineSpec,
    memory: SimMemory,
    ranges: Vec<MemoryRange>,
}

impl OneNode {
    /// Maps the simulated memory (untouched until the allocator writes its metadata).
    ///
    /// # Errors
    /// If the kernel refuses the mapping.
    pub fn new(frames: u64) -> io::Result<OneNode> {
        OneNode::at(frames, NODE_BASE)
    }

    /// The same node starting at physical address `base` (a multiple of 1 GiB); below 4 GiB it
    /// is in the `Dma32` zone.
    ///
    /// # Errors
    /// If the kernel refuses the mapping.
    pub fn at(frames: u64, base: u64) -> io::Result<OneNode> {
        let bytes = frames * PAGE_SIZE;
        // Metadata is 12 bytes per frame (0.3 %); 1/256 (0.4 %) covers it and the tables.
        OneNode::with_total(bytes + (bytes / 256).max(8 << 20), base)
    }

    /// A node at [`NODE_BASE`] on which numaframe manages exactly `frames` frames, the frames
    /// `NODE_BASE / 4 KiB ..` + `frames` (its metadata and tables sit after them), so that a
    /// scenario over it sees the same memory as a peer over `0..frames`. Found by booting:
    /// each frame more of memory adds one managed frame or none (when it adds a frame of
    /// metadata), so the node size that gives exactly `frames` exists.
    ///
    /// # Errors
    /// If the kernel refuses a mapping, a boot fails, or no size is found in 32 boots.
    pub fn exact(frames: u64) -> io::Result<OneNode> {
        let mut total = frames * PAGE_SIZE + (frames * PAGE_SIZE / 256).max(8 << 20);
        for _ in 0..32 {
            // A simulated memory maps each metadata range once, so the probe's node is not
            // the one handed out.
            let got = managed(&OneNode::with_total(total, NODE_BASE)?.boot()?);
            match got.cmp(&frames) {
                std::cmp::Ordering::Equal => return OneNode::with_total(total, NODE_BASE),
                std::cmp::Ordering::Greater => total -= (got - frames) * PAGE_SIZE,
                std::cmp::Ordering::Less => total += (frames - got) * PAGE_SIZE,
            }
        }
        Err(io::Error::other(format!(
            "no node size gives exactly {frames} managed frames"
        )))
    }

    /// A node of `total` bytes (metadata included) at physical address `base`.
    ///
    /// # Errors
    /// If the kernel refuses the mapping.
    pub fn with_total(total: u64, base: u64) -> io::Result<OneNode> {
        let frames = total / PAGE_SIZE;
        let node = NodeSpec {
            cpus: (0..CPUS as u32).collect(),
            memory_bytes: total,
            socket: Some(0),
            ..NodeSpec::default()
        };
        let spec = MachineSpec::new(format!("bench-{frames}"), vec![node], vec![10], None)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let range = PhysRange::from_bytes(PhysAddr::new(base), total)
            .ok_or_else(|| io::Error::other("bench node range"))?;
        Ok(OneNode {
            memory: SimMemory::new(&[(base, total)])?,
            ranges: vec![MemoryRange {
                node: NodeId::new(0),
                range,
            }],
            spec,
        })
    }

    /// Boots numaframe over it: [`CPUS`] CPUs on node 0, default per-CPU caches, watermarks
    /// off.
    ///
    /// # Errors
    /// The core's boot error, as text.
    pub fn boot(&self) -> io::Result<Machine<'_>> {
        self.boot_as(false)
    }

    /// The node's simulated memory.
    pub fn memory(&self) -> &SimMemory {
        &self.memory
    }

    /// [`OneNode::boot`] of memory the platform says is zeroed, clearing through the
    /// simulated memory (for `AllocFlags::ZERO`).
    ///
    /// # Errors
    /// The core's boot error.
    pub fn boot_zeroed(&self) -> io::Result<Machine<'_>> {
        self.boot_as(true).map(|m| m.with_clearer(&self.memory))
    }

    /// The boot of [`OneNode::boot`], the memory said to be zeroed if `zeroed`.
    fn boot_as(&self, zeroed: bool) -> io::Result<Machine<'_>> {
        let cpus = [NodeId::new(0); CPUS];
        Machine::boot(
            self.spec.topology(),
            &self.memory,
            &self.ranges,
            BootOptions {
                cpus: &cpus,
                min_free_kbytes: Some(0),
                lowmem_reserve_ratio: 0,
                zeroed,
                ..BootOptions::default()
            },
        )
        .map_err(|e| io::Error::other(format!("boot: {e}")))
    }
}

/// Frames `machine` manages (all free on a fresh boot with the min watermark at 0).
pub fn managed(machine: &Machine<'_>) -> u64 {
    machine.nodes().iter().map(|n| n.managed_pages()).sum()
}

/// Turns numaframe's per-CPU caches on (Linux's defaults) or off; off also drains them.
pub fn set_caches(machine: &Machine<'_>, on: bool) {
    if on {
        machine.set_pcp(PcpConfig::default());
    } else {
        machine.set_pcp(PcpConfig::OFF);
        machine.drain_all();
    }
}
