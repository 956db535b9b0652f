//! LLFree's fragmentation recipe: fill all memory with 4 KiB frames, free a random 50%, then
//! rounds that each free a random 10% of the held frames and allocate as many again. After
//! chosen rounds, `HBA_9` and `HBA_18` ([`HeldFrames::hba`]) from the bench's own record of
//! the held frames; after the last round, how many order-9 (2 MiB) allocations succeed
//! against the number of fully free aligned 2 MiB blocks.
//!
//! Every allocator sees the same random choices: the held frames are a list in allocation
//! order, a free takes the entry at a random index (`Rng::below`) of a generator seeded alike
//! for every allocator, and the list's length is the same for all of them at every step.
#![deny(unsafe_code)]

use std::time::{Duration, Instant};

use serde::Serialize;

use super::held::HeldFrames;
use super::{Frames, Rng};

/// The seed every allocator's run starts from.
pub const SEED: u64 = 0x11f4_ee00_c4a7;

/// The rounds after which `HBA_9` and `HBA_18` are reported (0: after the 50% free).
pub const CHECKPOINTS: [u32; 5] = [0, 1, 10, 50, 100];

/// One checkpoint's fragmentation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Checkpoint {
    /// Rounds done.
    pub round: u32,
    /// `HBA_9`; `None` when no frame is free.
    pub hba9: Option<f64>,
    /// `HBA_18`.
    pub hba18: Option<f64>,
}

/// The order-9 probe after the last round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Order9 {
    /// Order-9 allocations that succeeded, one after the other.
    pub found: u64,
    /// Fully free aligned 2 MiB blocks before the first of them.
    pub free_blocks: u64,
}

/// What one allocator's run gave.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The fragmentation at each of [`CHECKPOINTS`].
    pub checkpoints: Vec<Checkpoint>,
    /// The probe; `None` if the allocator was not asked (it cannot allocate aligned 2 MiB).
    pub order9: Option<Order9>,
    /// Allocations and frees made by the fill, the 50% free and the rounds.
    pub ops: u64,
    /// Their time, with the bench's bookkeeping (a random index and a bit per operation).
    pub time: Duration,
}

/// Runs the recipe on `a`, which manages exactly the frames `base..base + frames`.
/// `settle` runs before every measurement (numaframe's per-CPU API drains its caches there, so
/// the allocator's own state matches the bench's record). `probe_order9` asks for the order-9
/// probe.
///
/// # Errors
/// If the allocator hands out a frame outside its range or twice, the fill keeps more than
/// 1/64 of `frames` for itself, or an allocation fails while frames are free.
pub fn run<A: Frames + ?Sized>(
    a: &mut A,
    base: u64,
    frames: u64,
    rounds: u32,
    probe_order9: bool,
    settle: &mut dyn FnMut(&mut A),
) -> Result<Outcome, String> {
    let mut held = HeldFrames::new(frames);
    let mut list: Vec<u64> = Vec::with_capacity(frames as usize);
    let mut rng = Rng::new(SEED);
    let mut ops = 0u64;
    let mut time = Duration::ZERO;
    let take = |a: &mut A, held: &mut HeldFrames, list: &mut Vec<u64>| -> Result<bool, String> {
        let Some(f) = a.alloc(0) else {
            return Ok(false);
        };
        let rel = f.wrapping_sub(base);
        if !held.hold(rel, 0) {
            return Err(format!("frame {f} handed out twice or outside the range"));
        }
        list.push(rel);
        Ok(true)
    };
    let give = |a: &mut A, held: &mut HeldFrames, list: &mut Vec<u64>, rng: &mut Rng| {
        let rel = list.swap_remove(rng.below(list.len() as u64) as usize);
        held.release(rel, 0);
        a.free(base + rel, 0);
    };

    let start = Instant::now();
    while take(a, &mut held, &mut list)? {}
    let filled = list.len() as u64;
    // An allocator that keeps its metadata in the memory it manages (numaframe's pageblock
    // bitmaps) hands out a few frames less: those stay its own, so they count as held, never
    // as free.
    let kept = frames - held.held();
    if kept > frames / 64 {
        return Err(format!("the fill took {} frames of {frames}", held.held()));
    }
    for f in 0..frames {
        if !held.is_held(f) {
            held.hold(f, 0);
        }
    }
    for _ in 0..frames / 2 {
        give(a, &mut held, &mut list, &mut rng);
    }
    time += start.elapsed();
    ops += filled + frames / 2;

    let mut checkpoints = Vec::new();
    let mut check = |a: &mut A, held: &HeldFrames, round: u32| {
        if CHECKPOINTS.contains(&round) {
            settle(a);
            checkpoints.push(Checkpoint {
                round,
                hba9: held.hba(9),
                hba18: held.hba(18),
            });
        }
    };
    check(a, &held, 0);
    for round in 1..=rounds {
        let k = list.len() / 10;
        let start = Instant::now();
        for _ in 0..k {
            give(a, &mut held, &mut list, &mut rng);
        }
        for _ in 0..k {
            if !take(a, &mut held, &mut list)? {
                return Err(format!(
                    "round {round}: an allocation failed with {} frames free",
                    held.free()
                ));
            }
        }
        time += start.elapsed();
        ops += 2 * k as u64;
        check(a, &held, round);
    }

    let order9 = if probe_order9 {
        settle(a);
        let free_blocks = held.free_blocks(9);
        let mut got = Vec::new();
        while let Some(f) = a.alloc(9) {
            let rel = f.wrapping_sub(base);
            if !held.hold(rel, 9) {
                return Err(format!(
                    "order-9 block at {f} misaligned, outside the range or overlapping"
                ));
            }
            got.push(rel);
        }
        for rel in &got {
            held.release(*rel, 9);
            a.free(base + rel, 9);
        }
        Some(Order9 {
            found: got.len() as u64,
            free_blocks,
        })
    } else {
        None
    };
    Ok(Outcome {
        checkpoints,
        order9,
        ops,
        time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::oracle::Oracle;
    use crate::bench::{Buddy, Floor};

    #[test]
    fn every_allocator_sees_the_same_choices() {
        let frames = 4 * 512;
        let mut floor = Floor::new(frames);
        let a = run(&mut floor, 0, frames, 10, false, &mut |_| {}).unwrap();
        assert_eq!(a.ops, frames + frames / 2 + 2 * 10 * (frames / 2 / 10));
        assert_eq!(a.checkpoints.len(), 3, "rounds 0, 1 and 10");
        let mut oracle = Oracle::blocks(frames);
        let o = run(&mut oracle, 0, frames, 10, true, &mut |_| {}).unwrap();
        assert_eq!(o.ops, a.ops);
        let probe = o.order9.unwrap();
        assert_eq!(probe.found, probe.free_blocks);
        let mut buddy = Buddy::new(frames);
        let b = run(&mut buddy, 0, frames, 10, true, &mut |_| {}).unwrap();
        assert!(b.order9.unwrap().found <= b.order9.unwrap().free_blocks);
    }

    #[test]
    fn a_short_fill_is_an_error() {
        let mut floor = Floor::new(100);
        assert!(run(&mut floor, 0, 200, 1, false, &mut |_| {}).is_err());
    }
}

#[cfg(test)]
mod divisor_tests {
    use super::*;
    use crate::bench::{NODE_BASE, NumaNode, OneNode};
    use numaframe::{AllocFlags, NodeId, PAGE_SIZE};

    /// Counts every call the recipe makes.
    struct Counting<'x, A: ?Sized>(&'x mut A, u64, u64);
    impl<A: Frames + ?Sized> Frames for Counting<'_, A> {
        fn alloc(&mut self, order: u8) -> Option<u64> {
            let r = self.0.alloc(order);
            if order == 0 && r.is_some() {
                self.1 += 1;
            }
            r
        }
        fn free(&mut self, frame: u64, order: u8) {
            if order == 0 {
                self.2 += 1;
            }
            self.0.free(frame, order)
        }
    }

    /// `Outcome::ops` is the divisor of the churn row's ns/op ("ns per alloc or free"): it
    /// must be the allocations and frees the timed part made.
    #[test]
    fn churn_ops_count_the_operations_made() {
        let frames = 1 << 18;
        let node = OneNode::exact(frames).unwrap();
        let m = node.boot().unwrap();
        let mut nf = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        let mut c = Counting(&mut nf, 0, 0);
        // 10 rounds, no order-9 probe (the probe is outside `ops` and the timed part).
        let o = run(
            &mut c,
            NODE_BASE / PAGE_SIZE,
            frames,
            10,
            false,
            &mut |_| {},
        )
        .unwrap();
        // Successful order-0 allocations and frees (the one failed allocation that ends the
        // fill is left out: counting it too does not close the gap).
        assert_eq!(o.ops, c.1 + c.2, "the row's divisor vs the operations made");
    }
}
