//! The workloads `numaframe frag` runs before it reports, node by node, each on at most a
//! budget of frames of its node ([`budget`]), from one generator seeded by `--seed`.
//!
//! - `churn`: LLFree's recipe. Fill the budget with 4 KiB frames, free a random 50%, then
//!   rounds that each free a random 10% of the held frames and allocate as many again.
//! - `guests`: a hypervisor. The host holds long-lived 4 KiB frames (1% of the budget at the
//!   start, 0.2% more a day, its oldest freed beyond 3%, and 1/1024 of a guest's size of per-VM
//!   structures after each guest it creates). Guests of 1/8 to 1/2 of the budget are backed
//!   with 1 GiB frames for their whole GiBs, 2 MiB frames for the rest, 4 KiB frames last (and
//!   for any larger frame that could not be had), and keep short-lived I/O buffers
//!   ([`AllocFlags::SHORT_LIVED`], 1/256 of their size) through the per-CPU cache of a CPU of
//!   their node when it has one. Day 0 creates guests until they hold 80% of the budget; each
//!   later day the host allocates, one random guest is torn down, every guest frees a random
//!   half of its buffers and allocates as many again, new guests fill the budget back up, and
//!   the host frees its oldest frames.
//!
//! Every allocation names its node with [`AllocFlags::THISNODE`], so a node's workload stays
//! on it. Frames stay allocated when the workload ends: the report shows the state it left.
#![deny(unsafe_code)]

use std::collections::VecDeque;

use numaframe::{AllocFlags, CpuId, Machine, NodeId, Order, Pfn};
use serde::Serialize;

use crate::bench::Rng;
use crate::error::CliError;

/// Frames in 1 GiB.
const GIB_FRAMES: u64 = 1 << 18;
/// Frames in 2 MiB.
const PB_FRAMES: u64 = 1 << 9;
/// Frames asked for per bulk call.
const CHUNK: usize = 4096;

/// What runs before the report.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Nothing: the machine as booted
    #[default]
    None,
    /// LLFree's recipe: fill with 4 KiB frames, free a random 50%, then rounds of 10%
    Churn,
    /// Host and guests: long-lived host frames, guests in 1 GiB/2 MiB/4 KiB frames, I/O buffers
    Guests,
}

/// What a node's run of a workload did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeSummary {
    /// The node.
    pub node: usize,
    /// The frames the workload could use on it.
    pub budget_pages: u64,
    /// `churn`: frames the fill got.
    pub filled_pages: u64,
    /// Frames (4 KiB) the workload holds at the end, of every size.
    pub held_pages: u64,
    /// `guests`: guests created, torn down, and alive at the end.
    pub guests_created: u64,
    /// `guests`: guests torn down.
    pub guests_torn_down: u64,
    /// `guests`: guests alive at the end.
    pub guests_alive: u64,
    /// `guests`: pages of the live guests' memory in 1 GiB frames.
    pub guest_pages_1g: u64,
    /// `guests`: in 2 MiB frames.
    pub guest_pages_2m: u64,
    /// `guests`: in 4 KiB frames.
    pub guest_pages_4k: u64,
    /// `guests`: the host's long-lived 4 KiB frames.
    pub host_pages: u64,
    /// `guests`: the guests' short-lived I/O buffers.
    pub io_pages: u64,
    /// `guests`: 1 GiB frames a guest could not have (it got 2 MiB frames instead).
    pub fallbacks_1g: u64,
    /// `guests`: 2 MiB frames a guest could not have (it got 4 KiB frames instead).
    pub fallbacks_2m: u64,
    /// 4 KiB allocations that failed: the node ran out above its watermarks (`churn`: frames
    /// a round could not allocate again; the fill stops at the watermark, see `filled_pages`).
    pub failed_allocations: u64,
}

/// The frames of `node` a workload may use: its managed frames, at most `max_gib` GiB.
pub fn budget(machine: &Machine<'_>, node: NodeId, max_gib: u64) -> u64 {
    machine.node(node).map_or(0, |n| {
        n.managed_pages().min(max_gib.saturating_mul(GIB_FRAMES))
    })
}

/// Runs `workload` with `rounds` rounds (days) on every node with memory, each on at most
/// [`budget`] frames; returns one summary per node it ran on.
///
/// # Errors
/// [`CliError::Internal`] if the core refuses to free a frame the workload holds.
pub fn run(
    machine: &Machine<'_>,
    workload: Workload,
    rounds: u32,
    seed: u64,
    max_gib: u64,
) -> Result<Vec<NodeSummary>, CliError> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for node in machine.memory_nodes().iter() {
        let budget = budget(machine, node, max_gib);
        let summary = match workload {
            Workload::None => continue,
            Workload::Churn => churn(machine, node, budget, rounds, &mut rng)?,
            Workload::Guests => guests(machine, node, budget, rounds, &mut rng)?,
        };
        out.push(summary);
    }
    Ok(out)
}

fn freeing(e: impl std::fmt::Display) -> CliError {
    CliError::Internal(format!("freeing a frame the workload held: {e}"))
}

/// Allocates up to `n` order-0 frames of `node` into `held`; returns how many it got.
fn take(machine: &Machine<'_>, node: NodeId, n: u64, held: &mut Vec<Pfn>) -> u64 {
    let mut buf = [Pfn::new(0); CHUNK];
    let mut got = 0u64;
    while got < n {
        let want = (n - got).min(CHUNK as u64) as usize;
        let k = machine.alloc_bulk(node, AllocFlags::THISNODE, &mut buf[..want]);
        held.extend_from_slice(&buf[..k]);
        got += k as u64;
        if k < want {
            break;
        }
    }
    got
}

/// Frees order-0 frames, a bulk at a time.
fn give(machine: &Machine<'_>, frames: &[Pfn]) -> Result<(), CliError> {
    frames
        .chunks(CHUNK)
        .try_for_each(|c| machine.free_bulk(c).map_err(freeing))
}

/// Removes `n` random frames from `held` and frees them.
fn give_random(
    machine: &Machine<'_>,
    held: &mut Vec<Pfn>,
    n: u64,
    rng: &mut Rng,
) -> Result<(), CliError> {
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n.min(held.len() as u64) {
        let i = rng.below(held.len() as u64) as usize;
        out.push(held.swap_remove(i));
    }
    give(machine, &out)
}

fn churn(
    machine: &Machine<'_>,
    node: NodeId,
    budget: u64,
    rounds: u32,
    rng: &mut Rng,
) -> Result<NodeSummary, CliError> {
    let mut held = Vec::with_capacity(budget as usize);
    let filled = take(machine, node, budget, &mut held);
    let mut failed = 0;
    let half = held.len() as u64 / 2;
    give_random(machine, &mut held, half, rng)?;
    for _ in 0..rounds {
        let n = held.len() as u64 / 10;
        give_random(machine, &mut held, n, rng)?;
        failed += n - take(machine, node, n, &mut held);
    }
    Ok(NodeSummary {
        node: node.index(),
        budget_pages: budget,
        filled_pages: filled,
        held_pages: held.len() as u64,
        failed_allocations: failed,
        ..NodeSummary::default()
    })
}

/// One guest: its memory blocks and its I/O buffers.
struct Guest {
    blocks: Vec<(Pfn, Order)>,
    io: Vec<Pfn>,
}

impl Guest {
    fn pages(&self, order: Order) -> u64 {
        self.blocks.iter().filter(|b| b.1 == order).count() as u64 * order.frames()
    }
    fn size(&self) -> u64 {
        self.blocks.iter().map(|b| b.1.frames()).sum::<u64>() + self.io.len() as u64
    }
}

/// The guests and the host of one node.
struct Host<'m, 'a> {
    machine: &'m Machine<'a>,
    node: NodeId,
    /// A CPU of the node, for the I/O buffers.
    cpu: Option<CpuId>,
    budget: u64,
    guests: Vec<Guest>,
    /// The host's frames, oldest first.
    own: VecDeque<Pfn>,
    summary: NodeSummary,
}

impl Host<'_, '_> {
    fn alloc(&self, order: Order, flags: AllocFlags) -> Option<Pfn> {
        self.machine
            .alloc(self.node, order, flags | AllocFlags::THISNODE)
    }

    fn host_alloc(&mut self, n: u64) {
        for _ in 0..n {
            match self.alloc(Order::ZERO, AllocFlags::empty()) {
                Some(p) => self.own.push_back(p),
                None => {
                    self.summary.failed_allocations += 1;
                    return;
                }
            }
        }
    }

    fn io_alloc(&mut self) -> Option<Pfn> {
        let flags = AllocFlags::SHORT_LIVED | AllocFlags::THISNODE;
        let p = match self.cpu {
            Some(cpu) => self.machine.alloc_cpu(cpu, Order::ZERO, flags),
            None => self.machine.alloc(self.node, Order::ZERO, flags),
        };
        if p.is_none() {
            self.summary.failed_allocations += 1;
        }
        p
    }

    fn io_free(&self, p: Pfn) -> Result<(), CliError> {
        match self.cpu {
            Some(cpu) => self.machine.free_cpu(cpu, p, Order::ZERO),
            None => self.machine.free(p, Order::ZERO),
        }
        .map_err(freeing)
    }

    fn guest_pages(&self) -> u64 {
        self.guests.iter().map(Guest::size).sum()
    }

    /// Backs `size` frames with the largest frames that can be had: 1 GiB, then 2 MiB, then
    /// 4 KiB. `None` if not even 4 KiB frames are left (what it got is freed again).
    fn create(&mut self, size: u64) -> Result<Option<Guest>, CliError> {
        let mut g = Guest {
            blocks: Vec::new(),
            io: Vec::new(),
        };
        let mut blocks_2m = size % GIB_FRAMES / PB_FRAMES;
        let mut frames = size % PB_FRAMES;
        for _ in 0..size / GIB_FRAMES {
            match self.alloc(Order::MAX, AllocFlags::empty()) {
                Some(p) => g.blocks.push((p, Order::MAX)),
                None => {
                    self.summary.fallbacks_1g += 1;
                    blocks_2m += GIB_FRAMES / PB_FRAMES;
                }
            }
        }
        for _ in 0..blocks_2m {
            match self.alloc(Order::HUGE_2M, AllocFlags::empty()) {
                Some(p) => g.blocks.push((p, Order::HUGE_2M)),
                None => {
                    self.summary.fallbacks_2m += 1;
                    frames += PB_FRAMES;
                }
            }
        }
        for _ in 0..frames {
            match self.alloc(Order::ZERO, AllocFlags::empty()) {
                Some(p) => g.blocks.push((p, Order::ZERO)),
                None => {
                    self.summary.failed_allocations += 1;
                    self.teardown(g)?;
                    return Ok(None);
                }
            }
        }
        for _ in 0..(size / 256).max(1) {
            match self.io_alloc() {
                Some(p) => g.io.push(p),
                None => break,
            }
        }
        self.summary.guests_created += 1;
        Ok(Some(g))
    }

    fn teardown(&mut self, g: Guest) -> Result<(), CliError> {
        for &(p, order) in &g.blocks {
            self.machine.free(p, order).map_err(freeing)?;
        }
        g.io.iter().try_for_each(|&p| self.io_free(p))
    }

    /// New guests until they hold 80% of the budget (or creation fails).
    fn fill(&mut self, rng: &mut Rng) -> Result<(), CliError> {
        let target = self.budget / 10 * 8;
        loop {
            let lo = (self.budget / 8).max(1);
            let hi = (self.budget / 2).max(lo);
            let size = lo + rng.below(hi - lo + 1);
            if self.guest_pages() + size > target {
                return Ok(());
            }
            let Some(g) = self.create(size)? else {
                return Ok(());
            };
            self.guests.push(g);
            self.host_alloc((size / 1024).max(1));
        }
    }

    /// Every guest frees a random half of its I/O buffers and allocates as many again.
    fn io_churn(&mut self, rng: &mut Rng) -> Result<(), CliError> {
        for i in 0..self.guests.len() {
            let n = self.guests[i].io.len() / 2;
            for _ in 0..n {
                let io = &mut self.guests[i].io;
                let p = io.swap_remove(rng.below(io.len() as u64) as usize);
                self.io_free(p)?;
            }
            for _ in 0..n {
                match self.io_alloc() {
                    Some(p) => self.guests[i].io.push(p),
                    None => break,
                }
            }
        }
        Ok(())
    }
}

fn guests(
    machine: &Machine<'_>,
    node: NodeId,
    budget: u64,
    days: u32,
    rng: &mut Rng,
) -> Result<NodeSummary, CliError> {
    let cpu = (0..machine.cpu_count())
        .filter_map(|i| machine.cpu(i))
        .find(|c| machine.cpu_node(*c) == Some(node));
    let mut h = Host {
        machine,
        node,
        cpu,
        budget,
        guests: Vec::new(),
        own: VecDeque::new(),
        summary: NodeSummary {
            node: node.index(),
            budget_pages: budget,
            ..NodeSummary::default()
        },
    };
    h.host_alloc(budget / 100);
    h.fill(rng)?;
    for _ in 0..days {
        h.host_alloc(budget / 1000);
        if !h.guests.is_empty() {
            let i = rng.below(h.guests.len() as u64) as usize;
            let g = h.guests.swap_remove(i);
            h.teardown(g)?;
            h.summary.guests_torn_down += 1;
        }
        h.io_churn(rng)?;
        h.host_alloc(budget / 1000);
        h.fill(rng)?;
        while h.own.len() as u64 > budget / 100 * 3 {
            if let Some(p) = h.own.pop_front() {
                machine.free(p, Order::ZERO).map_err(freeing)?;
            }
        }
    }
    let s = &mut h.summary;
    s.guests_alive = h.guests.len() as u64;
    s.guest_pages_1g = h.guests.iter().map(|g| g.pages(Order::MAX)).sum();
    s.guest_pages_2m = h.guests.iter().map(|g| g.pages(Order::HUGE_2M)).sum();
    s.guest_pages_4k = h.guests.iter().map(|g| g.pages(Order::ZERO)).sum();
    s.io_pages = h.guests.iter().map(|g| g.io.len() as u64).sum();
    s.host_pages = h.own.len() as u64;
    s.held_pages =
        s.guest_pages_1g + s.guest_pages_2m + s.guest_pages_4k + s.io_pages + s.host_pages;
    Ok(h.summary)
}
