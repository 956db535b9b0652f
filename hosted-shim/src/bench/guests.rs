//! Host and guests: can a hypervisor still back new guests with 1 GiB frames after days of
//! churn, while its own long-lived 4 KiB allocations are interleaved with the guests'?
//!
//! The recipe, over one node of `frames` frames (16 GiB; 8 GiB with `--quick`):
//! - A guest asks for a random size of 256..=1536 2 MiB blocks (512 MiB to 3 GiB) plus a tail of
//!   0..512 4 KiB frames (firmware and ROM regions). It is backed with a 1 GiB frame for every
//!   whole GiB where one can be had, 2 MiB frames for the rest (and for a GiB whose 1 GiB frame
//!   failed), 4 KiB frames last (the tail, and any 2 MiB block that failed). It also keeps a
//!   pool of 4 KiB frames, 1/256 of its size (I/O buffers, short-lived where the allocator has
//!   lifetime classes), of which it frees a random half
//!   and allocates as many again every day.
//! - Guests are created while their memory and pools stay within 85% of the node, and each
//!   day one random guest is torn down (all its frames freed).
//! - The host allocates 0.2% of the node in 4 KiB frames a day (its page tables and
//!   structures), half before the day's teardown and half after the guests' churn, plus 1 MiB
//!   of per-VM structures after each GiB a guest's creation backs (so they are interleaved
//!   with the guest's own blocks), and frees its oldest frames once it holds more than 3%: a host frame lives about 15 days, a guest
//!   about as many days as there are guests (7 on average at 16 GiB), so host frames outlive
//!   the guests they were allocated next to.
//! - A day: host allocations, one teardown, the guests' churn, host allocations, new guests
//!   until the budget is reached, the host's oldest frames freed. Day 0 only creates guests
//!   (and the host's first allocations).
//!
//! Reported: `HBA_18` (and `HBA_9`) of the bench's own record of held frames at days 0,
//! `days / 10`, `days / 2` and `days`, and the share of the memory of the guests created on
//! days 1.. that got 1 GiB frames, next to the share that could have (their whole GiBs).
//! Every allocator sees the same random choices (one generator, seeded alike), as long as no
//! guest creation fails (a failure is counted and reported).
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::held::HeldFrames;
use super::{Frames, Rng};

/// The seed every allocator's run starts from.
pub const SEED: u64 = 0x6e57_5a11_da75;

const BLOCK: u64 = 512;
const GIB: u64 = 1 << 18;
/// Host frames (per-VM structures, page tables) allocated after each GiB a guest backs.
const PER_VM_PER_GIB: u64 = 256;

/// One checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Checkpoint {
    /// Days done.
    pub day: u32,
    /// `HBA_18`; `None` when no frame is free.
    pub hba18: Option<f64>,
    /// `HBA_9`.
    pub hba9: Option<f64>,
    /// Free frames.
    pub free: u64,
}

/// What one allocator's run gave.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Days 0, `days / 10`, `days / 2`, `days`.
    pub checkpoints: Vec<Checkpoint>,
    /// Of the frames of guests created on days 1.., the share backed by 1 GiB frames.
    pub share_1g: f64,
    /// The share backed by 2 MiB frames.
    pub share_2m: f64,
    /// The share that lies in the guests' whole GiBs: what 1 GiB frames could have backed.
    pub share_1g_possible: f64,
    /// Guests created on days 1...
    pub guests: u64,
    /// Guest creations that failed for lack of memory (the allocator could not place them).
    pub failed: u64,
    /// Allocations and frees made.
    pub ops: u64,
    /// Their time, with the bench's bookkeeping.
    pub time: Duration,
}

/// A live guest's frames, by order.
#[derive(Debug, Default)]
struct Guest {
    blocks: [Vec<u64>; 3],
    pool: Vec<u64>,
    /// Frames asked for (backing, without the pool).
    frames: u64,
}

/// The run's state: the allocator, the bench's record and the counters.
struct World<'a, A: ?Sized> {
    a: &'a mut A,
    base: u64,
    held: HeldFrames,
    ops: u64,
    /// The host's frames, oldest first.
    host: VecDeque<u64>,
}

const ORDERS: [u8; 3] = [0, 9, 18];

impl<A: Frames + ?Sized> World<'_, A> {
    fn alloc(&mut self, order: u8) -> Result<Option<u64>, String> {
        self.take(order, false)
    }

    /// A frame of a guest's I/O-buffer pool, allocated as short-lived.
    fn alloc_buffer(&mut self) -> Result<Option<u64>, String> {
        self.take(0, true)
    }

    fn take(&mut self, order: u8, short_lived: bool) -> Result<Option<u64>, String> {
        self.ops += 1;
        let got = if short_lived {
            self.a.alloc_short_lived()
        } else {
            self.a.alloc(order)
        };
        let Some(f) = got else {
            return Ok(None);
        };
        let rel = f.wrapping_sub(self.base);
        if !self.held.hold(rel, order) {
            return Err(format!(
                "order-{order} block at {f} misaligned, outside the range or handed out twice"
            ));
        }
        Ok(Some(rel))
    }

    fn free(&mut self, rel: u64, order: u8) {
        self.ops += 1;
        self.held.release(rel, order);
        self.a.free(self.base + rel, order);
    }

    /// A 2 MiB block, or 512 frames when none can be had; false if even those fail.
    fn alloc_2m(&mut self, g: &mut Guest) -> Result<bool, String> {
        if let Some(b) = self.alloc(9)? {
            g.blocks[1].push(b);
            return Ok(true);
        }
        for _ in 0..BLOCK {
            match self.alloc(0)? {
                Some(f) => g.blocks[0].push(f),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Backs a guest of `blocks` 2 MiB blocks and `tail` frames; `None` if memory ran out
    /// (everything it got is freed again).
    fn create(&mut self, blocks: u64, tail: u64) -> Result<Option<Guest>, String> {
        let mut g = Guest {
            frames: blocks * BLOCK + tail,
            ..Guest::default()
        };
        let mut ok = true;
        for _ in 0..blocks / BLOCK {
            if let Some(b) = self.alloc(18)? {
                g.blocks[2].push(b);
            } else {
                for _ in 0..BLOCK {
                    ok = ok && self.alloc_2m(&mut g)?;
                }
            }
            self.host_alloc(PER_VM_PER_GIB)?;
        }
        for _ in 0..blocks % BLOCK {
            ok = ok && self.alloc_2m(&mut g)?;
        }
        self.host_alloc(blocks % BLOCK * PER_VM_PER_GIB / BLOCK)?;
        for i in 0..tail + g.frames / 256 {
            if !ok {
                break;
            }
            let got = if i < tail {
                self.alloc(0)?
            } else {
                self.alloc_buffer()?
            };
            match got {
                Some(f) if i < tail => g.blocks[0].push(f),
                Some(f) => g.pool.push(f),
                None => ok = false,
            }
        }
        if !ok {
            self.destroy(g);
            return Ok(None);
        }
        Ok(Some(g))
    }

    /// `n` host frames (as many as can be had).
    fn host_alloc(&mut self, n: u64) -> Result<(), String> {
        for _ in 0..n {
            match self.alloc(0)? {
                Some(f) => self.host.push_back(f),
                None => break,
            }
        }
        Ok(())
    }

    fn destroy(&mut self, g: Guest) {
        for (order, blocks) in ORDERS.iter().zip(&g.blocks) {
            for &b in blocks {
                self.free(b, *order);
            }
        }
        for &f in &g.pool {
            self.free(f, 0);
        }
    }
}

/// Runs the recipe for `days` days on `a`, which manages exactly the frames
/// `base..base + frames` (a whole number of GiB).
///
/// # Errors
/// If the allocator hands out a block outside its range, misaligned or twice.
pub fn run<A: Frames + ?Sized>(
    a: &mut A,
    base: u64,
    frames: u64,
    days: u32,
) -> Result<Outcome, String> {
    let mut w = World {
        a,
        base,
        held: HeldFrames::new(frames),
        ops: 0,
        host: VecDeque::new(),
    };
    let mut rng = Rng::new(SEED);
    let budget = frames / 100 * 85;
    let host_cap = frames / 100 * 3;
    let host_per_day = frames / 1000 * 2;
    let mut guests: Vec<Guest> = Vec::new();
    let mut committed = 0u64;
    let (mut asked, mut backed_1g, mut backed_2m, mut possible) = (0u64, 0u64, 0u64, 0u64);
    let (mut created, mut failed) = (0u64, 0u64);
    // The next guest's size, drawn once so that a guest that does not fit today is the one
    // created on a later day.
    let draw = |rng: &mut Rng| (256 + rng.below(1281), rng.below(512));
    let mut next = draw(&mut rng);
    let mut checkpoints = Vec::new();
    let marks = [0, days / 10, days / 2, days];
    let mut time = Duration::ZERO;

    for day in 0..=days {
        let start = Instant::now();
        w.host_alloc(host_per_day / 2)?;
        if day > 0 && !guests.is_empty() {
            let g = guests.swap_remove(rng.below(guests.len() as u64) as usize);
            committed -= g.frames + g.frames / 256;
            w.destroy(g);
        }
        if day > 0 {
            for g in &mut guests {
                for _ in 0..g.pool.len() / 2 {
                    let f = g.pool.swap_remove(rng.below(g.pool.len() as u64) as usize);
                    w.free(f, 0);
                }
                while (g.pool.len() as u64) < g.frames / 256 {
                    match w.alloc_buffer()? {
                        Some(f) => g.pool.push(f),
                        None => break,
                    }
                }
            }
        }
        w.host_alloc(host_per_day - host_per_day / 2)?;
        loop {
            let (blocks, tail) = next;
            let need = blocks * BLOCK + tail + (blocks * BLOCK + tail) / 256;
            if committed + need > budget {
                break;
            }
            next = draw(&mut rng);
            match w.create(blocks, tail)? {
                Some(g) => {
                    committed += need;
                    if day > 0 {
                        created += 1;
                        asked += g.frames;
                        backed_1g += g.blocks[2].len() as u64 * GIB;
                        backed_2m += g.blocks[1].len() as u64 * BLOCK;
                        possible += blocks / BLOCK * GIB;
                    }
                    guests.push(g);
                }
                None => failed += 1,
            }
        }
        while w.host.len() as u64 > host_cap {
            if let Some(f) = w.host.pop_front() {
                w.free(f, 0);
            }
        }
        time += start.elapsed();
        if marks.contains(&day) && checkpoints.iter().all(|c: &Checkpoint| c.day != day) {
            // Frames the allocator keeps for itself (its metadata pool) are not free: in a
            // pageblock with fewer free frames than the record says, count the difference
            // as held.
            let mut held = w.held.clone();
            w.a.pageblock_free(&mut |first, free| {
                let rel = first.wrapping_sub(w.base);
                if rel >= frames || rel + BLOCK > frames {
                    return;
                }
                let record: Vec<u64> = (rel..rel + BLOCK).filter(|&f| !held.is_held(f)).collect();
                for &f in record.iter().skip(usize::from(free)) {
                    held.hold(f, 0);
                }
            });
            checkpoints.push(Checkpoint {
                day,
                hba18: held.hba(18),
                hba9: held.hba(9),
                free: held.free(),
            });
        }
    }
    let share = |x: u64| {
        if asked == 0 {
            0.0
        } else {
            x as f64 / asked as f64
        }
    };
    Ok(Outcome {
        checkpoints,
        share_1g: share(backed_1g),
        share_2m: share(backed_2m),
        share_1g_possible: share(possible),
        guests: created,
        failed,
        ops: w.ops,
        time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Buddy;
    use crate::bench::oracle::Oracle;

    #[test]
    fn the_oracle_keeps_whole_sections_for_guests() {
        let frames = 4 * GIB;
        let o = run(&mut Oracle::sections(frames), 0, frames, 12).unwrap();
        assert_eq!(o.failed, 0);
        assert!(o.guests > 0);
        assert_eq!(
            o.checkpoints.iter().map(|c| c.day).collect::<Vec<_>>(),
            [0, 1, 6, 12]
        );
        assert!(o.share_1g <= o.share_1g_possible + 1e-12);
        assert!(o.share_1g + o.share_2m <= 1.0 + 1e-12);
        // The same choices on another allocator: the same guests.
        let b = run(&mut Buddy::new(frames), 0, frames, 12).unwrap();
        assert_eq!((b.guests, b.failed), (o.guests, 0));
        assert!((b.share_1g_possible - o.share_1g_possible).abs() < 1e-12);
    }
}

#[cfg(test)]
mod honesty {
    use super::*;
    use crate::bench::{NODE_BASE, NumaNode, OneNode};
    use numaframe::{AllocFlags, NodeId, Order, PAGE_SIZE};

    /// The full run's numaframe row (16 GiB, 200 days, `Sizes::FULL`): the last checkpoint's
    /// HBA_18 must be the share of the allocator's free frames that lie in 1 GiB blocks it can
    /// hand out. Independent count: allocate order-18 blocks until none is left.
    #[test]
    fn hba18_counts_only_1gib_blocks_the_allocator_can_hand_out() {
        let (frames, days) = (1 << 22, 200);
        let node = OneNode::exact(frames).unwrap();
        let m = node.boot().unwrap();
        let mut a = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        let o = run(&mut a, NODE_BASE / PAGE_SIZE, frames, days).unwrap();
        let last = *o.checkpoints.last().unwrap();
        let free = m.nodes().get(0).unwrap().free_pages();
        let mut got = Vec::new();
        while let Some(p) = m.alloc(NodeId::new(0), Order::new(18), AllocFlags::empty()) {
            got.push(p);
        }
        let hba18 = (got.len() as u64 * GIB) as f64 / free as f64;
        assert_eq!(
            (last.free, format!("{:.4}", last.hba18.unwrap())),
            (free, format!("{hba18:.4}")),
            "day {days}: the bench's (free, HBA_18) vs the allocator's ({} whole 1 GiB blocks)",
            got.len()
        );
    }
}
